"""End to end on a tiny model: the first generated tokens follow the exact target distribution for every
drafter (temperature/top-p applied identically to p and q). The exact joint of the first two tokens is
computed from the target itself; the test also shows it rejects a broken verifier (residual := p)."""
from __future__ import annotations

import pytest

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.drafters import registry
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.shortlist import ShortlistHead
from specdecode.engine import Engine
from specdecode.int8_draft import quantize_linears
from specdecode.target import Target
from specdecode.verify import tree as tree_module
from tests.stats.chi2 import chi2_pvalue
from tests.tiny import tiny_drafter
from tests.tiny import tiny_llama
from tests.stats.two_tokens import PROMPT, VOCAB, exact_pairs, sample_pairs, tiny_target

SAMPLES = 1000


def build(name: str, target: Target, spec: SpecConfig):
    if name.startswith("draft-model"):  # q drawn from the draft: full precision, int8, or over a shortlist
        model = tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=9, std=0.2, eos_token_id=None)
        if name.endswith("int8"):
            assert quantize_linears(model)
        if name.endswith("shortlist"):  # q is zero beyond the first half of the ids (and the prompt's tokens)
            model.set_output_embeddings(ShortlistHead(model.get_output_embeddings(), VOCAB // 2))
        return DraftModel(Target(model), target)
    # table drafters with free rows: every match drafted in full, so their deterministic drafts are always
    # verified (at a measured CPU row cost they would mostly decline on a random model)
    return tiny_drafter(target, name, spec, exit_layer=1, row_cost=0.0)


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"] + ["draft-model-int8", "draft-model-shortlist"])
def test_first_tokens_follow_target(name, target, exact):
    spec = SpecConfig(k=2)
    engine = Engine(target, build(name, target, spec), spec)
    pairs = sample_pairs(engine, SAMPLES)
    assert chi2_pvalue(pairs, exact) > 1e-3


# far from temperature 1 (and with top-k), where a q or p that missed the transform is far from the right one
COLD = SamplingConfig(temperature=0.4, top_k=6)


@pytest.mark.parametrize("name", ["draft-model", "layer-skip"])  # drawn q
def test_first_tokens_follow_target_when_cold(name, target):
    spec = SpecConfig(k=2)
    engine = Engine(target, build(name, target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES, COLD), exact_pairs(target, COLD)) > 1e-3


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_broken_verifier_is_detected(name, target, exact, monkeypatch):
    spec = SpecConfig(k=2)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(target, build(name, target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact) < 1e-4


def test_seeded_generation_is_reproducible(target):
    spec = SpecConfig(k=2)
    engine = Engine(target, build("prompt-lookup", target, spec), spec)
    config = GenerationConfig(max_new_tokens=20, stop_on_eos=False)
    runs = [engine.generate(PROMPT, SamplingConfig(temperature=1.0, seed=11), config).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("weights", ["torch-int8", "int4"])
@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_first_tokens_follow_a_quantized_target(name, weights):
    """A target with quantized linear weights (torch's int8 kernel; `--weights int4`) is sampled exactly: the
    exact joint is computed from the quantized model itself."""
    from specdecode.quant import native
    from specdecode.models import exact_attention
    from specdecode.quant.weights import apply

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
    spec = SpecConfig(k=2)
    engine = Engine(quantized, build(name, quantized, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(quantized)) > 1e-3


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])  # drawn q, one-hot q
def test_broken_verifier_is_detected_on_an_int4_target(name, monkeypatch):
    """The quantized-target test above can fail: with the residual replaced by p it rejects."""
    from specdecode.models import exact_attention
    from specdecode.quant import native
    from specdecode.quant.weights import apply

    if native.missing():
        pytest.skip(native.missing())
    quantized = tiny_target()
    apply(quantized.model, "int4")
    exact_attention(quantized.model)
    quantized = Target(quantized.model)
    spec = SpecConfig(k=2)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(quantized, build(name, quantized, spec), spec)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact_pairs(quantized)) < 1e-4
