"""What a benchmark asks of every method for one prompt (RunSettings) and what the method answers (Generation):
the values methods.py, llamacpp.py and runner.py pass between them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunSettings:
    """What every method is asked for one prompt: the same budget, temperature and seed."""

    max_new_tokens: int
    temperature: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One method's answer to one prompt. ids: new tokens, ending at (and including) the first EOS."""

    ids: list[int]
    seconds: float
    passes: int | None = None  # target passes that produced tokens (prefill folded in, not counted apart)
    proposed: int | None = None  # draft tokens offered for verification
    accepted: int | None = None  # draft tokens the target kept
    # seconds spent prefilling, drafting and verifying, by the engine's own timers (GenerationMetrics; the rest of
    # `seconds` is committing, detokenizing and the loop); None: the method has no such timers
    phases: tuple[float, float, float] | None = None
    first_token_s: float | None = None  # the engine's seconds to the first token (GenerationMetrics); None: untimed
