"""The fast path's padded steps near the end of the static cache: pad queries write slots after the real ones,
so the cache must grow for them too (else they index past the cache), and the real logits stay exact."""
import torch

from specdecode.config import FastPathConfig
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from tests.tiny import tiny_llama


def test_padded_step_at_the_end_of_the_static_cache_grows_it():
    model = tiny_llama(layers=2)
    fast = Target(model, fast=FastPathConfig(enabled=True, compile=False, capacity=8))
    eager = Target(model)
    fast_cache, eager_cache = fast.new_cache(rows=1, capacity=8), eager.new_cache(rows=1, capacity=16)
    assert fast_cache.capacity == 8
    prompt, step = [5, 6, 7, 8, 9], [10, 11, 12]  # 5 + 3 = 8 real slots; the step pads 3 -> 4 queries (slot 8)
    for target, cache in ((fast, fast_cache), (eager, eager_cache)):
        target.forward(cache, [0], build_block([0], [prompt], [[-1, 0, 1, 2, 3]], 0, target.block_device))
    outs = [target.forward(cache, [0], build_block([5], [step], [[-1, 0, 1]], 0, target.block_device)).logits
            for target, cache in ((fast, fast_cache), (eager, eager_cache))]
    assert fast_cache.capacity >= 9
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
