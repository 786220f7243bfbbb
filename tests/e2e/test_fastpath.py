"""The fast path (static cache read whole, padded fixed-shape steps, torch.compile) keeps outputs identical:
fast-path speculative greedy == fast-path plain greedy == eager plain greedy (fp32, CPU, tiny model; on CUDA
too when a GPU is present). On CPU the test compiles with the `eager` backend, which traces the same graphs
(static shapes, padding, cache writes) without inductor's minutes of C++ compilation."""
import pytest
import torch

from specdecode.backends.cuda.fast_path import bucket_for
from specdecode.config import DrafterConfig, FastPathConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.core.trees import build_block, pad_block
from specdecode.drafters import build_drafter
from tests.tiny import byte_tokenizer, tiny_llama

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


def test_bucket_and_padding():
    assert [bucket_for(q, (1, 2, 4, 8)) for q in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    block = build_block([3], [[7, 8, 9]], [[-1, 0, 0]], pad_id=0, device="cpu")
    padded = pad_block(block, q_to=4, kv_len=10, pad_id=0)
    assert padded.input_ids.tolist() == [[7, 8, 9, 0]]
    assert padded.slots.tolist() == [[3, 4, 5, 6]]
    assert padded.mask.shape == (1, 1, 4, 10)
    assert padded.mask[0, 0, 2].int().tolist() == [1, 1, 1, 1, 0, 1, 0, 0, 0, 0]  # sibling 9 skips 8
    assert padded.mask[0, 0, 3].int().tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]  # the pad sees itself only


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_fast_path_greedy_is_identical(device):
    tokenizer = byte_tokenizer()
    model = tiny_llama().to(device)
    ids = tokenizer(PROMPT)["input_ids"]
    config = GenerationConfig(max_new_tokens=32, stop_on_eos=False)
    eager = Target(model, tokenizer)
    reference = Engine(eager, build_drafter(eager, DrafterConfig("none"))).generate(ids, SamplingConfig(), config)
    backend = "eager" if device == "cpu" else "inductor"
    fast = Target(model, tokenizer, FastPathConfig(enabled=True, backend=backend, capacity=128))
    for name in ("none", "prompt-lookup", "layer-skip"):
        spec = SpecConfig(k=4)
        engine = Engine(fast, build_drafter(fast, DrafterConfig(name, exit_layer=2), spec), spec)
        assert engine.cache.static
        result = engine.generate(ids, SamplingConfig(), config)
        assert result.token_ids == reference.token_ids, name
