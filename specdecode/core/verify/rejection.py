"""Speculative (rejection) sampling, one proposal at a time (Leviathan et al. 2023; Chen et al. 2023).

For a proposal x drawn from q, accept with probability min(1, p(x) / q(x)); on rejection the next draw comes
from the residual norm(max(0, p - q)). A deterministic proposal is a draw from the one-hot q = e_x: accept with
probability p(x), residual = p with x removed, renormalised. Either way the emitted token is distributed as p.
"""
from __future__ import annotations

import torch


def accept_probability(p: torch.Tensor, q: torch.Tensor | None, token: int) -> float:
    """p, q: [vocab]. q None = one-hot at token."""
    target = float(p[token])
    if q is None:
        return min(1.0, target)
    proposal = float(q[token])
    if proposal <= 0.0:  # cannot have been drawn from q; treat as never acceptable unless p covers it fully
        return 0.0
    return min(1.0, target / proposal)


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """The distribution to draw from after rejecting `token`: norm(max(0, p - q)). p, q: [vocab] -> [vocab]."""
    if q is None:
        rest = p.clone()
        rest[token] = 0.0
    else:
        rest = torch.clamp(p - q, min=0.0)
    total = float(rest.sum())
    if total <= 1e-12:  # only reachable through rounding: nothing left to correct
        return p
    return rest / total
