"""End to end on a tiny model: the first generated tokens follow the exact target distribution for every
drafter (temperature/top-p applied identically to p and q). The exact joint of the first two tokens is
computed from the target itself; the test also shows it rejects a broken verifier (residual := p)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specdecode.backends.cpu.int8 import quantize_linears
from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.sampling import probabilities
from specdecode.core.target import Target
from specdecode.core.verify import tree as tree_module
from specdecode.drafters import registry
from specdecode.drafters.common.row_budget import ChainBudget
from specdecode.drafters.common.shortlist import ShortlistHead
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.hybrid import Hybrid
from specdecode.drafters.suffix import Suffix, SuffixConfig
from tests.stats.chi2 import chi2_pvalue
from tests.stats.two_tokens import PROMPT, SAMPLING, VOCAB, exact_pairs, sample_pairs, tiny_target
from tests.tiny import tiny_drafter, tiny_llama

SAMPLES = 1000


def GIVEN_COSTS() -> ChainBudget:
    """Draft passes free, a second verify row at 0.06 of a pass: given, not measured, so seeded draws (the
    samples below) use it too, and a draft's second token is kept or not by the drawn tokens' probabilities."""
    return ChainBudget(lambda: (0.0, [1.0, 1.0, 1.06]), measured=False)


def tiny_draft(target: Target, budget: ChainBudget | None = None) -> DraftModel:
    """The draft model of these tests: a one-layer model over the same vocabulary."""
    model = tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=9, std=0.2, eos_token_id=None)
    return DraftModel(Target(model), target, budget=budget)


def build(name: str, target: Target, spec: SpecConfig):
    if name == "hybrid":  # suffix with free rows, the draft model on given costs (both decide seeded draws)
        return Hybrid(Suffix(SuffixConfig(row_cost=0.0)), tiny_draft(target, GIVEN_COSTS()), depth=spec.k)
    if name.startswith("draft-model"):  # q drawn from the draft: full precision, int8, or over a shortlist
        model = tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=9, std=0.2, eos_token_id=None)
        if name.endswith("int8"):
            assert quantize_linears(model)
        if name.endswith("shortlist"):  # q is zero beyond the first half of the ids (and the prompt's tokens)
            model.set_output_embeddings(ShortlistHead(model.get_output_embeddings(), VOCAB // 2))
        if name.endswith("budget"):  # a draft's length follows its drawn tokens (test_the_budget_ends_seeded_drafts)
            return DraftModel(Target(model), target, budget=GIVEN_COSTS())
        return DraftModel(Target(model), target)
    # table drafters with free rows: every match drafted in full, so their deterministic drafts are always
    # verified (at a measured CPU row cost they would mostly decline on a random model)
    return tiny_drafter(target, name, spec, exit_layer=1, row_cost=0.0)


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"] + ["draft-model-int8", "draft-model-shortlist",
                                                                "draft-model-budget"])
def test_first_tokens_follow_target(name, target, exact):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build(name, target, spec), spec)
    pairs = sample_pairs(engine, SAMPLES)
    assert chi2_pvalue(pairs, exact) > 1e-3


def test_the_budget_ends_seeded_drafts(target):
    """The budget case above is not k-token drafts in disguise: over the seeded draws it samples, the first
    step's draft (k 2, not cut by the length) is 1 or 2 tokens, the second kept or dropped by its drawn
    probability (~30 % dropped)."""
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build("draft-model-budget", target, spec), spec)
    firsts = []
    for seed in range(60):
        steps = engine.stream(PROMPT, dataclasses.replace(SAMPLING, seed=seed), GenerationConfig(max_new_tokens=3,
                                                                                                  stop_on_eos=False))
        firsts.append(next(out.depth for _, out in steps))
    assert set(firsts) == {1, 2}


# far from temperature 1 (and with top-k), where a q or p that missed the transform is far from the right one
COLD = SamplingConfig(temperature=0.4, top_k=6)


@pytest.mark.parametrize("name", ["draft-model", "layer-skip"])  # drawn q
def test_first_tokens_follow_target_when_cold(name, target):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build(name, target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES, COLD), exact_pairs(target, COLD)) > 1e-3


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_broken_verifier_is_detected(name, target, exact, monkeypatch):
    spec = SpecConfig(k=2, first_step_drafts=True)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(target, build(name, target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact) < 1e-4


@pytest.mark.parametrize("broken", [False, True])
def test_the_default_first_token_is_plain_and_the_second_verified(broken, target, exact, monkeypatch):
    """By default a draft model's first step drafts nothing and the second one token (3 asked): the pair still
    follows the target, and a broken verifier still shows in the second token."""
    if broken:
        monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    spec = SpecConfig(k=2)
    engine = Engine(target, build("draft-model", target, spec), spec)
    steps = engine.stream(PROMPT, dataclasses.replace(SAMPLING, seed=0), GenerationConfig(max_new_tokens=3,
                                                                                          stop_on_eos=False))
    assert [out.k for _, out in steps][:2] == [0, 1]
    pvalue = chi2_pvalue(sample_pairs(engine, SAMPLES), exact)
    assert pvalue < 1e-4 if broken else pvalue > 1e-3


def test_seeded_generation_is_reproducible(target):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build("prompt-lookup", target, spec), spec)
    config = GenerationConfig(max_new_tokens=20, stop_on_eos=False)
    runs = [engine.generate(PROMPT, SamplingConfig(temperature=1.0, seed=11), config).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("weights", ["torch-int8", "int4"])
@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_first_tokens_follow_a_quantized_target(name, weights):
    """A target with quantized linear weights (torch's int8 kernel; `--weights int4`) is sampled exactly: the
    exact joint is computed from the quantized model itself."""
    from specdecode.backends.cpu import native
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention

    quantized = tiny_target()
    if weights == "torch-int8":
        assert quantize_linears(quantized.model)
    elif native.missing():
        pytest.skip(native.missing())
    else:
        apply(quantized.model, weights)
        exact_attention(quantized.model)
        assert any(type(m).__name__ == "PackedLinear" for m in quantized.model.modules())
    quantized = Target(quantized.model)
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(quantized, build(name, quantized, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(quantized)) > 1e-3


def _packed_gemma3() -> Target:
    """A tiny Gemma 3 packed in int4 (its decoder native): sliding-window layers of 4 tokens, which PROMPT and
    its two tokens pass."""
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention
    from tests.tiny import tiny_gemma3

    model = tiny_gemma3(vocab_size=VOCAB, layers=3, hidden=32, seed=5, std=0.2, window=4, eos_token_id=None)
    apply(model, "int4")
    exact_attention(model)
    target = Target(model)
    assert target.packed_decoder
    return target


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "suffix"])  # drawn q, one-hot q, a tree
def test_first_tokens_follow_a_packed_gemma3_target(name):
    from specdecode.backends.cpu import native

    if native.missing():
        pytest.skip(native.missing())
    gemma = _packed_gemma3()
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(gemma, build(name, gemma, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(gemma)) > 1e-3


def test_broken_verifier_is_detected_on_a_packed_gemma3_target(monkeypatch):
    """The Gemma 3 test above can fail: with the residual replaced by p it rejects."""
    from specdecode.backends.cpu import native

    if native.missing():
        pytest.skip(native.missing())
    gemma = _packed_gemma3()
    spec = SpecConfig(k=2, first_step_drafts=True)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(gemma, build("draft-model", gemma, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(gemma)) < 1e-4


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_broken_verifier_is_detected_on_an_int4_target(name, monkeypatch):
    """The quantized-target test above can fail: with the residual replaced by p it rejects."""
    from specdecode.backends.cpu import native
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention

    if native.missing():
        pytest.skip(native.missing())
    quantized = tiny_target()
    apply(quantized.model, "int4")
    exact_attention(quantized.model)
    quantized = Target(quantized.model)
    spec = SpecConfig(k=2, first_step_drafts=True)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(quantized, build(name, quantized, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(quantized)) < 1e-4


# penalties, a bias and min-p on top of temperature / top-p (penalties.py): the second token's distribution
# depends on the first (frequency, presence, repetition), the first on the prompt (repetition)
PENALIZED = SamplingConfig(temperature=0.9, top_p=0.95, min_p=0.05, presence_penalty=0.6, frequency_penalty=0.5,
                           repetition_penalty=1.4, logit_bias=((3, 1.5), (7, -2.0)))


def _penalized(row, prompt: list[int], output: list[int]):
    """One context's logits [V] with PENALIZED's bias and penalties, written out token by token (a reference
    independent of penalties.py)."""
    x = [float(v) for v in row]
    for token, bias in PENALIZED.logit_bias:
        x[token] += bias
    r = PENALIZED.repetition_penalty
    for token in set(prompt) | set(output):
        x[token] = x[token] / r if x[token] > 0 else x[token] * r
    for token in set(output):
        x[token] -= PENALIZED.frequency_penalty * output.count(token) + PENALIZED.presence_penalty
    return torch.tensor(x)


def _exact_penalized(target) -> dict[tuple[int, int], float]:
    from tests.stats.two_tokens import last_logits

    with torch.no_grad():
        first = probabilities(_penalized(last_logits(target, [PROMPT])[0], PROMPT, []), PENALIZED)
        rows = last_logits(target, [PROMPT + [t] for t in range(VOCAB)])
        second = torch.stack([probabilities(_penalized(rows[t], PROMPT, [t]), PENALIZED) for t in range(VOCAB)])
    return {(a, b): float(first[a] * second[a, b]) for a in range(VOCAB) for b in range(VOCAB)
            if first[a] * second[a, b] > 0}


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "suffix"])  # drawn q, one-hot q, a tree
def test_first_tokens_follow_the_penalized_target(name, target):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build(name, target, spec), spec)
    exact = _exact_penalized(target)
    assert exact != exact_pairs(target, dataclasses.replace(PENALIZED, presence_penalty=0.0, frequency_penalty=0.0,
                                                             repetition_penalty=1.0, logit_bias=()))
    assert chi2_pvalue(sample_pairs(engine, SAMPLES, PENALIZED), exact) > 1e-3


def test_unpenalized_second_tokens_are_detected(target, monkeypatch):
    """The test above can fail: scoring the draft's positions without their own paths' tokens rejects."""
    from specdecode.core import engine as engine_module

    monkeypatch.setattr(engine_module, "path_tokens", lambda tokens, parents: [[]] * (len(tokens) + 1))
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build("prompt-lookup", target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES, PENALIZED), _exact_penalized(target)) < 1e-4


def _exact_held(target, end: int) -> dict[tuple[int, int], float]:
    """The first two tokens' joint with min_new_tokens 1 and `end` a stop token: the first may not be `end`, the
    second may (a reference written out here, independent of penalties.hold_ends)."""
    from tests.stats.two_tokens import last_logits

    with torch.no_grad():
        first = probabilities(last_logits(target, [PROMPT])[0].index_fill(0, torch.tensor([end]), float("-inf")),
                              SAMPLING)
        second = probabilities(last_logits(target, [PROMPT + [t] for t in range(VOCAB)]), SAMPLING)
    return {(a, b): float(first[a] * second[a, b]) for a in range(VOCAB) for b in range(VOCAB)
            if first[a] * second[a, b] > 0}


def _held(target) -> tuple[GenerationConfig, dict[tuple[int, int], float]]:
    """min_new_tokens 1 with the likeliest second token as a stop token (so holding it at the wrong depth shows)."""
    unheld = exact_pairs(target)
    end = max(range(VOCAB), key=lambda t: sum(p for (_, b), p in unheld.items() if b == t))
    generation = GenerationConfig(max_new_tokens=3, stop_on_eos=False, stop_token_ids=(end,), min_new_tokens=1)
    return generation, _exact_held(target, end)


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "suffix"])  # drawn q, one-hot q, a tree
def test_first_tokens_follow_the_target_held_by_min_tokens(name, target):
    """vLLM's min_tokens masks the ending tokens by each draft position's depth: the first token (the root) may not
    end, the second (a depth-1 node) may."""
    generation, exact = _held(target)
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build(name, target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES, SAMPLING, generation), exact) > 1e-3


def test_min_tokens_held_at_the_wrong_depth_is_detected(target, monkeypatch):
    """The test above can fail: holding the ends at every position of a draft, whatever its depth, rejects."""
    from specdecode.core import engine as engine_module
    from specdecode.core.penalties import hold_ends

    monkeypatch.setattr(engine_module, "hold_ends", lambda logits, ends, produced, depths, least: hold_ends(
        logits, ends, produced, [0] * len(depths), least))
    generation, exact = _held(target)
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build("draft-model", target, spec), spec)  # drafts every step: depth 1 always scored
    pairs = sample_pairs(engine, SAMPLES, SAMPLING, generation)
    assert not set(pairs) <= set(exact) or chi2_pvalue(pairs, exact) < 1e-4  # impossible pairs, or the wrong odds
