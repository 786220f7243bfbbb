"""The hybrid drafter end to end on the tiny model: in batches where sequences join and leave (each keeps its own
draft-model row and suffix state), through the server's `speculation` extension beside `suffix` (each store on
/metrics under its drafter's name), and a seeded sampled request gives the same text whatever its store holds.
Greedy equality on every path: tests/e2e/test_greedy_tiny.py; sampling: tests/stats/test_hybrid_sampling.py."""
from __future__ import annotations

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from tests.e2e.server_util import SPEC, ask_code_twice, reference, staggered, tiny_service
from tests.e2e.test_greedy_tiny import PROMPTS
from tests.tiny import tiny_drafter


def test_batched_sequences_each_get_their_own_output(tiny_target, tiny_tokenizer, tiny_draft_dir):
    spec = SpecConfig(k=4)
    hybrid = tiny_drafter(tiny_target, "hybrid", spec, tiny_draft_dir, row_cost=0.0)
    engine = Engine(tiny_target, hybrid, spec, max_batch=6)
    prompts = [tiny_tokenizer(text)["input_ids"] for text in PROMPTS.values()] * 2
    lengths = [24, 40, 32, 24, 40, 32]
    expected = [reference(tiny_target, ids, n).token_ids for ids, n in zip(prompts, lengths)]
    for _ in range(2):
        assert staggered(engine, prompts, lengths) == expected
    assert hybrid.free.stats().sequences == 12 and hybrid.model_drafts > 0


def test_seeded_sampling_does_not_depend_on_the_store(tiny_target, tiny_tokenizer, tiny_draft_dir):
    spec = SpecConfig(k=4)
    engine = Engine(tiny_target, tiny_drafter(tiny_target, "hybrid", spec, tiny_draft_dir, row_cost=0.0), spec)
    ids = tiny_tokenizer(PROMPTS["repetitive"])["input_ids"]
    seeded, config = SamplingConfig(temperature=0.8, seed=3), GenerationConfig(max_new_tokens=32, stop_on_eos=False)
    before = engine.generate(ids, seeded, config).token_ids
    for _ in range(2):
        engine.generate(ids, SamplingConfig(), config)  # the store and the drafter's record learn from these
    assert engine.generate(ids, seeded, config).token_ids == before


def test_a_request_chooses_hybrid_through_the_speculation_extension(tiny_target, tiny_draft_dir):
    hybrid = tiny_drafter(tiny_target, "hybrid", SPEC, tiny_draft_dir, row_cost=0.0)
    suffix = build_drafter(tiny_target, DrafterConfig("suffix", suffix_store=4096, row_cost=0.0), SPEC)
    service = tiny_service(tiny_target, {"suffix": suffix, "hybrid": hybrid}, default="suffix")
    replies, metrics, expected = ask_code_twice(service, tiny_target, "hybrid")
    assert [r.choices[0].text for r in replies] == [expected] * 2
    assert [r.usage.drafter for r in replies] == ["hybrid", "hybrid"]
    assert hybrid.free_drafts + hybrid.model_drafts > 0
    assert 'specdecode_suffix_store_sequences{drafter="hybrid"} 2.0' in metrics
    assert 'specdecode_suffix_store_sequences{drafter="suffix"} 0.0' in metrics


def test_the_first_step_asks_for_free_drafts_alone(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """A sequence's first step lets the hybrid draft only what costs no draft pass: the draft model runs no pass
    in it, a new prompt gets no draft, and a prompt asked again gets its last answer from the suffix store. With
    SpecConfig.first_step_drafts the draft model drafts for the new prompt in the first step."""
    ids = tiny_tokenizer(PROMPTS["short"])["input_ids"]  # nothing in it for suffix to find
    config = GenerationConfig(max_new_tokens=24, stop_on_eos=False)
    expected = reference(tiny_target, ids, 24).token_ids
    firsts = {}
    for first_step_drafts, asked in ((False, "new"), (False, "again"), (True, "new")):
        spec = SpecConfig(k=4, first_step_drafts=first_step_drafts)
        hybrid = tiny_drafter(tiny_target, "hybrid", spec, tiny_draft_dir, row_cost=0.0)
        engine = Engine(tiny_target, hybrid, spec)
        if asked == "again":
            assert engine.generate(ids, SamplingConfig(), config).token_ids == expected  # the store learns it
        passes = _passes(hybrid.model.draft)
        seq = engine.start(ids, SamplingConfig(), config)
        (first,) = engine.step([seq])
        firsts[first_step_drafts, asked] = (bool(passes), first.depth > 0, first.free)
        while not seq.finished:
            engine.step([seq])
        engine.release(seq)
        assert seq.output_ids == expected
    assert firsts == {(False, "new"): (False, False, False), (False, "again"): (False, True, True),
                      (True, "new"): (True, True, False)}


def _passes(draft) -> list[int]:
    """The tokens of each pass `draft` runs from now on (its forward counted)."""
    passes: list[int] = []
    forward = draft.forward

    def counting(cache, rows, block, **kwargs):
        passes.append(block.input_ids.shape[1])
        return forward(cache, rows, block, **kwargs)

    draft.forward = counting
    return passes
