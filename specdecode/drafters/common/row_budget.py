"""How deep a deterministic drafter should draft when every row of the verify pass costs time.

On a GPU a verify pass of up to 64 tokens costs about as much as one, so a drafter proposes all it has. On a CPU
each row costs (for SmolLM2 in fp32 with the few-row kernel of backends/cpu/skinny.py, a pass of w tokens costs
~1 + 0.13 (w - 1) one-token passes; Target.row_cost measures it per model). Drafting a token pays only if its chance
of being accepted beats what its row costs, and that chance differs by kind of proposal: after a three-token
n-gram match prompt lookup's first token is accepted far more often than after a one-token match (the drafters'
prior rates, from `specdecode bench` answers; figures in docs/design-notes.md, "Measured defaults"). So drafters
that propose from tables (prompt lookup, lookahead's pool) keep, per sequence and per kind of proposal, how often
the j-th token was accepted once the (j-1)-th was, and draft the depth that maximises tokens per unit of pass
cost:
    (1 + P_1 + ... + P_d) / (1 + row_cost * d),  P_j = r_1 * ... * r_j.
Depth 0 (a plain one-token pass) wins when even the first token is unlikely; such a kind is still probed with
one token now and then, at doubling intervals, so a change is noticed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from specdecode.core.pass_costs import verify_cost

PRIOR_TRIES = 2  # weight of the prior rates, in proposals: a fresh sequence's own results soon outweigh them
MAX_BACKOFF = 8  # probe intervals double up to this many times probe_every


class RowCost:
    """One more verify row, in one-token passes, as a drafter plans with it: `configured`, else the target's cost
    as the machine runs now (Target.row_cost, read at every plan: pass_costs.RowCostEstimate), else 0 (a bare
    drafter: rows are free).

    The target's cost is first measured when first read, not when the drafter is built: the first read is a
    drafter's first step, on the thread that decodes. Timings taken on a loading thread
    (backends/cpu/own_thread.py) while another thread of the process holds an OpenMP team are wrong: idle workers
    then sleep between parallel regions, which slows a one-token pass more than a wide one. A second
    SpecDecoder.load after decoding measured SmolLM2's row cost at a tenth or less of its true value, and its
    drafters then drafted as if rows were free (docs/architecture.md, "Draft depth by row cost")."""

    def __init__(self, target=None, configured: float | None = None):
        self.target, self.configured = target, configured

    @property
    def value(self) -> float:
        if self.configured is not None:
            return self.configured
        return self.target.row_cost if self.target is not None else 0.0

    def planner(self, seeded: bool) -> Callable[[], float]:
        """`planned` for one sequence, to read at every plan."""
        return lambda: self.planned(seeded)

    def planned(self, seeded: bool) -> float:
        """The cost a sequence plans with: a seeded sampled one (SamplingConfig.seeded) never the measured
        cost, which differs between processes and would change its drafts, its random draws and so its text;
        it plans with the configured cost, else with free rows."""
        if seeded:
            return self.configured if self.configured is not None else 0.0
        return self.value


def row_cost_for(target, configured: float | None = None) -> RowCost:
    """The row cost a drafter of this target plans with: `configured`, else the target's measured one (measured
    on first read)."""
    return RowCost(target, configured)


class Probe:
    """Skipped chances of something that does not pay now, and when to try it anyway: on the probe_every-th,
    then after twice as many, ... up to MAX_BACKOFF x probe_every; reset once it pays."""

    def __init__(self) -> None:
        self.skipped, self.interval = 0, 0

    def paid(self) -> None:
        self.skipped, self.interval = 0, 0

    def due(self, probe_every: int) -> bool:
        self.interval = self.interval or probe_every
        self.skipped += 1
        if self.skipped < self.interval:
            return False
        self.skipped, self.interval = 0, min(2 * self.interval, MAX_BACKOFF * probe_every)
        return True


class Yield:
    """Mean accepted tokens per try of something that costs `rows` rows (lookahead's Jacobi window: tokens
    accepted from n-grams it harvested, per pass it rode along), from a prior worth PRIOR_TRIES tries."""

    def __init__(self, prior: float):
        self.total, self.tries = prior * PRIOR_TRIES, float(PRIOR_TRIES)
        self.probe = Probe()

    @property
    def mean(self) -> float:
        return self.total / self.tries

    def add(self, accepted: float) -> None:
        self.credit(accepted)
        self.spent()

    def credit(self, accepted: float) -> None:
        """Tokens it earned (may come on a later pass than the try that earned them)."""
        self.total += accepted

    def spent(self) -> None:
        """One more try."""
        self.tries += 1

    def worth(self, rows: int, row_cost: float, probe_every: int) -> bool:
        """Whether to spend `rows` now: the mean pays for them, or a probe is due."""
        if self.mean >= row_cost * rows:
            self.probe.paid()
            return True
        return self.probe.due(probe_every)


class DepthYield:
    """Acceptance by depth for one kind of proposal: rate j = P(token j accepted | token j-1 accepted), from
    prior rates (the last one repeats for deeper tokens) worth PRIOR_TRIES proposals, updated by results."""

    def __init__(self, prior_rates: Sequence[float]):
        self.prior = tuple(prior_rates)
        self.reached: list[float] = []  # [j-1]: proposals that drafted token j and accepted all before it
        self.passed: list[float] = []  # [j-1]: ... of which token j was accepted too

    def rate(self, j: int) -> float:
        prior = self.prior[min(j, len(self.prior)) - 1]
        seen, ok = (self.reached[j - 1], self.passed[j - 1]) if j <= len(self.reached) else (0.0, 0.0)
        return (prior * PRIOR_TRIES + ok) / (PRIOR_TRIES + seen)

    def add(self, drafted: int, accepted: int) -> None:
        """A proposal of `drafted` tokens of which the first `accepted` passed."""
        while len(self.reached) < drafted:
            self.reached.append(0.0)
            self.passed.append(0.0)
        for j in range(1, min(accepted + 1, drafted) + 1):
            self.reached[j - 1] += 1
            self.passed[j - 1] += accepted >= j

    def best_depth(self, available: int, row_cost: float) -> int:
        """The depth in 0..available that maximises expected tokens per unit of pass cost (ties: deeper)."""
        best, best_value, tokens, reach = 0, 1.0, 1.0, 1.0
        for depth in range(1, available + 1):
            reach *= self.rate(depth)
            tokens += reach
            value = tokens / (1 + row_cost * depth)
            if value >= best_value:
                best, best_value = depth, value
        return best


class DepthPolicy:
    """DepthYield per kind of proposal plus probing: the depth to draft for a proposal of a kind."""

    def __init__(self, priors: dict, row_cost: float | Callable[[], float], probe_every: int = 8):
        """row_cost: the cost to plan with, or where to read it at every plan (RowCost.planned: it follows the
        machine)."""
        self.kinds = {kind: DepthYield(rates) for kind, rates in priors.items()}
        self.probes = {kind: Probe() for kind in priors}
        self._cost = row_cost if callable(row_cost) else (lambda: row_cost)
        self.probe_every = probe_every

    @property
    def row_cost(self) -> float:
        return self._cost()

    def depth(self, kind, available: int) -> int:
        """Depth to draft of `available` tokens of this kind: the best by the rates, or 1 when a probe is due."""
        if available <= 0:
            return 0
        depth = self.kinds[kind].best_depth(available, self.row_cost)
        if depth:
            self.probes[kind].paid()
            return depth
        return 1 if self.probes[kind].due(self.probe_every) else 0

    def add(self, kind, drafted: int, accepted: int) -> None:
        self.kinds[kind].add(drafted, accepted)


class ChainBudget:
    """Where a drafter that pays a pass per drafted token (a draft model) should stop, from the draft's own
    confidence: with P_j the product of the draft's top probabilities up to token j (its estimate that token j
    is accepted), a draft of n tokens is worth (1 + P_1 + ... + P_n) tokens for verify(n) + n * draft_pass
    one-token target passes (verify(n): a pass of 1 + n tokens, measured). A token is kept while its P pays for
    what its row adds (its pass is spent), and one more pass is taken while the next token, guessed as likely as
    this one, would pay for its pass and row: so the depth follows the draft's confidence and this machine's
    costs, where a fixed k or a fixed confidence threshold suits one machine (on AMX a verify row of the Qwen
    1.5B costs little and 8 tokens pay; on AVX2 rows past 4 cost more). `costs` is read at every draft's start
    (pass_costs.ChainCostEstimate: measured on first use, on the thread that decodes, RowCost's reason; then
    followed) and told every draft pass (`observe_draft`). measured: the costs are timed on this machine, so a
    seeded sampled sequence must not plan with them (RowCost.planned's reason) and drafts k tokens; given costs
    (measured=False) are the same in every process and size its drafts too."""

    def __init__(self, costs: Callable[[], tuple[float, Sequence[float]]], measured: bool = True):
        self._costs, self.measured = costs, measured

    def observe_draft(self, seconds: float) -> None:
        """One draft pass of one token took `seconds` (told to costs that follow the machine)."""
        observe = getattr(self._costs, "observe_draft", None)
        if observe is not None:
            observe(seconds)

    def costs(self, seeded: bool) -> tuple[float, Sequence[float]] | None:
        """(one draft pass, the verify curve) to plan with now, in one-token target passes; None for a seeded
        sampled sequence when the costs are measured (it must not plan with this machine's timings)."""
        return None if seeded and self.measured else self._costs()

    def walk(self, seeded: bool) -> ChainWalk | None:
        """A new draft's walk; None (draft k tokens) for a seeded sampled sequence when the costs are measured."""
        costs = self.costs(seeded)
        return None if costs is None else ChainWalk(costs[1], costs[0])

    def start(self) -> ChainWalk:
        draft_pass, verify = self._costs()
        return ChainWalk(verify, draft_pass)


class ChainWalk:
    """One draft's running sums for ChainBudget: tokens expected (the bonus token counts), draft passes spent.
    verify[n]: a verify pass with n drafted tokens, in one-token passes (verify[0] = 1); past its end each row
    costs what its last one did."""

    def __init__(self, verify: Sequence[float], draft_pass: float):
        self.verify, self.draft_pass = list(verify), draft_pass
        self.reach, self.tokens, self.kept, self.drafting = 1.0, 1.0, 0, draft_pass

    def _pays(self, reach: float, extra_pass: float) -> bool:
        """Whether a token of this reach, costing one more verify row and `extra_pass`, raises tokens per pass."""
        now = verify_cost(self.verify, self.kept) + self.drafting
        then = verify_cost(self.verify, self.kept + 1) + self.drafting + extra_pass
        return (self.tokens + reach) * now >= self.tokens * then

    def seed(self, reaches: Sequence[float]) -> None:
        """Count tokens another drafter proposed ahead of this draft (a free prefix), each with its own estimated
        chance of being accepted (cumulative): they cost their verify rows and no draft pass."""
        for reach in reaches:
            self.reach, self.tokens, self.kept = reach, self.tokens + reach, self.kept + 1

    def keep(self, top: float) -> bool:
        """Whether the token just drafted with top probability `top` pays for its verify row (counted if so)."""
        reach = self.reach * top
        if not self._pays(reach, 0.0):
            return False
        self.reach, self.tokens, self.kept = reach, self.tokens + reach, self.kept + 1
        return True

    def go_on(self, top: float) -> bool:
        """Whether one more draft pass pays, its token guessed as likely as the last one (`top`); if so, counted."""
        if not self._pays(self.reach * top, self.draft_pass):
            return False
        self.drafting += self.draft_pass
        return True
