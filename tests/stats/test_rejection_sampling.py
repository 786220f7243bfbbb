"""Statistical tests of the verifier on synthetic p/q: the emitted tokens follow p exactly. Each test also runs
a deliberately broken verifier (residual replaced by p) and requires the same test to reject it, so these
tests can fail."""
from __future__ import annotations

import pytest
import torch

from specdecode.core.verify import tree as tree_module
from specdecode.core.verify import verify_sampling
from tests.stats.chi2 import chi2_pvalue

V = 6
TRIALS = 12000


def dist(*weights: float) -> torch.Tensor:
    t = torch.tensor(weights, dtype=torch.float32)
    return t / t.sum()


P_ROOT = dist(30, 25, 20, 15, 7, 3)
Q_ROOT = dist(5, 10, 40, 30, 10, 5)  # deliberately unlike p
P_AFTER = torch.stack([dist(*torch.roll(torch.tensor([40.0, 20, 15, 10, 10, 5]), i).tolist()) for i in range(V)])
Q_AFTER = torch.stack([dist(*torch.roll(torch.tensor([10.0, 10, 40, 20, 15, 5]), i).tolist()) for i in range(V)])


def first_two(verdict, draft_tokens, generator) -> tuple[int, int]:
    """The first two emitted tokens; if the step emitted one, the next comes from the target's conditional."""
    emitted = [draft_tokens[i] for i in verdict.accepted] + [verdict.next_token]
    if len(emitted) < 2:
        emitted.append(int(torch.multinomial(P_AFTER[emitted[0]], 1, generator=generator)))
    return emitted[0], emitted[1]


def sample_chain(generator) -> tuple[int, int]:
    """A 2-token chain drafted from q: x1 ~ q_root, x2 ~ q(. | x1)."""
    x1 = int(torch.multinomial(Q_ROOT, 1, generator=generator))
    x2 = int(torch.multinomial(Q_AFTER[x1], 1, generator=generator))
    p = torch.stack([P_ROOT, P_AFTER[x1], torch.full((V,), 1.0 / V)])
    q = torch.stack([Q_ROOT, Q_AFTER[x1]])
    verdict = verify_sampling((x1, x2), (-1, 0), q, p, generator)
    return first_two(verdict, (x1, x2), generator)


def sample_siblings_iid(generator) -> tuple[int, int]:
    """Three siblings drawn i.i.d. from q_root (SpecInfer-style multi-candidate)."""
    xs = tuple(int(torch.multinomial(Q_ROOT, 1, generator=generator)) for _ in range(3))
    p = torch.stack([P_ROOT] + [P_AFTER[x] for x in xs])
    q = torch.stack([Q_ROOT] * 3)
    verdict = verify_sampling(xs, (-1, -1, -1), q, p, generator)
    return first_two(verdict, xs, generator)


def sample_deterministic_tree(generator) -> tuple[int, int]:
    """A fixed tree (q one-hot): root -> {2 -> {0, 3}, 3 -> {1}}, as an n-gram or top-k drafter would give."""
    tokens, parents = (2, 3, 0, 3, 1), (-1, -1, 0, 0, 1)
    p = torch.stack([P_ROOT, P_AFTER[2], P_AFTER[3], P_AFTER[0], P_AFTER[3], P_AFTER[1]])
    verdict = verify_sampling(tokens, parents, None, p, generator)
    return first_two(verdict, tokens, generator)


EXACT = {(a, b): float(P_ROOT[a] * P_AFTER[a][b]) for a in range(V) for b in range(V)}


def run(sampler, seed: int) -> list[tuple[int, int]]:
    generator = torch.Generator().manual_seed(seed)
    return [sampler(generator) for _ in range(TRIALS)]


@pytest.mark.parametrize("sampler", [sample_chain, sample_siblings_iid, sample_deterministic_tree])
def test_emitted_tokens_follow_target(sampler, monkeypatch):
    assert chi2_pvalue(run(sampler, seed=1), EXACT) > 1e-3
    # the same test must reject a verifier whose residual is p itself
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    assert chi2_pvalue(run(sampler, seed=1), EXACT) < 1e-6


def test_seeded_runs_are_reproducible():
    assert run(sample_chain, seed=7)[:200] == run(sample_chain, seed=7)[:200]
