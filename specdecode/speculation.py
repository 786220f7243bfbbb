"""Speculation length policies: how many tokens to draft next step, per sequence."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import SpecConfig


@dataclass
class SpeculationLength:
    """Fixed K, or adaptive: after a step whose whole draft passed, K grows by 2 (up to max_k); after a step
    that rejected a token, it shrinks by 1 (down to min_k). Same heuristic as transformers' assisted
    generation, so K follows the recent acceptance run length.

    Either way, speculation pauses while it does not pay (SpecConfig.pause_below): `k` reads 0 for
    pause_steps steps after a window of drafting steps that accepted too little, then drafting resumes with a
    fresh window. Steps that proposed nothing (prompt lookup without a match) neither count nor cost."""

    config: SpecConfig
    base_k: int = 0
    paused: int = 0  # steps left without drafting
    recent: deque = field(default_factory=deque)  # accepted draft tokens of the last drafting steps

    def __post_init__(self) -> None:
        self.base_k = self.config.k

    @property
    def k(self) -> int:
        return 0 if self.paused else self.base_k

    def update(self, drafted: int, accepted: int) -> None:
        if self.paused:
            self.paused -= 1
            return
        if drafted == 0:
            return
        if self.config.adaptive:
            if accepted >= drafted:
                self.base_k = min(self.config.max_k, self.base_k + 2)
            else:
                self.base_k = max(self.config.min_k, self.base_k - 1)
        if self.config.pause_below <= 0:
            return
        self.recent.append(accepted)
        if len(self.recent) > self.config.pause_window:
            self.recent.popleft()
        if len(self.recent) == self.config.pause_window and sum(self.recent) < self.config.pause_below * len(self.recent):
            self.paused, self.recent = self.config.pause_steps, deque()
