"""After rejections (and tree compaction) the cache holds exactly what plain decoding would have cached."""
import pytest
import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.kv_cache import RollbackCache
from specdecode.drafters import build_drafter
from tests.fakes import WrongThenRightTree

PROMPT = "abcabcabd abcabc"
N = 30


def run(engine, ids):
    seq = engine.start(ids, SamplingConfig(), GenerationConfig(max_new_tokens=N, stop_on_eos=False))
    while not seq.finished:
        engine.step([seq])
    return seq


def test_cache_after_rejections_matches_plain(tiny_target, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none")))
    reference = run(plain, ids)
    truth = reference.output_ids
    for drafter in (build_drafter(tiny_target, DrafterConfig("layer-skip", exit_layer=1), SpecConfig(k=4)),
                    build_drafter(tiny_target, DrafterConfig("prompt-lookup", row_cost=0.0), SpecConfig(k=4)),
                    WrongThenRightTree(truth, len(ids))):
        engine = Engine(tiny_target, drafter, SpecConfig(k=4, pause_on_time=False))  # rejections asserted
        seq = run(engine, ids)
        assert seq.output_ids == truth
        if isinstance(drafter, WrongThenRightTree):  # every step rejects the first branch, keeps the second
            assert seq.metrics.accepted > 0
        else:
            assert seq.metrics.proposed > seq.metrics.accepted  # there were rejections to roll back
        length = seq.ctx.cache_len
        assert length == reference.ctx.cache_len
        for (k1, v1), (k2, v2) in zip(engine.cache.row_view(seq.ctx.row, length),
                                      plain.cache.row_view(reference.ctx.row, length)):
            torch.testing.assert_close(k1, k2, rtol=1e-3, atol=1e-4)
            torch.testing.assert_close(v1, v2, rtol=1e-3, atol=1e-4)


def _fill(cache, rows: list[int], slots: int) -> None:
    """Write slots 0..slots-1 of `rows` in every layer: key channel 0 = the slot's number (row r adds 100 r),
    value channel 1 = its negative."""
    cache.prepare(rows, 0, cache.capacity if cache.static else slots)
    for layer in cache.layers:
        keys = torch.zeros(len(rows), 2, slots, 4)
        keys[:, :, :, 0] = torch.arange(slots, dtype=torch.float32) + 100 * torch.tensor(rows)[:, None, None]
        values = torch.zeros(len(rows), 2, slots, 4)
        values[:, :, :, 1] = -keys[:, :, :, 0]
        layer.update(keys, values)


@pytest.mark.parametrize("static", [False, True])
def test_compaction_moves_the_accepted_path(static):
    cache = RollbackCache(num_layers=1, rows=1, capacity=16, static=static)
    _fill(cache, [0], 16)
    cache.compact(0, [7, 9], 5)
    (keys, _), = cache.row_view(0, 16)
    assert keys[0, :, 0].tolist()[4:8] == [4.0, 7.0, 9.0, 7.0]


def test_growing_keeps_every_slot_of_every_row():
    """ensure() doubles a static cache's capacity (and adds rows) mid-generation: all cached slots, the last
    included, survive."""
    cache = RollbackCache(num_layers=2, rows=2, capacity=8, static=True)
    _fill(cache, [0, 1], 8)
    cache.ensure(3, 9)
    assert (cache.num_rows, cache.capacity) == (3, 16)
    for layer in cache.layers:
        assert layer.keys.shape[0] == 3 and layer.keys.shape[2] == 16
        assert layer.keys[:2, 0, :8, 0].flatten().tolist() == list(range(8)) + list(range(100, 108))
        assert layer.values[:2, 1, :8, 1].flatten().tolist() == [-float(i) for i in [*range(8), *range(100, 108)]]
        assert not layer.keys[2].any() and not layer.keys[:, :, 8:].any()


def test_a_dynamic_row_grows_on_write_and_keeps_its_slots():
    """A dynamic row is allocated at its reservation and grows (by at least a quarter) when a write passes its
    end; other rows keep their own size, and the written slots survive."""
    cache = RollbackCache(num_layers=2, rows=2, capacity=8)
    cache.reserve(0, 64)
    cache.reserve(1, 200)
    _fill(cache, [0, 1], 8)
    assert [tuple(t.shape) for t in cache.row_view(0, 10**6)[0]] == [(2, 64, 4)] * 2
    assert [tuple(t.shape) for t in cache.row_view(1, 10**6)[0]] == [(2, 256, 4)] * 2  # rounded up to 64
    _fill(cache, [0], 70)  # past row 0's end
    for (keys, _), (other, _) in zip(cache.row_view(0, 10**6), cache.row_view(1, 10**6)):
        assert keys.shape[1] == 128 and other.shape[1] == 256
        assert keys[0, :70, 0].tolist() == list(range(70))
        assert other[0, :8, 0].tolist() == list(range(100, 108))


def test_release_frees_a_dynamic_row():
    cache = RollbackCache(num_layers=2, rows=2, capacity=8)
    cache.reserve(0, 64)
    _fill(cache, [0], 8)
    small = cache.nbytes
    cache.reserve(1, 4096)
    _fill(cache, [1], 8)
    assert cache.nbytes == small * (64 + 4096) // 64  # row 1 holds 4096 slots, row 0 64
    cache.release(1)
    assert cache.nbytes == small
    cache.release(0)
    assert cache.nbytes == 0


def test_row_pointers_are_reused_until_a_buffer_is_made_or_freed():
    """The native decoder's address table: the same tensor while the rows and buffers stay, a new one (with the
    new addresses) once a row grows past its room, another row is asked for, or a row is freed."""
    cache = RollbackCache(num_layers=3, rows=2, capacity=8)
    cache.reserve(0, 64)
    cache.reserve(1, 64)
    like = torch.empty(1, 2, 0, 4)

    def table(rows, ends):
        cache.prepare(rows, 0, max(ends))
        return cache.row_pointers(3, ends, like)

    def addresses(rows):
        return [[[layer.row(row)[i].data_ptr() for row in rows] for i in (0, 1)] for layer in cache.layers]

    first = table([0], [10])
    assert first.shape == (3, 3, 1) and first[:, :2].tolist() == addresses([0]) and first[:, 2].tolist() == [[64]] * 3
    assert table([0], [64]) is first  # still room
    grown = table([0], [65])
    assert grown is not first and grown[:, :2].tolist() == addresses([0]) and grown[:, 2].tolist() == [[128]] * 3
    both = table([0, 1], [65, 5])
    assert both.shape == (3, 3, 2) and both[:, :2].tolist() == addresses([0, 1])
    assert table([0, 1], [70, 6]) is both
    cache.release(1)
    cache.reserve(1, 64)
    again = table([0, 1], [70, 6])
    assert again is not both and again[:, :2].tolist() == addresses([0, 1])
