"""Structured outputs, every drafter: speculative constrained greedy output equals plain constrained greedy output
token for token, and the logprobs of every token equal plain decoding's (tiny random Llama, byte tokenizer).

The reference is an independent loop: the model's own full forward at every step, the logits masked by a fresh
llguidance matcher, argmax; so the engine's per-node masks, cuts and forced chains are all checked against it."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.structured import Grammars, allowed_tokens
from specdecode.drafters import registry
from tests.tiny import tiny_drafter

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "kind": {"enum": ["person", "company", "other"]},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                                    "maxItems": 2}},
          "required": ["name", "age", "kind", "tags"], "additionalProperties": False}
STRUCTURES = {
    "schema": Structure.json_schema(SCHEMA),
    "regex": Structure.regex(r"(yes|no), because [a-z ]{3,12}\."),
    "choice": Structure.choice(["positive", "negative", "neutral"]),
}
PROMPTS = ["the cat sat on the mat. the cat sat on the", "Hi"]
NEW_TOKENS = 64
LOGPROB_TOLERANCE = 1e-4  # fp32 passes of different widths sum in different orders: ~2e-5 measured here


def reference(target, grammars: Grammars, ids: list[int], structure: Structure) -> tuple[list[int], list[float]]:
    """Plain constrained greedy decoding, written independently of the engine: tokens and their logprobs."""
    constraint = grammars.constraint(structure, 0)
    tokens, logprobs = list(ids), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = target.model(torch.tensor([tokens])).logits[0, -1].float()
            allowed = allowed_tokens(constraint.mask().unsqueeze(0), logits.shape[-1])[0]
            logits = logits.masked_fill(~allowed, float("-inf"))
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            tokens.append(token)
            constraint.commit([token])
            if token in target.eos_ids or constraint.done:
                break
    return tokens[len(ids):], logprobs


@pytest.fixture(scope="module")
def references(tiny_target, tiny_tokenizer):
    grammars = Grammars(tiny_tokenizer, tiny_target.vocab_size, sorted(tiny_target.eos_ids))
    return {(key, prompt): reference(tiny_target, grammars, tiny_tokenizer(prompt)["input_ids"], structure)
            for key, structure in STRUCTURES.items() for prompt in PROMPTS}


@pytest.mark.parametrize("name", list(registry()))
def test_constrained_greedy_equals_plain(name, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    spec = SpecConfig(k=4)
    engine = Engine(tiny_target, tiny_drafter(tiny_target, name, spec, tiny_draft_dir, row_cost=0.0), spec)
    forced = 0
    for (key, prompt), (tokens, logprobs) in references.items():
        generation = GenerationConfig(max_new_tokens=NEW_TOKENS, structure=STRUCTURES[key], logprobs=3)
        result = engine.generate(tiny_tokenizer(prompt)["input_ids"], SamplingConfig(), generation)
        assert result.token_ids == tokens, f"{name} diverged on {key}, {prompt!r}"
        got = [entry.logprob for entry in result.logprobs]
        assert max(abs(a - b) for a, b in zip(got, logprobs)) <= LOGPROB_TOLERANCE
        assert all(entry.top[0][1] >= entry.logprob for entry in result.logprobs)  # the top-N lead with the best
        forced += result.metrics.forced
    assert forced > 0, "the grammar never drafted: forced chains would go untested"


def test_without_grammar_drafting_the_output_is_the_same(tiny_target, tiny_tokenizer, references):
    spec = SpecConfig(k=4, grammar_draft=0)
    engine = Engine(tiny_target, tiny_drafter(tiny_target, "prompt-lookup", spec, row_cost=0.0), spec)
    for (key, prompt), (tokens, _) in references.items():
        result = engine.generate(tiny_tokenizer(prompt)["input_ids"], SamplingConfig(),
                                 GenerationConfig(max_new_tokens=NEW_TOKENS, structure=STRUCTURES[key]))
        assert result.token_ids == tokens and result.metrics.forced == 0


def test_logprobs_without_a_structure_equal_plain_decoding(tiny_target, tiny_tokenizer):
    """Drafted tokens get the logprobs of the pass that verified them: the same as plain one-token passes."""
    ids = tiny_tokenizer(PROMPTS[0])["input_ids"]
    generation = GenerationConfig(max_new_tokens=32, stop_on_eos=False, logprobs=5)
    runs = {}
    for name in ("none", "prompt-lookup"):
        spec = SpecConfig(k=4, pause_on_time=False)
        engine = Engine(tiny_target, tiny_drafter(tiny_target, name, spec, row_cost=0.0), spec)
        runs[name] = engine.generate(ids, SamplingConfig(), generation)
    plain, drafted = runs["none"], runs["prompt-lookup"]
    assert drafted.metrics.accepted > 0 and drafted.token_ids == plain.token_ids
    for a, b in zip(plain.logprobs, drafted.logprobs):
        assert a.token == b.token and abs(a.logprob - b.logprob) <= LOGPROB_TOLERANCE
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert max(abs(x - y) for (_, x), (_, y) in zip(a.top, b.top)) <= LOGPROB_TOLERANCE
