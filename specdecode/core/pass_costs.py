"""What target passes cost on this machine, measured on the model itself: the one place the machine is timed.

Which matrix kernel serves few-row passes is timed here too (`skinny_rows`, the kernel's own sweep). Three users
ask about passes: a drafter deciding how deep to draft needs the cost of one more row of a
verify pass (`measure_row_cost`, via Target.row_cost, drafters/common/row_budget.py); the server's batch policy needs a
table cost(batch, tokens) (server/policy.calibrate); the benchmark reports the per-pass cost curve
(bench/passcost.pass_costs). All of them time the same thing (`time_passes`)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
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
    for row in range(rows):
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
