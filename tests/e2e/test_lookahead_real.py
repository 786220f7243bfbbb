"""Lookahead decoding on the real default model (SmolLM2-135M-Instruct): greedy output equals plain decoding."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from tests.fakes import FIXED_ROW_COST

PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of numbers.",
    "Summarise in two sentences: The library opened a new reading room on Monday. The room has forty seats, "
    "large windows and quiet study booths, and it stays open until ten in the evening on weekdays.",
]


@pytest.mark.slow
def test_lookahead_greedy_equals_plain(default_target):
    tokenizer = default_target.tokenizer
    generation = GenerationConfig(max_new_tokens=40)
    plain = Engine(default_target, build_drafter(default_target, DrafterConfig(name="none")))
    spec = SpecConfig(pause_on_time=False)  # acceptance is asserted: K must not depend on the machine's timing
    drafter = build_drafter(default_target, DrafterConfig("lookahead", row_cost=FIXED_ROW_COST))  # not the machine's
    lookahead = Engine(default_target, drafter, spec)
    accepted = 0
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        result = lookahead.generate(ids, generation=generation)
        assert result.token_ids == plain.generate(ids, generation=generation).token_ids
        accepted += result.metrics.accepted
    assert accepted > 0
