"""Cross-tokenizer drafting keeps the target distribution exact when sampling: the joint law of the first two
emitted tokens equals the target's own (computed exactly from the tiny target), and the same test rejects a
broken verifier (residual := p, i.e. a rejected draft token is not removed before resampling)."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import SequenceContext
from specdecode.core.engine import Engine
from specdecode.core.sampling import probabilities
from specdecode.core.verify import tree as tree_module
from specdecode.drafters.cross_tokenizer import CrossTokenizerDrafter
from tests.stats.chi2 import chi2_pvalue
from tests.tiny_pair import tiny_pair

SAMPLES = 600
SAMPLING = SamplingConfig(temperature=3.0)  # flattens the trained target so draft tokens have p ~ 0.5-0.8
PROMPTS = ["the cat sat", "the moon"]


def exact_pairs(target, prompt: list[int]) -> dict:
    """P(t1, t2 | prompt) under the target with SAMPLING's transform."""
    vocab = target.vocab_size
    with torch.inference_mode():
        first = probabilities(target.model(torch.tensor([prompt])).logits[0, -1], SAMPLING)  # [V]
        batch = torch.tensor([prompt + [t] for t in range(vocab)])
        second = probabilities(target.model(batch).logits[:, -1], SAMPLING)  # [V, V]
    joint = first[:, None] * second  # [V, V]
    return {(a, b): float(joint[a, b]) for a in range(vocab) for b in range(vocab) if joint[a, b] > 0}


def sampled_pairs(engine: Engine, prompt: list[int]) -> list[tuple[int, int]]:
    pairs = []
    for seed in range(SAMPLES):
        sampling = SamplingConfig(temperature=SAMPLING.temperature, seed=seed)
        out = engine.generate(prompt, sampling, GenerationConfig(max_new_tokens=2, stop_on_eos=False)).token_ids
        pairs.append((out[0], out[1]))
    return pairs


def first_draft_probability(target, draft, prompt: list[int]) -> float:
    """The target's probability of the first drafted token (the test is sensitive only if it is not ~0 or ~1)."""
    drafter = CrossTokenizerDrafter(draft, target)
    ctx = SequenceContext(0, list(prompt), 0, 3, SAMPLING, torch.Generator())
    drafter.start(ctx)
    (proposal,) = drafter.propose([ctx])
    assert len(proposal) > 0
    with torch.inference_mode():
        p = probabilities(target.model(torch.tensor([prompt])).logits[0, -1], SAMPLING)
    return float(p[proposal.tokens[0]])


@pytest.fixture(scope="module")
def setup():
    target, draft = tiny_pair()
    prompts = [[1] + target.tokenizer(p)["input_ids"] for p in PROMPTS]
    return target, draft, prompts


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_first_two_tokens_follow_target(setup, index):
    target, draft, prompts = setup
    assert 0.2 < first_draft_probability(target, draft, prompts[index]) < 0.9
    engine = Engine(target, CrossTokenizerDrafter(draft, target), SpecConfig(k=3, first_step_drafts=True))
    pairs = sampled_pairs(engine, prompts[index])
    assert chi2_pvalue(pairs, exact_pairs(target, prompts[index])) > 1e-3


def test_detects_broken_residual(setup, monkeypatch):
    target, draft, prompts = setup
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(target, CrossTokenizerDrafter(draft, target), SpecConfig(k=3, first_step_drafts=True))
    pairs = sampled_pairs(engine, prompts[0])
    assert chi2_pvalue(pairs, exact_pairs(target, prompts[0])) < 1e-3
