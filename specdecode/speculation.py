"""Speculation length policies: how many tokens to draft next step, per sequence."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import SpecConfig

MAX_BACKOFF = 16  # the longest pause is 16 x pause_steps


@dataclass
class SpeculationLength:
    """Fixed K, or adaptive: after a step whose whole draft passed, K grows by 2 (up to max_k); after a step
    that rejected a token, it shrinks by 1 (down to min_k). Same heuristic as transformers' assisted
    generation, so K follows the recent acceptance run length.

    Either way, speculation pauses while it does not pay (SpecConfig.pause_below): `k` reads 0 for a while
    after a window of drafting steps that accepted too little, then drafting resumes with a fresh window. The
    pause starts at pause_steps and doubles each time the retry fails too (up to MAX_BACKOFF times), and is
    back to pause_steps once a full window pays: a drafter that never pays (an early exit that was not trained
    for it) then costs a few probe windows per answer instead of one every pause_steps. The probes after a
    pause draft min_k tokens and grow back to K by 2 after each fully accepted draft, so a failing probe costs
    one cheap draft rather than K. Steps that proposed nothing (prompt lookup without a match) neither count
    nor cost."""

    config: SpecConfig
    base_k: int = 0
    paused: int = 0  # steps left without drafting
    backoff: int = 0  # length of the next pause
    recent: deque = field(default_factory=deque)  # accepted draft tokens of the last drafting steps

    def __post_init__(self) -> None:
        self.base_k = self.config.k
        self.backoff = self.config.pause_steps

    @property
    def k(self) -> int:
        return 0 if self.paused else self.base_k

    def update(self, drafted: int, accepted: int) -> None:
        if self.paused:
            self.paused -= 1
            if not self.paused:
                self.base_k = min(self.base_k, self.config.min_k)  # probe cheaply
            return
        if drafted == 0:
            return
        if self.config.adaptive:
            if accepted >= drafted:
                self.base_k = min(self.config.max_k, self.base_k + 2)
            else:
                self.base_k = max(self.config.min_k, self.base_k - 1)
        elif self.base_k < self.config.k and accepted >= drafted:  # a probe that passed: back towards K
            self.base_k = min(self.config.k, self.base_k + 2)
        if self.config.pause_below <= 0:
            return
        self.recent.append(accepted)
        if len(self.recent) > self.config.pause_window:
            self.recent.popleft()
        if len(self.recent) < self.config.pause_window:
            return
        if sum(self.recent) >= self.config.pause_below * len(self.recent):
            self.backoff = self.config.pause_steps  # it pays: the next pause (if any) starts short again
            return
        self.paused, self.recent = self.backoff, deque()
        self.backoff = min(2 * self.backoff, MAX_BACKOFF * self.config.pause_steps)
