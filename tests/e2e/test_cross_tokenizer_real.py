"""Cross-tokenizer drafting on a real pair: target Gemma 3 270M (base model, 262k-token SentencePiece vocab,
the packaged `gemma-3-270m`) drafted by SmolLM2-135M-Instruct (49k-token byte-level BPE). Greedy output must
equal plain decoding. Skipped, with the reason, when the Gemma packages are not installed."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter, none
from specdecode.drafters.cross_tokenizer import CrossTokenizerDrafter
from tests.fakes import packaged_marks

GEMMA = "gemma-3-270m"
PROMPTS = [  # completion prompts: the GGUF is the base model and has no chat template
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The history of the printing press begins",
]

pytestmark = packaged_marks(GEMMA, "Gemma 3 270M")


@pytest.fixture(scope="module")
def gemma() -> Target:
    from specdecode.loading.load import load_model

    loaded = load_model(ModelConfig(GEMMA, weights="same"))  # first time ~1-2 min (dequantise + cache), then ~15 s
    return Target(loaded.model, loaded.tokenizer)


def test_cross_tokenizer_greedy_equals_plain(gemma):
    drafter = build_drafter(gemma, DrafterConfig(name="draft-model", draft_model="default"), SpecConfig(k=5))
    assert isinstance(drafter, CrossTokenizerDrafter)
    plain = Engine(gemma, none.SPEC.build(gemma, DrafterConfig(), SpecConfig()))
    engine = Engine(gemma, drafter, SpecConfig(k=5, pause_on_time=False))  # acceptance asserted below
    generation = GenerationConfig(max_new_tokens=24)
    accepted = 0
    for text in PROMPTS:
        ids = gemma.tokenizer(text)["input_ids"]
        result = engine.generate(ids, generation=generation)
        assert result.token_ids == plain.generate(ids, generation=generation).token_ids
        accepted += result.metrics.accepted
    assert accepted > 0
