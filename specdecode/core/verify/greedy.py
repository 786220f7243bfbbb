"""Greedy verification: accept the longest draft path that equals the target's argmax at every step."""
from __future__ import annotations

from specdecode.core.trees import children_of
from specdecode.core.verify.tree import Verdict


def verify_greedy(tokens: tuple[int, ...], parents: tuple[int, ...], target_argmax: list[int]) -> Verdict:
    """target_argmax[0]: the target's choice after the root (pending token); target_argmax[i + 1]: after node i.

    Example (chain): tokens (4, 9, 2), parents (-1, 0, 1), target_argmax [4, 9, 7, 3] -> accepted (0, 1),
    next_token 7 (node 2 proposed 2, the target wanted 7).
    """
    children = children_of(parents)
    node, path = -1, []
    while True:
        wanted = target_argmax[node + 1]
        match = next((child for child in children[node] if tokens[child] == wanted), None)
        if match is None:
            return Verdict(tuple(path), wanted)
        path.append(match)
        node = match
