"""What target passes cost on this machine, measured on the model itself: the one place the machine is timed.

Which matrix kernel serves few-row passes is timed here too (`skinny_rows`, the kernel's own sweep). Three users
ask about passes: a drafter deciding how deep to draft needs the cost of one more row of a verify pass
(`RowCostEstimate`, via Target.row_cost, drafters/common/row_budget.py: measured at first ask, then followed
from the passes the engine runs); the server's batch policy needs a
table cost(batch, tokens) (server/policy.calibrate); the benchmark reports the per-pass cost curve
(bench/passcost.pass_costs). All of them time the same thing (`time_passes`)."""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy
import torch

from specdecode.backends.cpu.skinny import helps
from specdecode.core.trees import build_block

Shape = tuple[int, int]  # (rows, tokens per row)


@torch.inference_mode()
def time_passes(target, shapes: Sequence[Shape], context: int, rounds: int,
                reduce: Literal["min", "median"] = "min") -> dict[Shape, float]:
    """Seconds of one target pass of a q-token chain on each of b rows, each row holding `context` cached
    tokens (random, seeded: attention reads real keys), for every (b, q) in `shapes`. Each round times every
    shape once, so a burst of load elsewhere hits all shapes alike; the first round only warms up (and compiles).
    reduce: "min", the least disturbed estimate on a shared machine (for decisions), or "median" (for reports)."""
    rows = max(b for b, _ in shapes)
    cache = target.new_cache(rows=rows, capacity=context + max(q for _, q in shapes) + 8)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, target.vocab_size, (context,), generator=generator).tolist()
    # row 0's keys are computed and the other rows' copied from it (a dynamic cache): a prefill per row was most of
    # a server's start-up on the Qwen 1.5B (13.9 of 25.1 s of timing, over 8 rows)
    for row in range(rows):
        if row and not cache.static:
            cache.copy_prefix(0, row, context)
        else:
            target.forward(cache, [row], build_block([0], [prefix], [list(range(-1, context - 1))], target.pad_id,
                                                     target.block_device), keep="last")
    blocks = {(b, q): build_block([context] * b, [prefix[:q]] * b, [list(range(-1, q - 1))] * b, target.pad_id,
                                  target.block_device) for b, q in shapes}
    times: dict[Shape, list[float]] = {shape: [] for shape in blocks}
    for round_ in range(rounds + 1):
        for (b, q), block in blocks.items():
            synchronize(target.device)
            began = time.perf_counter()
            target.forward(cache, list(range(b)), block)
            synchronize(target.device)
            if round_:
                times[b, q].append(time.perf_counter() - began)
    pick = min if reduce == "min" else statistics.median
    return {shape: pick(seconds) for shape, seconds in times.items()}


def measure_row_cost(target, width: int = 8, rounds: int = 3) -> float:
    """Cost of one more row of a pass, in one-token passes: 0 off the CPU (a pass is flat there up to tens of
    tokens); on the CPU (t_width / t_1 - 1) / (width - 1) over a cache of 32 tokens (under a second for SmolLM2,
    about a seventh of a pass a row there: docs/design-notes.md, "Measured defaults"). A CPU whose BLAS handles
    few rows well gets a lower cost."""
    if target.device.type != "cpu":
        return 0.0
    best = time_passes(target, [(1, 1), (1, width)], context=32, rounds=rounds)
    return max(0.0, (best[1, width] / best[1, 1] - 1) / (width - 1))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_chain_costs(draft, target, depth: int, rounds: int = 2) -> tuple[float, list[float]]:
    """What a draft model's chain of up to `depth` tokens costs, in the target's one-token passes over caches of
    32 tokens: (one draft pass, [a verify pass of 1 + n tokens for n = 0..depth]). The verify curve is measured,
    not a line: on AVX2 the Qwen 1.5B's 2-token pass costs about its 1-token pass, and each row past 4 costs about
    twice what a row up to 4 does (docs/drafters.md, "draft-model"). Widths between the measured ones (1, 2, 3,
    4, 6, 8, 12, 16, ...) are interpolated. Off the CPU passes are flat: (0, all 1)."""
    if target.device.type != "cpu":
        return 0.0, [1.0] * (depth + 1)
    widths = sorted({w for w in (1, 2, 3, 4, 6, 8, *range(12, depth + 2, 4), depth + 1) if w <= depth + 1})
    seconds = time_passes(target, [(1, w) for w in widths], context=32, rounds=rounds)
    one = seconds[1, 1]
    draft_pass = time_passes(draft, [(1, 1)], context=32, rounds=rounds)[1, 1] / one
    between = numpy.interp(range(1, depth + 2), widths, [seconds[1, w] for w in widths])
    return draft_pass, [max(float(t), one) / one for t in between]


def skinny_rows(model: torch.nn.Module) -> int | None:
    """The fewest rows from which the few-row kernel beats F.linear for this model's weights on this machine
    (None: never): skinny.helps, which times both kernels over the weights (~1 s; none for packed weights)."""
    return helps(model)


PRIOR_ROW_COST = 0.15  # one more verify row, in one-token passes, where nothing better is known (a packed model on
# the 2-core CPU measures 0.1-0.2: docs/design-notes.md, "Costs that follow the machine")


@dataclass
class RowCostEstimate:
    """One more verify row's cost, in one-token passes, as the machine runs now. The engine reports every pass of
    one decode row (`observe`); the estimate is, per pass width w > 1, (t_w / t_1 - 1) / (w - 1) from the median
    times among the last `keep` passes of the last `window_s` seconds (min_samples passes of a width at least),
    weighted by how many each width has: the definition `measure` times at first ask. A busy minute slows every
    width alike and leaves the ratio; a spike is one sample of a median; the passes compared are the latest, so of
    one period of the machine's load; and what a minute of load taught is gone when its passes age out (while
    drafting pays, one-token passes are rare: the last estimate stands until a few come). Before the passes say
    anything, the measurement `measure()` takes at first ask counts while it is recent; after that, the last
    estimate drifts back to PRIOR_ROW_COST over further windows: a cost timed during a busy minute (1.87 of a pass
    once, where 0.14 is usual) would otherwise keep every drafter from drafting, and so from running the wider
    passes that would correct it (they still probe, a token now and then)."""

    measure: Callable[[], float]
    window_s: float = 30.0
    keep: int = 48  # the latest passes the estimate is read from
    min_samples: int = 2  # passes of a width for its median to count
    clock: Callable[[], float] = time.monotonic
    _passes: deque[tuple[float, int, float]] = field(default_factory=deque, repr=False)  # (when, width, seconds)
    _last: tuple[float, float] | None = field(default=None, repr=False)  # (when, estimate)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _observed: int = field(default=0, repr=False)  # passes reported so far
    _fitted: tuple[int, float, float | None] | None = field(default=None, repr=False)  # (observed, when, fit)

    def observe(self, width: int, seconds: float) -> None:
        """A pass of one decode row, `width` tokens wide, took `seconds`."""
        if width < 1 or not seconds > 0:
            return
        with self._lock:
            self._passes.append((self.clock(), width, seconds))
            self._observed += 1
            while len(self._passes) > self.keep:
                self._passes.popleft()

    @property
    def value(self) -> float:
        """Read at every plan of every row: the fit (~20 us over 48 passes) is reused until a pass is reported
        or a second has passed (against a 30 s window)."""
        now = self.clock()
        cached = self._fitted
        if cached is not None and cached[0] == self._observed and now - cached[1] < 1.0:
            fitted = cached[2]
        else:
            fitted = self._from_passes(now)
            self._fitted = (self._observed, now, fitted)
        if fitted is not None:
            self._last = (now, fitted)
            return fitted
        if self._last is None:
            self._last = (now, max(0.0, self.measure()))
        when, last = self._last
        fresh = max(0.0, (now - when) / self.window_s - 1)  # whole windows past the first without evidence
        return PRIOR_ROW_COST + (last - PRIOR_ROW_COST) * 0.5 ** fresh

    def settle(self, measured: float) -> None:
        """A measurement of the same cost taken elsewhere (ChainCostEstimate's verify curve) stands for the one a
        first ask would time: the same passes are not timed twice (the Qwen 1.5B's took 0.6 s)."""
        if self._last is None:
            self._last = (self.clock(), max(0.0, measured))

    def peek(self) -> float | None:
        """The estimate as it stands, without measuring anything (None: nothing known yet): for another thread
        than the one that decodes (a /metrics scrape must not run a pass)."""
        if self._last is None:
            return None
        return self._last[1]

    def recent(self, now: float | None = None) -> list[tuple[int, float]]:
        """(width, seconds) of the passes of the last window_s seconds."""
        now = self.clock() if now is None else now
        with self._lock:
            return [(width, seconds) for when, width, seconds in self._passes if now - when <= self.window_s]

    def _from_passes(self, now: float) -> float | None:
        recent = self.recent(now)
        by_width: dict[int, list[float]] = {}
        for width, seconds in recent:
            by_width.setdefault(width, []).append(seconds)
        ones = by_width.pop(1, [])
        if len(ones) < self.min_samples:
            return None
        base = statistics.median(ones)
        wider = [(len(times), (statistics.median(times) / base - 1) / (width - 1))
                 for width, times in by_width.items() if len(times) >= self.min_samples]
        if not wider:
            return None
        return max(0.0, sum(n * cost for n, cost in wider) / sum(n for n, _ in wider))


@dataclass
class ChainCostEstimate:
    """A draft model's chain costs (measure_chain_costs' pair: one draft pass, and the verify curve, in the
    target's one-token passes) as the machine runs now. The verify curve is the measurement's: a ratio between
    target passes, which a busy minute leaves alone (RowCostEstimate's reason). The draft pass is followed: the
    median of the draft's recent passes over the target's recent one-token pass, which each recent target pass
    tells through the curve (t_w / verify[w - 1]; while drafting pays, the target's passes are verify passes). A
    small draft's many short passes suffer from a busy core more than the target's longer ones (each ends in
    its threads' barrier), so a draft priced at load goes on drafting where it no longer pays. Without
    min_samples of both in the window, the measurement stands."""

    measure: Callable[[], tuple[float, Sequence[float]]]
    target_passes: RowCostEstimate
    min_samples: int = 4
    _measured: tuple[float, list[float]] | None = field(default=None, repr=False)
    _drafts: deque[tuple[float, float]] = field(default_factory=deque, repr=False)  # (when, seconds)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe_draft(self, seconds: float) -> None:
        """One draft pass of one token took `seconds`."""
        if not seconds > 0:
            return
        with self._lock:
            self._drafts.append((self.target_passes.clock(), seconds))
            while len(self._drafts) > self.target_passes.keep:
                self._drafts.popleft()

    def __call__(self) -> tuple[float, list[float]]:
        if self._measured is None:
            draft_pass, verify = self.measure()
            self._measured = (draft_pass, list(verify))
            if len(verify) > 1:  # one more verify row's cost, as RowCostEstimate defines it, at this curve's width
                self.target_passes.settle((verify[-1] - 1) / (len(verify) - 1))
        draft_pass, verify = self._measured
        now = self.target_passes.clock()
        with self._lock:
            drafts = [t for when, t in self._drafts if now - when <= self.target_passes.window_s]
        ones = [t / verify_cost(verify, width - 1) for width, t in self.target_passes.recent(now)]
        if len(drafts) >= self.min_samples and len(ones) >= self.min_samples:
            draft_pass = statistics.median(drafts) / statistics.median(ones)
        return draft_pass, verify


def verify_cost(verify: Sequence[float], n: int) -> float:
    """verify[n]: a verify pass with n drafted tokens, in one-token passes; past the curve's end each row costs
    what its last one did (row_budget.ChainWalk prices drafts with it)."""
    if n < len(verify):
        return verify[n]
    last = verify[-1] - verify[-2] if len(verify) > 1 else 0.0
    return verify[-1] + last * (n - len(verify) + 1)
