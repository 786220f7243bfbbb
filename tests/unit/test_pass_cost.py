"""One module times target passes for the row cost, the server's cost table and the benchmark's curve."""
import torch

from specdecode.bench.passcost import pass_costs
from specdecode.core.pass_costs import time_passes
from specdecode.server.scheduling.policy import calibrate


def test_every_user_times_passes_the_same_way(tiny_target):
    seconds = time_passes(tiny_target, [(1, 1), (2, 3)], context=16, rounds=2)
    assert set(seconds) == {(1, 1), (2, 3)} and all(s > 0 for s in seconds.values())
    table = calibrate(tiny_target, batches=(1, 2), qs=(1, 2), context=16, repeats=1)
    assert (table.batches, table.qs) == ((1, 2), (1, 2)) and all(ms >= 0 for row in table.ms for ms in row)
    curve = pass_costs(tiny_target, qs=(1, 4), context=16, repeats=3)
    assert [c.q for c in curve] == [1, 4] and all(c.ms > 0 for c in curve)


def test_rows_after_the_first_copy_its_cached_keys(tiny_target, monkeypatch):
    """Every row holds the same random context, so it is computed once and copied (a prefill per row was most of
    a server's start-up on the Qwen 1.5B); the other rows then hold exactly row 0's keys and values."""
    caches, prefilled = [], []
    new_cache, forward = tiny_target.new_cache, tiny_target.forward

    def keep_cache(*args, **kwargs):
        caches.append(new_cache(*args, **kwargs))
        return caches[-1]

    def count_prefills(cache, rows, block, **kwargs):
        if kwargs.get("keep") == "last":  # the context's prefill; the timed passes keep every position
            prefilled.append(rows)
        return forward(cache, rows, block, **kwargs)

    monkeypatch.setattr(tiny_target, "new_cache", keep_cache)
    monkeypatch.setattr(tiny_target, "forward", count_prefills)
    time_passes(tiny_target, [(1, 1), (3, 2)], context=16, rounds=1)
    assert prefilled == [[0]]
    (cache,) = caches
    for layer in cache.layers:
        first = [t[:, :16] for t in layer.row(0)]  # keys, values: [kv_heads, 16, head_dim]
        for row in (1, 2):
            assert all(torch.equal(a, b[:, :16]) for a, b in zip(first, layer.row(row)))
