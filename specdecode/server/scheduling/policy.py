"""Per-step speculation length for a batch: draft K tokens per row only while it pays at this batch size.

A verification pass over b rows of q tokens each costs cost(b, q) (a measured table). On a CPU the pass is
compute-bound once b * q is large, so drafting K tokens for 16 rows costs several plain steps, while at batch 1
it costs little more than one token. Each step the scheduler picks the cap K that maximises expected committed
tokens per second over the batch (rows draft min(K, their own K)):

    throughput(K) = sum_i E_i(K) / (P * cost(b, K + 1) + (1 - P) * cost(b, 1) + draft_ms_per_k * K)
    E_i(K) = 1 + p_i * (a_i + a_i^2 + ... + a_i^K)     (rows that do not speculate: E_i = 1)
    P = 1 - prod_i (1 - p_i)                          (the block is padded to its longest draft)

A target that computes no padding (the native decoder) pays for the rows it drafts, not for the padded block:
its pass costs cost(b, 1 + sum_i p_i * min(K, K_i) / b), the table at the mean tokens per row.

where a_i is row i's per-token acceptance probability (accepted / tried draft tokens) and p_i the fraction of
its steps whose drafter proposed anything (prompt lookup often finds nothing, and then costs nothing). K = 0 is
plain decoding. A row's estimates are shrunk towards its drafter's pooled estimate over recent rows, which is
shrunk towards the drafter's long-run record, which is shrunk towards fixed constants. All evidence decays every
step (`memory`, `pooled_memory`, `record_memory`), so when speculation has been switched off the estimates drift
back towards the prior and it is tried again later instead of staying off forever; the record keeps that prior
the drafter's own for ~1,000 steps rather than the constants' (the Qwen pair's 0.9 and more, against 0.6, at
which its drafting is priced out and was never tried again). The draft cost per unit of K is measured online by
the scheduler (DraftCost: it matters for model drafters, ~0 for prompt lookup), in steps whose drafters were not
catching up. Where no K pays with that cost, a step may allow free drafts only (`choose`: drafts that cost no
draft pass, priced by their own acceptance), which at 4 rows on a 2-core CPU is the only drafting that can pay.
"""
from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdecode.core.pass_costs import time_passes
from specdecode.core.target import Target


@dataclass(frozen=True)
class CostTable:
    """Verification-pass cost in ms over a grid: ms[i][j] for batch sizes[i] and q (tokens per row) qs[j]."""

    batches: tuple[int, ...]
    qs: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]  # [len(batches)][len(qs)]

    def cost(self, batch: int, q: int) -> float:
        """Bilinear interpolation; linear extrapolation beyond the grid's last points, clamped below."""
        row = [_interpolate(self.qs, values, q) for values in self.ms]
        return _interpolate(self.batches, row, batch)

    def markdown(self) -> str:
        head = "| batch \\ tokens per row | " + " | ".join(str(q) for q in self.qs) + " |"
        rule = "|---" * (len(self.qs) + 1) + "|"
        rows = [f"| {b} | " + " | ".join(f"{v:.0f}" for v in values) + " |" for b, values in zip(self.batches, self.ms)]
        return "\n".join([head, rule, *rows])


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


# SmolLM2-135M-Instruct, fp32, the project's 2-core CPU dev machine, 2 torch threads, 256 cached tokens, eager,
# through Target.forward; each cell the fastest of 8 interleaved rounds (`calibrate`). The machine was shared
# (load 4-5 on 2 cores), so single cells are noisy (e.g. b=1, q=7); the shape is what matters. Note the bump at
# b * q = 2..3 tokens (fp32 GEMMs with 2-3 rows are slower than with 4-8 on this CPU): K = 1-2 at batch 1 costs
# more than K = 3-4. Re-measure with `specdecode serve --k-policy calibrate` (it prints the table).
SMOLLM2_CPU_FP32 = CostTable(
    batches=(1, 2, 4, 8, 16),
    qs=(1, 2, 3, 4, 5, 7, 9),
    ms=(
        (59.0, 99.7, 117.4, 88.2, 87.0, 120.1, 101.9),
        (96.2, 90.3, 102.9, 92.0, 112.4, 113.6, 128.3),
        (92.6, 96.8, 113.6, 119.1, 129.9, 152.9, 162.5),
        (107.2, 135.7, 149.6, 180.8, 197.2, 237.4, 264.2),
        (117.9, 209.1, 244.1, 278.9, 320.4, 391.3, 451.2),
    ),
)

# The same model in int4 (the CPU default: packed layers, native decoder layers), same machine, quiet, each cell
# the fastest of 8 rounds (docs/design-notes.md, "Measured defaults"). Rows are compute here: a batch's cost grows
# almost linearly with its rows (one token on 16 rows ~7x one row; fp32 above: ~2.5x), so drafting pays at far
# smaller batches than in fp32.
SMOLLM2_CPU_INT4 = CostTable(
    batches=(1, 2, 4, 8, 16),
    qs=(1, 2, 3, 4, 5, 7, 9),
    ms=(
        (6.0, 6.6, 8.2, 9.5, 11.5, 14.3, 18.4),
        (7.3, 10.2, 13.7, 16.8, 21.2, 28.6, 34.0),
        (12.0, 18.8, 25.1, 31.9, 38.4, 51.1, 64.2),
        (22.3, 36.1, 48.7, 64.1, 75.5, 108.7, 138.7),
        (42.1, 74.0, 103.1, 131.2, 164.2, 206.8, 276.4),
    ),
)


# the model both built-in tables were measured on, SmolLM2-135M: (hidden size, layers, vocabulary size)
BUILTIN_MODEL = (576, 30, 49152)


def builtin_fits(config) -> bool:
    """Whether the built-in tables describe the model with this (text) config. Their milliseconds are set against
    draft passes timed online on the loaded model, so for any other model they would misprice drafting: the Qwen
    pair's 0.5B draft passes (~10 ms) against SmolLM2's 6 ms verify passes made the server decode plainly at every
    batch size, one client included (tau 1.00; the pair's own passes cost 31 ms)."""
    names = ("hidden_size", "num_hidden_layers", "vocab_size")
    return tuple(getattr(config, name, None) for name in names) == BUILTIN_MODEL


def builtin_table(packed: bool) -> CostTable:
    """The built-in table for `--k-policy measured`: the int4 one for a target that decodes through packed
    layers, else the fp32 one (both SmolLM2-135M on the 2-core CPU; any other model's costs are timed at
    start-up: builtin_fits)."""
    return SMOLLM2_CPU_INT4 if packed else SMOLLM2_CPU_FP32


DRAFT_SAMPLES = 8  # steps behind DraftCost's least


@dataclass(frozen=True)
class RowEstimate:
    """What the policy knows about one speculating row."""

    alpha: float  # per-token acceptance probability
    p_draft: float  # fraction of steps that produced a non-empty draft
    max_k: int  # the row's own cap (request k / adaptive k)


@dataclass(frozen=True)
class SpecPolicy:
    """Chooses the batch's draft-length cap each step from a cost table (see the module docstring)."""

    table: CostTable
    max_k: int = 8
    prior_alpha: float = 0.6
    prior_weight: float = 4.0  # pseudo-trials behind prior_alpha
    memory: float = 0.9  # per-step decay of a row's evidence (about the last 10 steps count)
    pooled_memory: float = 0.98  # per-step decay of a drafter's evidence pooled over its rows
    record_memory: float = 0.999  # ... and of its long-run record, the pooled estimate's prior
    min_gain: float = 1.02  # a longer K must beat the best so far by this factor (table noise must not flip K)
    ragged: bool = False  # the target computes no padding (the native decoder): see choose_k

    def expected_tokens(self, row: RowEstimate, k: int) -> float:
        k = min(k, row.max_k)
        return 1.0 + row.p_draft * sum(row.alpha ** j for j in range(1, k + 1))

    def choose_k(self, batch: int, rows: Sequence[RowEstimate], draft_ms_per_k: float = 0.0) -> int:
        """batch: all rows in the step; rows: the speculating ones. Returns the cap K (0 = plain decoding)."""
        if not rows:
            return 0
        plain_cost = self.table.cost(batch, 1)
        any_draft = 1.0 - math.prod(1.0 - row.p_draft for row in rows)
        longest = max(row.max_k for row in rows)
        best_k, best = 0, batch / plain_cost
        for k in range(1, min(self.max_k, longest) + 1):
            tokens = batch - len(rows) + sum(self.expected_tokens(row, k) for row in rows)
            if self.ragged:  # a pass costs its rows: the table's at the mean tokens per row
                drafted = sum(row.p_draft * min(k, row.max_k) for row in rows)
                cost = self.table.cost(batch, 1 + drafted / batch) + draft_ms_per_k * k
            else:
                cost = any_draft * self.table.cost(batch, 1 + k) + (1 - any_draft) * plain_cost + draft_ms_per_k * k
            if tokens / cost > best * self.min_gain:
                best_k, best = k, tokens / cost
        return best_k

    def choose(self, batch: int, rows: Sequence[RowEstimate], draft_ms_per_k: float,
               free: Sequence[RowEstimate | None]) -> StepCap:
        """choose_k, and where it drafts nothing, whether free drafts alone pay: free[i] is row i's estimate of its
        drafts that cost no draft pass (Draft.free), None where its drafter has none (Capabilities.free_drafts).
        In a free-only step the rows without them decode plainly and the others pay no drafting time. That wins
        where a model's passes do not pay at this batch size (the Qwen 1.5B's verify passes over 4 rows on the
        2-core CPU: 188 ms with 6 tokens a row against 41 for one, so a draft model's tokens never pay there)
        while free drafts nearly always accepted do. The free estimates are their own: a model's accepted
        drafts overrate a hybrid's free ones (a fallback on the pooled estimates measured 0.92x plain decoding
        at 4 clients, where it had drafted nothing at 0.99x)."""
        k = self.choose_k(batch, rows, draft_ms_per_k)
        freely = [row for row in free if row is not None]
        if k > 0 or not freely or draft_ms_per_k == 0.0:  # drafting pays, or nothing would be saved
            return StepCap(k)
        free_k = self.choose_k(batch, freely, 0.0)
        return StepCap(free_k, free_only=free_k > 0)


@dataclass(frozen=True)
class StepCap:
    """The batch's draft-length cap for a step, and whether the step allows free drafts only (no draft pass:
    SequenceContext.free_only)."""

    k: int
    free_only: bool = False


@dataclass
class AcceptanceStats:
    """Per-row acceptance evidence (decaying), updated by the scheduler after every step."""

    trials: float = 0.0  # draft tokens the target looked at with all earlier ones accepted
    accepted: float = 0.0
    spec_steps: float = 0.0  # steps where the row was allowed to draft
    drafted_steps: float = 0.0  # ... and its drafter proposed something

    def decay(self, memory: float) -> None:
        self.trials, self.accepted = self.trials * memory, self.accepted * memory
        self.spec_steps, self.drafted_steps = self.spec_steps * memory, self.drafted_steps * memory

    def observe(self, allowed_k: int, depth: int, accepted: int, memory: float = 1.0) -> None:
        """One step of one row: first the old evidence decays, then this step's is added."""
        self.decay(memory)
        if allowed_k <= 0:
            return
        self.spec_steps += 1
        if depth > 0:
            self.drafted_steps += 1
            self.trials += min(accepted + 1, depth)
            self.accepted += accepted

    def estimate(self, policy: SpecPolicy, max_k: int, prior: RowEstimate | None = None) -> RowEstimate:
        """Evidence shrunk towards a prior: the drafter's pooled estimate over recent rows when given (so a new
        request starts from what this drafter achieves on the current traffic), else the policy's constants."""
        alpha0, p0 = (prior.alpha, prior.p_draft) if prior else (policy.prior_alpha, 1.0)
        weight = policy.prior_weight
        alpha = (self.accepted + alpha0 * weight) / (self.trials + weight)
        p_draft = (self.drafted_steps + p0 * weight) / (self.spec_steps + weight)
        return RowEstimate(min(alpha, 0.99), min(p_draft, 1.0), max_k)


@dataclass
class DrafterEvidence:
    """A drafter's evidence over all its rows: recent (decaying by pooled_memory) and its long-run record (by
    record_memory); a row's estimate is shrunk towards `prior`, the recent evidence shrunk towards the record."""

    recent: AcceptanceStats = field(default_factory=AcceptanceStats)
    record: AcceptanceStats = field(default_factory=AcceptanceStats)
    free: AcceptanceStats = field(default_factory=AcceptanceStats)  # recent, of its drafts that cost no pass alone

    def decay(self, policy: SpecPolicy) -> None:
        self.recent.decay(policy.pooled_memory)
        self.record.decay(policy.record_memory)
        self.free.decay(policy.pooled_memory)

    def observe(self, allowed_k: int, depth: int, accepted: int) -> None:
        self.recent.observe(allowed_k, depth, accepted)
        self.record.observe(allowed_k, depth, accepted)

    def prior(self, policy: SpecPolicy, max_k: int) -> RowEstimate:
        return self.recent.estimate(policy, max_k, self.record.estimate(policy, max_k))

    def free_prior(self, policy: SpecPolicy, max_k: int) -> RowEstimate:
        """A row's prior for its free drafts alone: the drafter's recent ones, shrunk towards the constants."""
        return self.free.estimate(policy, max_k)


PAID_MEMORY = 0.9  # per drafting step, decay of DraftCost's share of steps that paid draft passes
# scheduler steps after which DraftCost forgets samples no step has renewed: samples come only from steps that
# draft, so a cost that keeps every step from drafting would otherwise stand for good
SAMPLE_LIFE = 256


@dataclass
class DraftCost:
    """The batch's expected drafting time per unit of K (ms) by batch size, measured online: what a step whose
    drafts cost passes takes (the least of the last DRAFT_SAMPLES such steps in which every drafting row had
    drafted in its previous step too) times the share of recent drafting steps that paid any (a hybrid's steps
    of free drafts alone cost nothing: Draft.free). A row's first draft runs the draft model over its prompt,
    and its first after plain steps over what they committed: with the Qwen pair's 0.5B such steps took 240-470
    ms at one to four rows against 6.5 / 14 ms per drafted token steady at 1 / 2 rows (rows draft in lockstep:
    DraftModel.draft_rows), and as the cost of every later step one of them switched speculation off for good.
    Slower samples are the machine's noise or such catch-ups, never a cheaper draft, so the least is the cost.
    Steps of free drafts alone are no samples: taken for the cost of drafting with passes, a hybrid's 0.4 ms at
    4 rows sent the cap from 1 to 4, steps of 290 ms against 100. By batch size: one draft pass over four rows
    costs more than over one, and more rows make a step with some model draft likelier.

    Samples come only from steps that draft, so a cost that prices every step out of drafting could not be
    corrected: one `draft-model` bench-serve run of the Qwen pair drafted nothing at 1 and 4 clients (tau 1.00)
    where the runs around it drafted at tau 3.6-4.6. Samples no step has renewed for SAMPLE_LIFE steps are
    forgotten (`tick`), and drafting is tried again: at most a catch-up step and a steady one per SAMPLE_LIFE
    steps where drafting does not pay."""

    samples: dict[int, collections.deque[float]] = field(default_factory=dict)
    paid: dict[int, float] = field(default_factory=dict)  # by batch size: the decaying share of paying steps
    renewed: dict[int, int] = field(default_factory=dict)  # by batch size: the step of its last sample
    steps: int = 0

    def ms_per_k(self, batch: int) -> float:
        """The least at this batch size times its paying share; at a size not measured yet, the nearest measured
        one's scaled by the rows (a draft pass over b rows costs at most b one-row passes: the 0.5B's passes over
        1 / 2 / 4 rows take 8.8 / 10.1 / 14.8 ms), so that a size is not tried where its rows alone price drafting
        out, and every step paying; 0.0 before any (drafting is tried)."""
        if not self.samples:
            return 0.0
        measured = min(self.samples, key=lambda size: (abs(size - batch), size))
        return min(self.samples[measured]) * batch / measured * self.paid.get(batch, 1.0)

    def observe_step(self, batch: int, paid: bool) -> None:
        """A step in which some row drafted: whether any draft cost passes."""
        self.paid[batch] = PAID_MEMORY * self.paid.get(batch, 1.0) + (1.0 - PAID_MEMORY) * paid

    def observe(self, batch: int, ms_per_k: float) -> None:
        """A paying step's drafting time per unit of K."""
        self.samples.setdefault(batch, collections.deque(maxlen=DRAFT_SAMPLES)).append(ms_per_k)
        self.renewed[batch] = self.steps

    def tick(self) -> None:
        """A scheduler step went by: forget the samples of sizes no step has renewed for SAMPLE_LIFE steps."""
        self.steps += 1
        for batch in [b for b, step in self.renewed.items() if self.steps - step >= SAMPLE_LIFE]:
            del self.samples[batch], self.renewed[batch]


def calibrate(target: Target, batches: Sequence[int] = (1, 2, 4, 8, 16),
              qs: Sequence[int] = (1, 2, 3, 4, 5, 7, 9), context: int = 256, repeats: int = 5) -> CostTable:
    """Measure cost(b, q): a chain block of q tokens per row over `context` cached tokens, each cell its fastest
    of `repeats` rounds (core/pass_costs.time_passes)."""
    best = time_passes(target, [(b, q) for b in batches for q in qs], context=context, rounds=repeats)
    ms = tuple(tuple(round(best[b, q] * 1000, 1) for q in qs) for b in batches)
    return CostTable(tuple(batches), tuple(qs), ms)
