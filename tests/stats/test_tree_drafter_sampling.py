"""Sampling with tree drafters is exact. (1) verify_sampling on a synthetic EAGLE-shaped tree (deterministic
top-k siblings, three levels, the first level covering every token) emits the first three tokens with the
target's exact joint distribution. (2) End to end on a tiny model, the first two tokens generated with the
eagle and medusa drafters (random heads) follow the target's exact distribution. Both also show that the
same test rejects a broken verifier (residual replaced by p)."""
from __future__ import annotations

import itertools

import pytest
import torch

from specdecode.config import SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.verify import tree as tree_module
from specdecode.core.verify import verify_sampling
from specdecode.drafters import eagle, eagle3, medusa
from tests.stats.chi2 import chi2_pvalue
from tests.stats.two_tokens import sample_pairs

V = 5
TRIALS = 10000


def _p(prefix: tuple[int, ...]) -> torch.Tensor:
    """A fixed target distribution after each prefix (deterministic in the prefix)."""
    g = torch.Generator().manual_seed(hash(prefix) % (2**31))
    return torch.softmax(1.5 * torch.randn(V, generator=g), -1)


def _tree() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Depth 1: every token (ranked 4, 0, 2, 1, 3); under the first two, top-3 children; one grandchild each."""
    tokens, parents = [4, 0, 2, 1, 3], [-1] * 5
    for parent in (0, 1):
        for token in (1, 3, 0):
            tokens.append(token)
            parents.append(parent)
            child = len(tokens) - 1
            tokens.append((token + 2) % V)
            parents.append(child)
    return tuple(tokens), tuple(parents)


TOKENS, PARENTS = _tree()


def _path(node: int) -> tuple[int, ...]:
    path = []
    while node >= 0:
        path.insert(0, TOKENS[node])
        node = PARENTS[node]
    return tuple(path)


P_TREE = torch.stack([_p(())] + [_p(_path(n)) for n in range(len(TOKENS))])  # [n + 1, V]
EXACT3 = {(a, b, c): float(_p(())[a] * _p((a,))[b] * _p((a, b))[c])
          for a, b, c in itertools.product(range(V), repeat=3)}


def _first_three(generator) -> tuple[int, int, int]:
    verdict = verify_sampling(TOKENS, PARENTS, None, P_TREE, generator)
    out = [TOKENS[i] for i in verdict.accepted] + [verdict.next_token]
    while len(out) < 3:  # continue from the target itself
        out.append(int(torch.multinomial(_p(tuple(out)), 1, generator=generator)))
    return tuple(out[:3])


def _run(seed: int) -> list[tuple[int, int, int]]:
    generator = torch.Generator().manual_seed(seed)
    return [_first_three(generator) for _ in range(TRIALS)]


def test_eagle_shaped_tree_follows_target(monkeypatch):
    assert chi2_pvalue(_run(3), EXACT3) > 1e-3
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    assert chi2_pvalue(_run(3), EXACT3) < 1e-6


# -- end to end ----------------------------------------------------------------------------------------------
SAMPLES = 1200


def _pairs(engine: Engine) -> list[tuple[int, int]]:
    return sample_pairs(engine, SAMPLES)


BUILDERS = {
    "eagle": lambda t: eagle.untrained(t, eagle.TreeBudget(top_k=3, depth=2, nodes=6)),
    "eagle3": lambda t: eagle3.untrained(t, eagle.TreeBudget(top_k=3, depth=2, nodes=6)),
    "medusa": lambda t: medusa.untrained(t, paths=[[0], [1], [2], [0, 0], [0, 1], [1, 0]]),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_first_tokens_follow_target(name, target, exact):
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, BUILDERS[name](target), spec)
    pairs = _pairs(engine)
    assert chi2_pvalue(pairs, exact) > 1e-3


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_broken_verifier_is_detected_with_eagle(name, target, exact, monkeypatch):
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    spec = SpecConfig(k=2, first_step_drafts=True)
    engine = Engine(target, BUILDERS[name](target), spec)
    assert chi2_pvalue(_pairs(engine), exact) < 1e-4
