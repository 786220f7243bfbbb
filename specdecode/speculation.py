"""Speculation length policies: how many tokens to draft next step, per sequence."""
from __future__ import annotations

from dataclasses import dataclass

from .config import SpecConfig


@dataclass
class SpeculationLength:
    """Fixed K, or adaptive: after a step whose whole draft passed, K grows by 2 (up to max_k); after a step
    that rejected a token, it shrinks by 1 (down to min_k). Same heuristic as transformers' assisted
    generation, so K follows the recent acceptance run length."""

    config: SpecConfig
    k: int = 0

    def __post_init__(self) -> None:
        self.k = self.config.k

    def update(self, drafted: int, accepted: int) -> None:
        if not self.config.adaptive or drafted == 0:
            return
        if accepted >= drafted:
            self.k = min(self.config.max_k, self.k + 2)
        else:
            self.k = max(self.config.min_k, self.k - 1)
