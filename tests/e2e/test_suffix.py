"""The suffix drafter end to end on the tiny model: its store carries drafts across requests (the second of two
requests drafts from the first one's output, at a higher tau), output stays the target's greedy output with a warm
store, in batches and through the server's `speculation` extension, and a seeded sampled request gives the same
text whatever the store holds."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.drafters.suffix import Suffix
from tests.e2e.server_util import SPEC, ask_code_twice, reference, staggered, tiny_service
from tests.e2e.test_greedy_tiny import NEW_TOKENS, PROMPTS, hf_greedy
from tests.fakes import FIXED_ROW_COST
from tests.tiny import tiny_drafter

GREEDY = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)


@pytest.fixture(scope="module")
def references(tiny_model, tiny_tokenizer):
    return {key: hf_greedy(tiny_model, tiny_tokenizer(text)["input_ids"], NEW_TOKENS) for key, text in PROMPTS.items()}


def _engine(target, spec: SpecConfig, row_cost: float | None = None, max_batch: int = 1) -> Engine:
    return Engine(target, tiny_drafter(target, "suffix", spec, row_cost=row_cost), spec, max_batch=max_batch)


def test_second_request_drafts_from_the_first_ones_output(tiny_target, tiny_tokenizer, references):
    spec = SpecConfig(k=4, pause_on_time=False)  # tau is asserted: K must not depend on the machine's timing
    engine = _engine(tiny_target, spec, row_cost=0.0)
    drafter: Suffix = engine.drafter
    ids = tiny_tokenizer(PROMPTS["code"])["input_ids"]
    first = engine.generate(ids, SamplingConfig(), GREEDY)
    stats = drafter.stats()
    assert (stats.sequences, stats.tokens) == (1, len(ids) + NEW_TOKENS)  # prompt + output, stored at finish
    second = engine.generate(ids, SamplingConfig(), GREEDY)
    assert first.token_ids == second.token_ids == references["code"]
    assert drafter.stats().hits > stats.hits  # drafted from the store
    assert second.metrics.accepted > first.metrics.accepted
    assert second.metrics.tau > first.metrics.tau + 1.0, (first.metrics.as_dict(), second.metrics.as_dict())


@pytest.mark.parametrize("spec", [SpecConfig(k=4), SpecConfig(k=1), SpecConfig(k=3, adaptive=True, max_k=8)],
                         ids=["k4", "k1", "adaptive"])
def test_greedy_equals_plain_with_a_warm_store(spec, tiny_target, tiny_tokenizer, references):
    """The registry's suffix drafter at a row cost as measured on the quiet machine (FIXED_ROW_COST: acceptance is
    asserted, and a busy machine's timings can price every draft out): the second round over the prompts drafts
    from the first round's outputs, so verification of accepted (not only rejected) store drafts is exercised."""
    engine = _engine(tiny_target, spec, row_cost=FIXED_ROW_COST)
    for round_ in range(2):
        for key, text in PROMPTS.items():
            result = engine.generate(tiny_tokenizer(text)["input_ids"], SamplingConfig(), GREEDY)
            assert result.token_ids == references[key], f"round {round_} diverged on {key!r}"
            if round_:
                assert result.metrics.accepted > 0, (key, result.metrics.as_dict())


def test_batched_with_a_shared_store(tiny_target, tiny_tokenizer):
    """Sequences join and leave a batch while the store fills with those that left: outputs are still each
    request's own greedy output."""
    spec = SpecConfig(k=4)
    engine = _engine(tiny_target, spec, row_cost=0.0, max_batch=6)
    prompts = [tiny_tokenizer(text)["input_ids"] for text in PROMPTS.values()] * 2
    lengths = [24, 40, 32, 24, 40, 32]
    expected = [reference(tiny_target, ids, n).token_ids for ids, n in zip(prompts, lengths)]
    for _ in range(2):
        assert staggered(engine, prompts, lengths) == expected
    assert engine.drafter.stats().sequences == 12 and engine.drafter.stats().hits > 0


def test_seeded_sampling_does_not_depend_on_the_store(tiny_target, tiny_tokenizer):
    spec = SpecConfig(k=4)
    engine = _engine(tiny_target, spec, row_cost=0.0)
    ids = tiny_tokenizer(PROMPTS["repetitive"])["input_ids"]
    seeded = SamplingConfig(temperature=0.8, seed=3)
    before = engine.generate(ids, seeded, GREEDY).token_ids
    for temperature in (0.0, 1.0, 1.0):  # other requests fill the store
        engine.generate(ids, SamplingConfig(temperature=temperature), GREEDY)
    assert engine.drafter.stats().sequences == 4
    assert engine.generate(ids, seeded, GREEDY).token_ids == before


def test_server_speculation_extension_and_store_metrics(tiny_target):
    suffix = build_drafter(tiny_target, DrafterConfig("suffix", suffix_store=4096, row_cost=0.0), SPEC)  # tau asserted
    drafters = {"prompt-lookup": build_drafter(tiny_target, DrafterConfig("prompt-lookup", row_cost=0.0), SPEC),
                "suffix": suffix}
    service = tiny_service(tiny_target, drafters)
    replies, metrics, expected = ask_code_twice(service, tiny_target, "suffix")
    assert [r.choices[0].text for r in replies] == [expected] * 2
    assert [r.usage.drafter for r in replies] == ["suffix", "suffix"]
    assert replies[1].usage.tau > replies[0].usage.tau
    assert 'specdecode_suffix_store_sequences{drafter="suffix"} 2.0' in metrics
    assert 'specdecode_suffix_store_capacity_tokens{drafter="suffix"} 4096.0' in metrics
    hits = [line for line in metrics.splitlines()
            if line.startswith('specdecode_suffix_store_hits_total{drafter="suffix"} ')]
    assert hits and float(hits[0].split()[1]) > 0
