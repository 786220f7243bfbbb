"""Sampling under a grammar follows the exact constrained target distribution: at each position the target's
logits masked by the grammar state of the path so far, then the sampling transform. Checked end to end for a
drawn q (draft model, whose q is masked and renormalised), one-hot q (prompt lookup), a tree (EAGLE) and the
grammar drafting alone (none), with a negative control: q left unmasked must be detected."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdecode.config import GenerationConfig, SpecConfig, Structure
from specdecode.core import structured
from specdecode.core.engine import Engine
from specdecode.core.sampling import probabilities
from specdecode.core.target import Target
from specdecode.drafters.draft_model import DraftModel
from tests.stats.chi2 import chi2_pvalue
from tests.stats.two_tokens import PROMPT, SAMPLING, VOCAB
from tests.tiny import tiny_drafter, tiny_llama

SAMPLES = 1000
LETTERS = "abcdefghxyz}"  # one character per token id 0..11; "}" is the EOS
# first token a, b or c; after a: b or c (a choice), after b: d (forced), after c: any of e..h
STRUCTURE = Structure.regex(r"a[bc]|bd|c[efgh]")


def letter_tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(LETTERS)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # printable ASCII is its own byte form
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="}")


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, layers=3, hidden=32, seed=5, std=0.2, eos_token_id=None),
                  letter_tokenizer())


def exact_pairs(target: Target) -> dict[tuple[int, int], float]:
    grammars = structured.Grammars(target.tokenizer, VOCAB, sorted(target.eos_ids))
    constraint = grammars.constraint(STRUCTURE, 0)

    def masked(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = target.model(torch.tensor([PROMPT + tokens])).logits[0, -1].float()
        allowed = structured.allowed_tokens(constraint.mask().unsqueeze(0), VOCAB)[0]
        return probabilities(logits.masked_fill(~allowed, float("-inf")), SAMPLING)

    first = masked([])
    exact = {}
    for a in first.nonzero().flatten().tolist():
        constraint.commit([a])
        second = masked([a])
        constraint.matcher.rollback(1)
        exact.update({(a, b): float(first[a] * second[b]) for b in second.nonzero().flatten().tolist()})
    return exact


def build(name: str, target: Target, spec: SpecConfig):
    if name == "draft-model":
        return DraftModel(Target(tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=9, std=0.2,
                                            eos_token_id=None), target.tokenizer), target)
    return tiny_drafter(target, name, spec, exit_layer=1, row_cost=0.0)


def sample_pairs(engine: Engine) -> list[tuple[int, int]]:
    pairs = []
    for seed in range(SAMPLES):
        generation = GenerationConfig(max_new_tokens=3, stop_on_eos=False, structure=STRUCTURE)
        out = engine.generate(PROMPT, dataclasses.replace(SAMPLING, seed=seed), generation).token_ids
        pairs.append((out[0], out[1]))
    return pairs


@pytest.fixture(scope="module")
def exact(target):
    return exact_pairs(target)


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "eagle", "none"])
def test_constrained_sampling_follows_target(name, target, exact):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build(name, target, spec), spec)
    assert len({a for a, _ in exact}) == 3 and (1, 3) in exact  # a, b, c first; after b, d alone
    assert chi2_pvalue(sample_pairs(engine), exact) > 1e-3


def test_unmasked_q_is_detected(target, exact, monkeypatch):
    """The draft model's q kept as drawn (not masked and renormalised by the grammar) biases acceptance."""
    original = structured.Constraint._q

    def unmasked(self, draft, origin, tokens, parents, masks):
        q = original(self, draft, origin, tokens, parents, masks)
        if q is not None and origin:
            q[: len(origin)] = draft.q[origin].float()
        return q

    monkeypatch.setattr(structured.Constraint, "_q", unmasked)
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, build("draft-model", target, spec), spec)
    assert chi2_pvalue(sample_pairs(engine), exact) < 1e-4
