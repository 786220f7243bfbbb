"""Faster linear layers for decoding on a CPU: W @ X^T instead of X @ W^T for a few rows.

Decoding multiplies a handful of rows (1 token, or the 2..64 nodes of a draft) by every weight matrix. How
torch's BLAS (MKL) runs `F.linear(x, W)` for so few rows depends on the CPU: on the AMD EPYC cores of our
development machines its one-row (GEMV) and few-row paths read the weights at about half the memory bandwidth,
while the same product computed as (W @ X^T)^T with X^T of at least two columns (one row is padded to two) runs
two to four times as fast at one or two rows and about a third faster from 8 to 128 rows; a whole one-token
forward of SmolLM2-135M in fp32 takes about half the time. The operand must be row-major: our output is
(W @ X^T)^T, a column-major view, and elementwise ops (SiLU x up, residual adds) hand that layout to the next
layer, where X^T would then be row-major, which MKL multiplies about four times slower at 2-8 rows. Copying X
(a few rows) fixed it: a pass of 2 tokens costs about 1.1 one-token passes instead of 1.5 (docs/design-notes.md,
"The few-row kernel").

Because this is a property of the machine's BLAS, not of the model, `helps()` measures both on the model's
own weights at load and the Target uses the faster one, from one row or from two. The products are the same up
to float rounding (summation order), like any change of kernel: greedy equivalence is tested with the kernel
forced on.

The swap is scoped (`SkinnyLinears` context): outside our own forward passes the model is untouched, so
transformers' `generate` in the benchmark runs with stock kernels on the very same model object.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

MAX_ROWS = 256  # measured up to 128 rows (prefill chunks larger than this keep F.linear)
MIN_WEIGHT_BYTES = 32 << 20  # below this the weights sit in cache and the stock kernel is as fast
SAMPLE_BYTES = 256 << 20  # the load-time check times this much of the weights, whatever the model's size


def padded_rows(rows: int) -> int:
    """The row count to multiply `rows` rows as: MKL's kernels for X^T work in blocks of columns, and a count
    that leaves a block part-full costs more than filling it with zero rows: over all linears of SmolLM2 in
    fp32, one row (GEMV) costs more than two, 3 rows more than 4, 7 more than 8, and 10-15 rows up to twice
    what 16 do (docs/design-notes.md, "The few-row kernel"). Hence 1 -> 2, 3 -> 4, 7 -> 8, and beyond 8 the
    next multiple of 8 (5 and 6 are cheaper than 8 and stay)."""
    if rows > 8:
        return -(-rows // 8) * 8
    return {1: 2, 3: 4, 7: 8}.get(rows, rows)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  min_rows: int = 1) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in], weight [out, in] -> [..., out], as (W @ X^T)^T from `min_rows`
    rows to MAX_ROWS (F.linear outside them)."""
    rows = x.numel() // x.shape[-1]
    if rows > MAX_ROWS or rows < min_rows:  # min_rows >= 1: no rows, nothing to gain
        return nn.functional.linear(x, weight, bias)
    # [r, in], row-major: the (W @ X^T)^T output below is column-major, elementwise ops keep that layout, and a
    # column-major X here would make X^T row-major, which MKL multiplies ~4x slower (measured, 2-8 rows)
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    padded = padded_rows(rows)
    if padded > rows:  # zero rows fill MKL's column block (one row alone would take the slow GEMV path)
        flat = torch.cat([flat, flat.new_zeros(padded - rows, x.shape[-1])])
    out = (weight @ flat.t()).t()[:rows]  # [r, out]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def sample_weights(weights: list[torch.Tensor], budget: int = SAMPLE_BYTES) -> list[torch.Tensor]:
    """The model's first weights in order, up to `budget` bytes (at least one weight):
    more than any CPU cache, so the timing is of reading memory, yet the check costs ~1 s on a 1.5B model too
    (all of its 6 GB of fp32 weights took ~1 min)."""
    taken, size = [], 0
    for weight in weights:
        nbytes = weight.numel() * weight.element_size()
        if taken and size + nbytes > budget:
            break
        taken.append(weight)
        size += nbytes
    return taken


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


class SkinnyLinears:
    """Context manager: inside it, every nn.Linear of `model` computes with skinny_linear from `min_rows` rows
    (helps). Re-entrant use is not needed (one forward at a time per model), so entering twice is an error rather
    than a silent no-op."""

    def __init__(self, model: nn.Module, min_rows: int = 1):
        self.min_rows = min_rows
        self._forwards: list[tuple[nn.Linear, Callable]] = [
            (module, lambda x, m=module: skinny_linear(x, m.weight, m.bias, min_rows)) for module in _linears(model)
        ]
        self._active = False

    def __enter__(self) -> SkinnyLinears:
        if self._active:
            raise RuntimeError("SkinnyLinears entered twice")
        for module, forward in self._forwards:
            module.__dict__["forward"] = forward  # instance attribute shadows nn.Linear.forward
        self._active = True
        return self

    def __exit__(self, *exc) -> None:
        for module, _ in self._forwards:
            module.__dict__.pop("forward", None)
        self._active = False


def _sweep_ms(weights: list[torch.Tensor], row_counts: tuple[int, ...], fns: tuple[Callable, ...], rounds: int = 3,
              warmup: int = 2) -> dict[tuple[int, int], float]:
    """Fastest sweep over all weights for each (row count, fn index), in ms. Everything takes turns round by
    round, so a burst of load elsewhere hits all alike, and the minimum keeps each one's quietest round. The
    first rounds of a fresh process run slow (measured: 8-row sweeps at ~2x for the first ~0.5 s), hence
    warm-up rounds over everything before timing."""
    inputs = {(rows, w.shape[1]): torch.randn(rows, w.shape[1], dtype=w.dtype) for rows in row_counts for w in weights}
    best = {(rows, i): float("inf") for rows in row_counts for i in range(len(fns))}
    for round_ in range(warmup + rounds):
        for rows, i in best:
            start = time.perf_counter()
            for w in weights:
                fns[i](inputs[rows, w.shape[1]], w, None)
            if round_ >= warmup:
                best[rows, i] = min(best[rows, i], time.perf_counter() - start)
    return {key: seconds * 1e3 for key, seconds in best.items()}


@torch.inference_mode()
def helps(model: nn.Module) -> int | None:
    """The fewest rows from which skinny_linear beats F.linear on this machine for this model's weights (CPU
    only), or None: it does not. Times one sweep over all linear weights at 1 and 8 rows each way, interleaved,
    fastest of 3 rounds after 2 of warm-up (over at most SAMPLE_BYTES of weights: ~1 s).
      1: skinny wins at one row (every plain step and every paused step) by >= 10% and does not lose at 8 rows
         (a verify pass) by more than 25%. The 8-row sweeps of both kernels are close and noisy with SmolLM2
         (either ahead by up to 15% from one round to the next), while one row is 1.5-2x apart; the former test
         on the sum of both with a 10% margin let that noise refuse the kernel in some fresh processes (a
         one-token pass then costs ~1.5x).
      2: one row is a draw but skinny wins at 8 rows by >= 25%: weights too large for one row to gain (the
         Qwen 1.5B in fp32, where skinny is more than twice as fast at 8 rows). Deciding on one row alone left
         a 2-token pass at twice a one-token pass in some processes, and the draft model then never drafted
         (its budget prices that row). Figures: docs/design-notes.md, "The few-row kernel"."""
    weights = [m.weight for m in _linears(model)]
    if not weights or weights[0].device.type != "cpu":
        return None
    if sum(w.numel() * w.element_size() for w in weights) < MIN_WEIGHT_BYTES:
        return None
    best = _sweep_ms(sample_weights(weights), (1, 8), (nn.functional.linear, skinny_linear))
    if best[1, 1] < 0.9 * best[1, 0] and best[8, 1] < 1.25 * best[8, 0]:
        return 1
    return 2 if best[8, 1] < 0.75 * best[8, 0] else None
