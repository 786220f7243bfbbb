"""Gemma 3 270M (the packaged `gemma-3-270m`, Q4_K_M) decodes natively in its default CPU format (int8): the
native decoder is the model's own forward over the same packed modules up to rounding, past the sliding window
too, and the table drafters are lossless on it. Skipped, with the reason, when its packages are not installed."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.drafters import build_drafter
from tests.fakes import packaged_marks

GEMMA = "gemma-3-270m"
PROMPTS = [  # completion prompts: the GGUF is the base model and has no chat template
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The history of the printing press begins",
]
NEW_TOKENS = 48

pytestmark = packaged_marks(GEMMA, "Gemma 3 270M")


@pytest.fixture(scope="module")
def gemma() -> Target:
    from specdecode.loading.load import load_model

    loaded = load_model(ModelConfig(GEMMA))  # first time ~2 min (dequantise, pack, cache), then seconds
    return Target(loaded.model, loaded.tokenizer)


def test_it_decodes_natively_as_its_own_forward_does(gemma):
    """Past the 512-token window: a 700-token prompt's next-token choices, native against the model's forward
    over the same int8 modules (rounding apart: int8 activation codes can flip, so most, not all, agree)."""
    assert gemma.packed_decoder
    own = Target(gemma.model, gemma.tokenizer, packed_decoder=False)
    text = " ".join(f"Item {i} is {'red' if i % 3 else 'blue'}." for i in range(120))
    ids = gemma.tokenizer(text)["input_ids"][:700]
    assert len(ids) > gemma.config.sliding_window
    block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], gemma.pad_id, "cpu")
    ours, theirs = (t.forward(t.new_cache(), [0], block).logits[0] for t in (gemma, own))  # [n, vocab]
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95
    assert (ours - theirs).abs().median() <= 0.05 * theirs.abs().max()


@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_table_drafters_are_lossless_on_it(gemma, name):
    plain = Engine(gemma, build_drafter(gemma, DrafterConfig("none"), SpecConfig()), SpecConfig())
    spec = SpecConfig(k=5, pause_on_time=False)
    engine = Engine(gemma, build_drafter(gemma, DrafterConfig(name, row_cost=0.0), spec), spec)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)
    for text in PROMPTS:
        ids = gemma.tokenizer(text)["input_ids"]
        want = plain.generate(ids, SamplingConfig(), config).token_ids
        assert engine.generate(ids, SamplingConfig(), config).token_ids == want, text
