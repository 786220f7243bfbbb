"""Drafters whose drafts are known in advance, shared by the tests that need an exact outcome: an oracle that
drafts the target's true continuation (wrong from a chosen depth on, or costing fake time), a tree whose
first branch is wrong and whose second is right (so the accepted path must be compacted), and a hybrid that
always drafts one way."""
from __future__ import annotations

from specdecode.core.drafting import Draft
from specdecode.drafters.common.base import BaseDrafter
from specdecode.drafters.hybrid import Choice, Hybrid

# what one more verify row costs, in one-token passes, on the quiet 2-core VM (SmolLM2 in int4): tests that assert
# acceptance plan with it, so that a busy machine (whose timings read a row as costing more than a pass) cannot
# make the drafters draft nothing
FIXED_ROW_COST = 0.14


def fixed_chain(draft_pass: float = 0.0, depth: int = 8):
    """A draft model's ChainBudget of given costs, not the machine's (measured=False): a draft pass costing
    `draft_pass` target passes, verify rows at FIXED_ROW_COST. Tests that assert a draft model drafts plan with
    it, for the reason above (a busy machine can price every draft out)."""
    from specdecode.drafters.common.row_budget import ChainBudget

    verify = [1.0 + n * FIXED_ROW_COST for n in range(depth + 1)]
    return ChainBudget(lambda: (draft_pass, verify), measured=False)


class Oracle(BaseDrafter):
    """Proposes a chain of seq.k tokens of `truth`, the continuation after `prompt_len` tokens: the first `right`
    are the true tokens (all of them when right is None), the rest are replaced by (token + 1) % vocab. Under
    greedy verification the target keeps exactly min(right, k) tokens of each draft. Records what it observes."""

    name = "oracle"

    def __init__(self, truth: list[int], prompt_len: int = 0, right: int | None = None, vocab: int = 64):
        self.truth, self.prompt_len, self.right, self.vocab = truth, prompt_len, right, vocab
        self.observed: list[int] = []

    def observe(self, seq, accepted: int) -> None:
        self.observed.append(accepted)

    def propose(self, seqs):
        return [Draft.chain(self.tokens(seq)) for seq in seqs]

    def tokens(self, seq) -> list[int]:
        done = len(seq.tokens) - self.prompt_len
        true = self.truth[done : done + seq.k]
        right = len(true) if self.right is None else self.right
        return [t if i < right else (t + 1) % self.vocab for i, t in enumerate(true)]


class TimedOracle(Oracle):
    """An all-right Oracle that advances a fake clock (anything with a `now` in seconds) by `cost` whenever it
    proposes a non-empty draft, and by `first_cost` more on its first (a draft model prefilling the prompt)."""

    name = "timed-oracle"

    def __init__(self, truth: list[int], prompt_len: int, clock, cost: float, first_cost: float = 0.0):
        super().__init__(truth, prompt_len)
        self.clock, self.cost, self.first_cost = clock, cost, first_cost

    def propose(self, seqs):
        drafts = super().propose(seqs)
        self.clock.now += self.cost * sum(1 for draft in drafts if len(draft)) + self.first_cost
        self.first_cost = 0.0
        return drafts


class WrongThenRightTree(BaseDrafter):
    """Proposes a tree whose FIRST branch is wrong and whose second branch is the next two true tokens of
    `truth`, so the accepted path lies off the first-child slots:

        root -> wrong (0) -> wrong (1)
        root -> right0 (2) -> right1 (3)

    No draft once fewer than two true tokens are left."""

    name = "oracle-tree"

    def __init__(self, truth: list[int], prompt_len: int):
        self.truth, self.prompt_len = truth, prompt_len

    def propose(self, seqs):
        return [self.tree(seq) for seq in seqs]

    def tree(self, seq) -> Draft:
        done = len(seq.tokens) - self.prompt_len
        right = self.truth[done : done + 2]
        if len(right) < 2:
            return Draft()
        wrong = (right[0] + 1) % 250 + 3
        return Draft((wrong, wrong, right[0], right[1]), (-1, 0, -1, 2))


def packaged_marks(name: str, what: str) -> list:
    """pytestmark of a slow test on the packaged model `name`: skipped, with the install line, where its
    packages are not installed."""
    import importlib.util

    import pytest

    from specdecode.loading.packages import PACKAGED

    missing = any(importlib.util.find_spec(package) is None for _, package, _ in PACKAGED[name].parts)
    return [pytest.mark.slow,
            pytest.mark.skipif(missing, reason=f"{what} not installed: {PACKAGED[name].install_hint}")]



class ForcedHybrid(Hybrid):
    """A hybrid's parts under a rule that always goes one way: the free draft (free True), or the draft model's
    chain led by up to `seed` tokens of the free draft's best chain. Each path's exactness is then tested apart
    from the rule that picks among them (tests/unit/test_hybrid.py tests the rule)."""

    def __init__(self, hybrid: Hybrid, free: bool, seed: int = 0):
        super().__init__(hybrid.free, hybrid.model, hybrid.config, hybrid.depth)
        self.free_always, self.seed = free, seed

    def choose(self, plan, reach, costs, k: int) -> Choice:
        if self.free_always:
            return Choice(free=True)
        return Choice(free=False, seed=min(self.seed, len(plan.best_path()), k - 1))
