"""End to end on a tiny model: the first generated tokens follow the exact target distribution for every
drafter (temperature/top-p applied identically to p and q). The exact joint of the first two tokens is
computed from the target itself; the test also shows it rejects a broken verifier (residual := p)."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.drafters import DrafterConfig, build_drafter, registry
from specdecode.drafters.draft_model import DraftModel
from specdecode.engine import Engine
from specdecode.sampling import probabilities
from specdecode.target import Target
from specdecode.verify import tree as tree_module
from tests.stats.chi2 import chi2_pvalue
from tests.tiny import tiny_drafter
from tests.tiny import tiny_llama

VOCAB = 12
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]  # repetitive: prompt lookup drafts from it
SAMPLES = 1000
SAMPLING = SamplingConfig(temperature=0.9, top_p=0.95)


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, layers=3, hidden=32, seed=5, std=0.2, eos_token_id=None))


@pytest.fixture(scope="module")
def exact(target) -> dict:
    """P(t1, t2 | PROMPT) under the target with SAMPLING's transform."""
    model = target.model
    with torch.no_grad():
        first = probabilities(model(torch.tensor([PROMPT])).logits[0, -1], SAMPLING)  # [V]
        batch = torch.tensor([PROMPT + [t] for t in range(VOCAB)])
        second = probabilities(model(batch).logits[:, -1], SAMPLING)  # [V, V]
    return {(a, b): float(first[a] * second[a, b]) for a in range(VOCAB) for b in range(VOCAB) if first[a] * second[a, b] > 0}


def build(name: str, target: Target, spec: SpecConfig):
    if name == "draft-model":
        draft = Target(tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=9, std=0.2, eos_token_id=None))
        return DraftModel(draft, target)
    return tiny_drafter(target, name, spec, exit_layer=1)


def sample_pairs(engine: Engine) -> list[tuple[int, int]]:
    pairs = []
    for seed in range(SAMPLES):
        sampling = SamplingConfig(temperature=SAMPLING.temperature, top_p=SAMPLING.top_p, seed=seed)
        out = engine.generate(PROMPT, sampling, GenerationConfig(max_new_tokens=3, stop_on_eos=False)).token_ids
        pairs.append((out[0], out[1]))
    return pairs


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"])
def test_first_tokens_follow_target(name, target, exact):
    spec = SpecConfig(k=2)
    engine = Engine(target, build(name, target, spec), spec)
    pairs = sample_pairs(engine)
    assert chi2_pvalue(pairs, exact) > 1e-3


def test_broken_verifier_is_detected(target, exact, monkeypatch):
    spec = SpecConfig(k=2)
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(target, build("draft-model", target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine), exact) < 1e-4


def test_seeded_generation_is_reproducible(target):
    spec = SpecConfig(k=2)
    engine = Engine(target, build("prompt-lookup", target, spec), spec)
    config = GenerationConfig(max_new_tokens=20, stop_on_eos=False)
    runs = [engine.generate(PROMPT, SamplingConfig(temperature=1.0, seed=11), config).token_ids for _ in range(2)]
    assert runs[0] == runs[1]
