"""Structured outputs on the real default model (SmolLM2-135M, its 49k-token vocabulary): shipped bench tasks of
each kind decoded with prompt lookup and grammar drafting equal plain constrained decoding token for token,
validate against their schemas, draft forced tokens, and carry the logprobs of plain decoding."""
from __future__ import annotations

import pytest

from specdecode.bench.structured import load_tasks, satisfies
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from tests.e2e.server_util import chat_ids

pytestmark = pytest.mark.slow
TOLERANCE = 1e-4  # fp32 passes of different widths sum in different orders


def test_grammar_drafting_on_the_default_model(default_target):
    tasks = load_tasks()
    chosen = [next(t for t in tasks if t.category == kind) for kind in ("extraction", "classification",
                                                                          "function_call")]
    plain_spec, spec = SpecConfig(k=5, grammar_draft=0), SpecConfig(k=5)
    plain = Engine(default_target, build_drafter(default_target, DrafterConfig("none"), plain_spec), plain_spec)
    drafted = Engine(default_target, build_drafter(default_target, DrafterConfig("prompt-lookup"), spec), spec)
    forced, passes = 0, [0, 0]  # speculative, plain
    for task in chosen:
        ids = chat_ids(default_target.tokenizer, task.prompt)
        generation = GenerationConfig(max_new_tokens=160, structure=task.structure, logprobs=2)
        expected = plain.generate(ids, SamplingConfig(), generation)
        got = drafted.generate(ids, SamplingConfig(), generation)
        assert got.token_ids == expected.token_ids, task.question_id
        assert satisfies(task, got.text), got.text
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, expected.logprobs)) <= TOLERANCE
        passes[0] += got.metrics.target_passes
        passes[1] += expected.metrics.target_passes
        forced += got.metrics.forced
    assert forced > 0 and passes[0] < passes[1]
