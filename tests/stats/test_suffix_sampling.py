"""Sampling with the suffix drafter's store trees is exact. The store fills with the earlier samples of the same
prompt, so after the first few samples every draft is a tree of the most frequent earlier continuations, several
branches wide (one-hot q). The first two generated tokens follow the target's exact joint distribution, and the
same test rejects a broken verifier (residual := p)."""
from __future__ import annotations

from specdecode.config import SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.verify import tree as tree_module
from specdecode.drafters.suffix import Suffix, SuffixConfig
from tests.stats.chi2 import chi2_pvalue
from tests.stats.two_tokens import sample_pairs

SAMPLES = 1000


class StoreForSeeded(Suffix):
    """Drafts from the store for seeded sequences too (the registry's drafter does not: a seed must give the same
    text whatever the store holds); every sample here is seeded, for a reproducible test. Counts tree drafts."""

    trees = 0

    def start(self, seq):
        super().start(seq)
        seq.state.use_store = True

    def propose(self, seqs):
        drafts = super().propose(seqs)
        self.trees += sum(len(d) > d.depth for d in drafts)
        return drafts


def _engine(target) -> tuple[Engine, StoreForSeeded]:
    spec = SpecConfig(k=2, first_step_drafts=True)
    drafter = StoreForSeeded(SuffixConfig(row_cost=0.0))  # free rows: every frequent branch is drafted
    return Engine(target, drafter, spec), drafter


def test_store_trees_follow_target(target, exact):
    engine, drafter = _engine(target)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact) > 1e-3
    assert drafter.stats().hits > SAMPLES // 2 and drafter.trees > SAMPLES // 2  # the store's trees were verified


def test_broken_verifier_is_detected_with_store_trees(target, exact, monkeypatch):
    monkeypatch.setattr(tree_module, "residual", lambda p, q, token: p)
    engine, _ = _engine(target)
    assert chi2_pvalue(sample_pairs(engine, SAMPLES), exact) < 1e-4

