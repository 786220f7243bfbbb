"""Sampling with the hybrid drafter is exact on each of its paths: suffix's one-hot trees, the draft model's drawn
chains, and chains whose first token is suffix's (a one-hot q row) followed by the model's drawn ones. The first
two generated tokens follow the target's exact joint distribution; the seeded chains, where one draft mixes
chosen and drawn rows, also reject a broken verifier (residual := p)."""
from __future__ import annotations

import pytest

from specdecode.config import SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.verify import tree as tree_module
from specdecode.drafters.hybrid import Hybrid, HybridConfig
from specdecode.drafters.suffix import Suffix, SuffixConfig
from tests.fakes import ForcedHybrid
from tests.stats.chi2 import chi2_pvalue
from tests.stats.test_e2e_sampling import GIVEN_COSTS, tiny_draft
from tests.stats.two_tokens import sample_pairs

SAMPLES = 1000
SPEC = SpecConfig(k=2, first_step_drafts=True)


def _hybrid(target, path: str) -> Hybrid:
    """free: the rule with a draft model it expects little of (rate 0.3), so suffix's drafts of the repetitive
    prompt win; model: one it expects much of, without seeds; seeded: every step the model's chain after suffix's
    first token (ForcedHybrid)."""
    prior = {"free": 0.3, "model": 0.99, "seeded": 0.8}[path]
    hybrid = Hybrid(Suffix(SuffixConfig(row_cost=0.0)), tiny_draft(target, GIVEN_COSTS()),
                    HybridConfig(seed=False, prior_rate=prior), depth=SPEC.k)
    return ForcedHybrid(hybrid, free=False, seed=1) if path == "seeded" else hybrid


@pytest.mark.parametrize("path", ["free", "model", "seeded"])
def test_each_path_follows_target(path, target, exact):
    hybrid = _hybrid(target, path)
    assert chi2_pvalue(sample_pairs(Engine(target, hybrid, SPEC), SAMPLES), exact) > 1e-3
    taken = {"free": hybrid.free_drafts, "model": hybrid.model_drafts - hybrid.seeded_drafts,
             "seeded": hybrid.seeded_drafts}
    assert taken[path] >= SAMPLES  # every sample's first step went this way (later ones may not: results teach)


def test_broken_verifier_is_detected_with_seeded_chains(target, exact, monkeypatch):
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine = Engine(target, _hybrid(target, "seeded"), SPEC)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact) < 1e-4
