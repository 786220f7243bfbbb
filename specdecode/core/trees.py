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
    [[1,0,0],[1,1,0],[0,0,1]]. Built as Python lists, one tensor at the end (it runs every decoding step)."""
    n = len(parents)
    rows: list[list[bool]] = []
    for node, parent in enumerate(parents):
        row = rows[parent].copy() if parent >= 0 else [False] * n
        row[node] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, n)


@dataclass(frozen=True)
class Block:
    """One batch's new tokens, laid out for a forward pass.

    input_ids:  [b, q] root (pending token) then draft nodes, padded.
    positions:  [b, q] position ids (prefix length + depth).
    slots:      [b, q] cache slots written (prefix length + index in block).
    mask:       [b, 1, q, kv_len] bool: prefix slots plus ancestors-or-self inside the block.
    kv_len:     slots read by attention.
    lengths:    row b's real tokens, the first lengths[b] of its q (the rest is padding); None: all q.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor
    kv_len: int
    uniform_start: int | None  # every row writes slots [start, start + q) (fast cache path), else None
    lengths: tuple[int, ...] | None = None


def build_block(
    prefix_lens: list[int], block_tokens: list[list[int]], block_parents: list[list[int]], pad_id: int, device
) -> Block:
    """prefix_lens[b]: cached slots of row b; block_tokens[b]/block_parents[b]: its block (index 0 is the root,
    whose parent is -1; other parents index into the block). Rows are padded to the longest block; a pad
    token sees only the prefix and itself, and its output is ignored."""
    batch = len(prefix_lens)
    q = max(len(tokens) for tokens in block_tokens)
    kv_len = max(prefix_lens) + q
    ids, positions, slots = [], [], []
    mask = torch.zeros((batch, 1, q, kv_len), dtype=torch.bool)
    for b, (prefix, tokens, parents) in enumerate(zip(prefix_lens, block_tokens, block_parents)):
        n = len(tokens)
        full_parents = list(parents) + [-1] * (q - n)  # pads hang off nothing
        ids.append([*tokens, *[pad_id] * (q - n)])
        positions.append([prefix + depth - 1 for depth in depths_of(full_parents)])
        slots.append(list(range(prefix, prefix + q)))
        mask[b, 0, :, :prefix] = True
        mask[b, 0, :, prefix : prefix + q] = ancestor_matrix(full_parents)
    input_ids = torch.tensor(ids, dtype=torch.long)
    position_ids = torch.tensor(positions, dtype=torch.long)
    slot_ids = torch.tensor(slots, dtype=torch.long)
    same_start = all(p == prefix_lens[0] for p in prefix_lens)
    return Block(
        input_ids.to(device), position_ids.to(device), slot_ids, mask.to(device), kv_len,
        prefix_lens[0] if same_start else None, tuple(len(tokens) for tokens in block_tokens),
    )


@dataclass(frozen=True)
class StaticTree:
    """A static draft tree compiled once from Medusa-style paths (Cai et al. 2024, `medusa_choices`).

    A path lists, per depth, which candidate of that depth's ranking to take: [0] is the top candidate at
    depth 1, [0, 1] the second candidate at depth 2 under it, [1] the second candidate at depth 1.
    Nodes are ordered by depth, then lexicographically, so a parent always precedes its children.

    paths:   node i's path.
    parents: node i's parent index, -1 for a child of the root.
    depths:  1 for a child of the root.
    ranks:   paths[i][-1]: which candidate of depth depths[i] node i takes.
    top_k:   per depth d (index d - 1), how many candidates that depth must rank (max rank + 1).
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    top_k: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return len(self.top_k)

    def mask(self) -> torch.Tensor:
        """[n + 1, n + 1] bool attention inside a verification block whose index 0 is the root."""
        return ancestor_matrix([-1, *(p + 1 for p in self.parents)])

    def position_offsets(self) -> torch.Tensor:
        """[n + 1] position of each block entry relative to the root (root 0, a node its depth)."""
        return torch.tensor([0, *self.depths], dtype=torch.long)

    def truncated(self, depth: int) -> StaticTree:
        """The same tree without nodes deeper than `depth` (for a speculation-length cap)."""
        if depth >= self.max_depth:
            return self
        return compile_paths([p for p in self.paths if len(p) <= depth]) if depth > 0 else compile_paths([])


def compile_paths(paths) -> StaticTree:
    """Paths (lists of non-negative ints) -> StaticTree. Every proper prefix of a path must be a path too.

    Example: [[0], [1], [0, 0]] -> parents (-1, -1, 0), depths (1, 1, 2), ranks (0, 1, 0), top_k (2, 1).
    """
    ordered: list[tuple[int, ...]] = []
    for path in paths:
        path = tuple(path)
        if not path or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in path):
            raise ValueError(f"a tree path must be a non-empty list of non-negative ints, got {list(path)}")
        ordered.append(path)
    if len(set(ordered)) != len(ordered):
        raise ValueError("tree paths contain duplicates")
    ordered.sort(key=lambda p: (len(p), p))
    index = {path: i for i, path in enumerate(ordered)}
    parents: list[int] = []
    for path in ordered:
        if len(path) > 1 and path[:-1] not in index:
            raise ValueError(f"tree path {list(path)} has no parent path {list(path[:-1])}")
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
    depth = max((len(p) for p in ordered), default=0)
    top_k = tuple(max(p[d] for p in ordered if len(p) > d) + 1 for d in range(depth))
    return StaticTree(tuple(ordered), tuple(parents), tuple(len(p) for p in ordered),
                      tuple(p[-1] for p in ordered), top_k)


def pad_block(block: Block, q_to: int, kv_len: int, pad_id: int) -> Block:
    """Pad a block to q_to queries and a kv_len-wide mask. Pad queries write the slots right after the real
    ones (never committed, masked for everyone else) and see only themselves."""
    b, q = block.input_ids.shape
    extra = q_to - q
    device = block.input_ids.device
    slots = block.slots.to(device, copy=True)  # always a fresh tensor: made under the caller's inference mode
    # like every other padded tensor (a compiled step guards on that; a mix recompiled in the first request)
    if extra:
        tail = slots[:, -1:] + torch.arange(1, extra + 1, device=device)  # [b, extra]
        slots = torch.cat([slots, tail], dim=1)
    mask = torch.zeros((b, 1, q_to, kv_len), dtype=torch.bool, device=device)
    mask[:, :, :q, : block.kv_len] = block.mask
    if extra:
        rows = torch.arange(b, device=device)[:, None]
        queries = torch.arange(q, q_to, device=device)[None, :].expand(b, -1)
        mask[rows, 0, queries, slots[:, q:]] = True
    input_ids = torch.cat([block.input_ids, torch.full((b, extra), pad_id, dtype=torch.long, device=device)], 1)
    positions = torch.cat([block.positions, block.positions[:, -1:].expand(b, extra)], 1)
    return Block(input_ids, positions, slots, mask, kv_len, None)
