"""Trees are data: parent lists -> attention masks, depths and position ids for one verification pass."""
from __future__ import annotations

from dataclasses import dataclass

import torch


def children_of(parents: tuple[int, ...] | list[int]) -> dict[int, list[int]]:
    """parents [n] (-1 = root) -> {node: [children in order]}; the root is key -1."""
    children: dict[int, list[int]] = {-1: []}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
        children.setdefault(node, [])
    return children


def depths_of(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Depth of each node, the root's children at depth 1."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def ancestor_matrix(parents: tuple[int, ...] | list[int]) -> torch.Tensor:
    """[n, n] bool, [i, j] true when j is i or an ancestor of i. Example: parents (-1, 0, -1) ->
    [[1,0,0],[1,1,0],[0,0,1]]."""
    n = len(parents)
    visible = torch.zeros((n, n), dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            visible[node] = visible[parent]
        visible[node, node] = True
    return visible


@dataclass(frozen=True)
class Block:
    """One batch's new tokens, laid out for a forward pass.

    input_ids:  [b, q] root (pending token) then draft nodes, padded.
    positions:  [b, q] position ids (prefix length + depth).
    slots:      [b, q] cache slots written (prefix length + index in block).
    mask:       [b, 1, q, kv_len] bool: prefix slots plus ancestors-or-self inside the block.
    kv_len:     slots read by attention.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor
    kv_len: int
    uniform_start: int | None  # every row writes slots [start, start + q) (fast cache path), else None


def build_block(
    prefix_lens: list[int], block_tokens: list[list[int]], block_parents: list[list[int]], pad_id: int, device
) -> Block:
    """prefix_lens[b]: cached slots of row b; block_tokens[b]/block_parents[b]: its block (index 0 is the root,
    whose parent is -1; other parents index into the block). Rows are padded to the longest block; a pad
    token sees only the prefix and itself, and its output is ignored."""
    batch = len(prefix_lens)
    q = max(len(tokens) for tokens in block_tokens)
    kv_len = max(prefix_lens) + q
    input_ids = torch.full((batch, q), pad_id, dtype=torch.long)
    positions = torch.zeros((batch, q), dtype=torch.long)
    slots = torch.zeros((batch, q), dtype=torch.long)
    mask = torch.zeros((batch, 1, q, kv_len), dtype=torch.bool)
    for b, (prefix, tokens, parents) in enumerate(zip(prefix_lens, block_tokens, block_parents)):
        n = len(tokens)
        full_parents = list(parents) + [-1] * (q - n)  # pads hang off nothing
        input_ids[b, :n] = torch.tensor(tokens, dtype=torch.long)
        depth = depths_of(full_parents)
        positions[b] = prefix + torch.tensor(depth, dtype=torch.long) - 1
        slots[b] = prefix + torch.arange(q)
        mask[b, 0, :, :prefix] = True
        mask[b, 0, :, prefix : prefix + q] = ancestor_matrix(full_parents)
    same_start = all(p == prefix_lens[0] for p in prefix_lens)
    return Block(
        input_ids.to(device), positions.to(device), slots, mask.to(device), kv_len,
        prefix_lens[0] if same_start else None,
    )
