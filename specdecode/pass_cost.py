"""What one more token of a verify pass costs on this machine, measured on the model itself.

A drafter deciding how deep to draft needs this (drafters/row_budget.py); it is a property of the model and
the machine, so the Target measures it once, when first asked (Target.row_cost)."""
from __future__ import annotations

import time

import torch

from .trees import build_block


@torch.inference_mode()
def measure_row_cost(target, width: int = 8, rounds: int = 3) -> float:
    """Cost of one more row of a pass, in one-token passes: 0 off the CPU (a pass is flat there up to tens of
    tokens); on the CPU (t_width / t_1 - 1) / (width - 1) from passes over a scratch cache of 32 tokens,
    one-token and `width`-token passes taking turns, fastest of `rounds` after one warm-up round (~0.5 s for
    SmolLM2; 0.14 on the 2-core dev VM). A CPU whose BLAS handles few rows well gets a lower cost."""
    if target.device.type != "cpu":
        return 0.0
    cache = target.new_cache(rows=1, capacity=64)
    prefix = [i % target.vocab_size for i in range(1, 33)]
    target.forward(cache, [0], build_block([0], [prefix], [list(range(-1, 31))], target.pad_id, target.block_device),
                   keep="last")
    blocks = {w: build_block([32], [prefix[:w]], [list(range(-1, w - 1))], target.pad_id, target.block_device)
              for w in (1, width)}
    best = {w: float("inf") for w in blocks}
    for round_ in range(rounds + 1):
        for w, block in blocks.items():
            began = time.perf_counter()
            target.forward(cache, [0], block)
            if round_:
                best[w] = min(best[w], time.perf_counter() - began)
    return max(0.0, (best[width] / best[1] - 1) / (width - 1))
