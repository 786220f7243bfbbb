"""After rejections (and tree compaction) the cache holds exactly what plain decoding would have cached."""
import torch

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.drafters import DrafterConfig, build_drafter
from specdecode.drafters.base import BaseDrafter, Draft
from specdecode.engine import Engine

PROMPT = "abcabcabd abcabc"
N = 30


class WrongThenRightTree(BaseDrafter):
    """Proposes a tree whose FIRST branch is wrong and whose second branch is the true continuation, so the
    accepted path lies off the first-child slots and must be compacted."""

    name = "oracle-tree"

    def __init__(self, truth: list[int], prompt_len: int):
        self.truth, self.prompt_len = truth, prompt_len

    def propose(self, seqs):
        drafts = []
        for seq in seqs:
            done = len(seq.tokens) - self.prompt_len
            right = self.truth[done : done + 2]
            if len(right) < 2:
                drafts.append(Draft())
                continue
            wrong = (right[0] + 1) % 250 + 3
            # root -> wrong(0) -> wrong(1); root -> right0(2) -> right1(3)
            drafts.append(Draft((wrong, wrong, right[0], right[1]), (-1, 0, -1, 2)))
        return drafts


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
                    build_drafter(tiny_target, DrafterConfig("prompt-lookup"), SpecConfig(k=4)),
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


def test_compaction_moves_the_accepted_path(tiny_target):
    cache = tiny_target.new_cache(rows=1, capacity=16)
    layer = cache.layers[0]
    layer.lazy_initialization(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    layer.keys[0, :, :, 0] = torch.arange(16, dtype=torch.float32)
    cache.compact(0, [7, 9], 5)
    assert layer.keys[0, 0, :, 0].tolist()[4:8] == [4.0, 7.0, 9.0, 7.0]


def test_growing_keeps_every_slot_of_every_row(tiny_target):
    """ensure() doubles capacity (and adds rows) mid-generation: all cached slots, the last included, survive."""
    cache = tiny_target.new_cache(rows=2, capacity=8)
    for layer in cache.layers:
        layer.lazy_initialization(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
        layer.keys[:, :, :, 0] = torch.arange(16, dtype=torch.float32).reshape(2, 1, 8)
        layer.values[:, :, :, 1] = -torch.arange(16, dtype=torch.float32).reshape(2, 1, 8)
    cache.ensure(3, 9)
    assert (cache.num_rows, cache.capacity) == (3, 16)
    for layer in cache.layers:
        assert layer.keys.shape[0] == 3 and layer.keys.shape[2] == 16
        assert layer.keys[:2, 0, :8, 0].flatten().tolist() == list(range(16))
        assert layer.values[:2, 1, :8, 1].flatten().tolist() == [-float(i) for i in range(16)]
        assert not layer.keys[2].any() and not layer.keys[:, :, 8:].any()
