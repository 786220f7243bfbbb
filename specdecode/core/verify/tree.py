"""Lossless multi-candidate speculative sampling over a draft tree (SpecInfer / EAGLE style).

At each accepted node the children are tried in order against the target distribution p at that node; each
rejection replaces p by its residual, so siblings are tested against what is left. If no child is accepted
the target's token is drawn from the final residual; at a leaf it is a bonus draw from p. For siblings drawn
i.i.d. from q (or chosen deterministically, q one-hot) the emitted tokens follow the target distribution
exactly. A chain is the tree where every node has one child: plain speculative sampling.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.core.trees import children_of
from specdecode.core.verify.rejection import accept_probability, residual


@dataclass(frozen=True)
class Verdict:
    """accepted: draft node indices on the accepted path, root's child first. next_token: the target's own
    token after that path (the correction on rejection, the bonus at a leaf)."""

    accepted: tuple[int, ...]
    next_token: int


def verify_sampling(
    tokens: tuple[int, ...],
    parents: tuple[int, ...],
    q: torch.Tensor | None,  # [n, vocab] or None (deterministic proposals)
    p: torch.Tensor,  # [n + 1, vocab] target probabilities; row 0 at the root, row i + 1 after node i
    generator: torch.Generator | None,
) -> Verdict:
    """Example: tokens (5, 7), parents (-1, -1) (two siblings), q None, p[0] = {5: 0.5, 7: 0.5}: token 5 is
    accepted with probability 0.5; else p becomes {7: 1.0} and 7 is accepted surely."""
    children = children_of(parents)
    node, path = -1, []
    while True:
        dist = p[node + 1]
        accepted_child = None
        for child in children[node]:
            token = tokens[child]
            proposal = None if q is None else q[child]
            u = float(torch.rand((), generator=generator, device=dist.device))
            if u < accept_probability(dist, proposal, token):
                accepted_child = child
                break
            dist = residual(dist, proposal, token)
        if accepted_child is None:
            next_token = int(torch.multinomial(dist, 1, generator=generator).item())
            return Verdict(tuple(path), next_token)
        path.append(accepted_child)
        node = accepted_child
