"""What drafters share beyond the Protocol (core/drafting.py): the registry's entry, defaults for drafters
without per-sequence state, and rows of a drafter's own cache handed out per sequence."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specdecode.core.drafting import Capabilities, Drafter, SequenceContext


@dataclass(frozen=True)
class DrafterSpec:
    """Registry entry: how to build a drafter from the target and its config."""

    name: str
    build: Callable[..., Drafter]  # build(target, DrafterConfig, SpecConfig) -> Drafter
    help: str
    needs_draft_model: bool = False
    # drafters with trained weights (heads): build one with random weights for any target (tests, tiny models);
    # untrained(target, SpecConfig) -> Drafter. Losslessness must hold whatever the weights.
    untrained: Callable[..., Drafter] | None = None


@dataclass
class RowPool:
    """Rows of a drafter's own cache, one per live sequence: reused after `give`, a new one when none is free."""

    rows: int = 0
    free: list[int] = field(default_factory=list)

    def take(self) -> int:
        """A free row, else a new one."""
        self.grow()
        return self.free.pop()

    def give(self, row: int) -> None:
        self.free.append(row)

    def grow(self) -> None:
        """A new free row, when none is free (a drafter that picks among the free rows itself calls this first)."""
        if not self.free:
            self.free.append(self.rows)
            self.rows += 1


class BaseDrafter:
    """Defaults for drafters that keep no per-sequence state or need no feedback."""

    name = "base"
    capabilities = Capabilities()

    def start(self, seq: SequenceContext) -> None:
        pass

    def max_nodes(self, k: int) -> int:
        return k

    def forget_prefixes(self) -> None:
        pass

    def kv_bytes_per_slot(self) -> int:
        return 0

    def parked_bytes(self) -> int:
        return 0

    def evict_parked(self) -> bool:
        return False

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        pass

    def observe_aux(self, seq: SequenceContext, logits: torch.Tensor) -> None:
        pass

    def finish(self, seq: SequenceContext) -> None:
        seq.state = None


class RowStateDrafter(BaseDrafter):
    """A drafter with a cache of its own: each live sequence holds one row of it (from a RowPool) in its state,
    an instance of `state_type` built from that row; the row is given back when the sequence finishes."""

    state_type: Callable[[int], Any]

    def __init__(self) -> None:
        self._pool = RowPool()

    def start(self, seq: SequenceContext) -> None:
        seq.state = self.state_type(self._pool.take())

    def finish(self, seq: SequenceContext) -> None:
        if seq.state is not None:
            self._pool.give(seq.state.row)
        seq.state = None
