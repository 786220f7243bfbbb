"""Speculation length policies: how many tokens to draft next step, per sequence."""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from specdecode.config import SpecConfig

MAX_BACKOFF = 16  # the longest pause is 16 x pause_steps
PLAIN_SAMPLES = 4  # timed plain steps the time rule needs before it judges a window (their median is the cost)


class DraftStep(NamedTuple):
    """One drafting step as the pause rules see it."""

    accepted: int  # draft tokens accepted
    seconds: float | None  # the step's wall time (None: not timed)
    committed: int  # tokens committed (accepted + the target's own, fewer at a stop)


@dataclass
class SpeculationLength:
    """Fixed K, or adaptive: after a step whose whole draft passed, K grows by 2 (up to max_k); after a step
    that rejected a token, it shrinks by 1 (down to min_k). Same heuristic as transformers' assisted
    generation, so K follows the recent acceptance run length.

    Either way, speculation pauses while it does not pay: `k` reads 0 for a while (plain decoding through the
    same loop) after a full window of drafting steps (SpecConfig.pause_window) that
      * accepted too little: fewer than pause_below draft tokens per step (acceptance rule), or
      * cost more wall time per committed token than this sequence's plain steps, by more than
        pause_time_margin (time rule, SpecConfig.pause_on_time): drafting + a wider verify pass can cost more
        than the tokens they add, even when drafts are accepted.
    The pause starts at pause_steps and doubles each time the retry fails too (up to MAX_BACKOFF times), and is
    back to pause_steps once a full window pays: a drafter that never pays (an early exit that was not trained
    for it) then costs a few probe windows per answer instead of one every pause_steps. The probes after a
    pause draft min_k tokens and grow back to K by 2 after each fully accepted draft, so a failing probe costs
    one cheap draft rather than K. While the window slides on after it paid, every drafting step re-judges it.

    Costs (time rule): a drafting step costs its whole wall time (drafting, verify pass, commit; a sequence's
    first drafting step, where the drafter reads the prompt, is passed untimed by the engine), charged to the window of
    the last pause_window drafting steps: sum of seconds / sum of committed tokens. A plain step is one that
    drafted nothing: a pause step, or a step where the drafter found nothing to propose (prompt
    lookup without a match). The plain cost is the median seconds per token of the last pause_window (at least
    PLAIN_SAMPLES) plain steps: a median, so one slow step (a hiccup, or a model drafter that ran and then
    proposed nothing) does not move it. The engine starts a sequence with the plain steps its previous sequence
    timed (`plain`): a one-token pass costs about the same from one request to the next, and measuring it
    anew cost every request a few plain steps. When a window completes before PLAIN_SAMPLES plain steps were timed,
    the sequence decodes plainly for the missing few steps (a measuring pause: no back-off, K kept), then
    judges that same window by time. Steps that proposed nothing never count in the drafting window. Steps
    passed without a time (seconds=None) are left out of the time rule; a window holding one is judged by
    acceptance only.

    Example (pause_window 8, margin 0.05): plain steps cost 30 ms per token; a window of 8 drafting steps took
    8 x 60 ms and committed 14 tokens: 34 ms per token > 31.5 ms, so the sequence pauses for pause_steps
    steps although it accepted 6 draft tokens (0.75 per step, enough for the acceptance rule)."""

    config: SpecConfig
    base_k: int = 0
    paused: int = 0  # steps left without drafting
    backoff: int = 0  # length of the next pause
    measuring: bool = False  # the current pause times plain steps for the time rule; the window awaits judgment
    reason: str = ""  # the rule behind the current pause: "acceptance", "time" ("measuring": timing plain steps)
    recent: deque = field(default_factory=deque)  # DraftStep of the last drafting steps
    plain: deque = field(default_factory=deque)  # seconds per token of the last timed plain steps

    def __post_init__(self) -> None:
        self.base_k = self.config.k
        self.backoff = self.config.pause_steps

    @property
    def k(self) -> int:
        return 0 if self.paused else self.base_k

    def update(self, drafted: int, accepted: int, seconds: float | None = None, committed: int = 1) -> None:
        """One step of this sequence: the depth of its draft, the draft tokens accepted, the step's wall time in
        seconds (every sequence of a batched step gets the step's time; None: not timed) and the tokens it
        committed."""
        if drafted == 0 and seconds is not None and committed > 0:
            self.plain.append(seconds / committed)
            if len(self.plain) > max(PLAIN_SAMPLES, self.config.pause_window):
                self.plain.popleft()
        if self.paused:
            self.paused -= 1
            if not self.paused:
                self._resume()
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
        if self.config.pause_below <= 0 and not self.config.pause_on_time:
            return
        self.recent.append(DraftStep(accepted, seconds, committed))
        if len(self.recent) > self.config.pause_window:
            self.recent.popleft()
        if len(self.recent) < self.config.pause_window:
            return
        kept = sum(step.accepted for step in self.recent)
        if self.config.pause_below > 0 and kept < self.config.pause_below * len(self.recent):
            self._pause("acceptance")
            return
        if self._timed() and len(self.plain) < PLAIN_SAMPLES:
            self.paused, self.measuring, self.reason = PLAIN_SAMPLES - len(self.plain), True, "measuring"
            return
        if self._timed() and self._costs_more():
            self._pause("time")
            return
        self.backoff = self.config.pause_steps  # it pays: the next pause (if any) starts short again

    def draft_cost(self) -> float:
        """Seconds per committed token over the drafting window."""
        return sum(s.seconds for s in self.recent) / max(1, sum(s.committed for s in self.recent))

    def plain_cost(self) -> float:
        """Median seconds per token of the last timed plain steps."""
        return statistics.median(self.plain)

    def _costs_more(self) -> bool:
        return self.draft_cost() > self.plain_cost() * (1 + self.config.pause_time_margin)

    def _timed(self) -> bool:
        return self.config.pause_on_time and all(s.seconds is not None for s in self.recent)

    def _pause(self, reason: str) -> None:
        self.paused, self.recent, self.measuring, self.reason = self.backoff, deque(), False, reason
        self.backoff = min(2 * self.backoff, MAX_BACKOFF * self.config.pause_steps)

    def _resume(self) -> None:
        if not self.measuring:
            self.base_k = min(self.base_k, self.config.min_k)  # probe cheaply
            return
        self.measuring = False  # the plain cost is known now: judge the window that asked for it
        if self.plain and self._costs_more():
            self._pause("time")
        else:
            self.backoff = self.config.pause_steps
