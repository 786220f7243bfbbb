"""A sequence's decoding state, and the typed values the loop hands back: what one step did to a sequence
(StepOutcome) and a finished generation (Result)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from specdecode.config import GenerationConfig
from specdecode.core.detok import StopText
from specdecode.core.drafting import SequenceContext
from specdecode.core.logprobs import TokenLogprob
from specdecode.core.metrics import GenerationMetrics
from specdecode.core.speculation import SpeculationLength
from specdecode.core.structured import Constraint


@dataclass
class Sequence:
    """One request's decoding state."""

    ctx: SequenceContext
    generation: GenerationConfig
    length: SpeculationLength
    metrics: GenerationMetrics
    prompt_len: int
    finish_reason: str | None = None  # "eos" | "length" | "stop" | "abort" | "error"
    prefilled: int = 0  # prompt tokens whose KV is cached (the prompt's last token is the first step's root)
    ready: bool = False  # prefill done and the drafter started: `step` may run it
    drafted: bool = False  # a step has asked the drafter for a draft (the first such step reads the prompt)
    prefill_hidden: list[torch.Tensor] = field(default_factory=list, repr=False)  # per chunk, [q, hidden]
    # prompt tokens 1.. with their logprobs, chunk by chunk (GenerationConfig.prompt_logprobs)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)
    text: StopText | None = field(default=None, repr=False)  # detokeniser and stop strings (None: ids only)
    constraint: Constraint | None = field(default=None, repr=False)  # the grammar state (structured outputs)
    ends: frozenset[int] = frozenset()  # tokens that end the output, kept: EOS unless ignored, and the stop tokens

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stop_reason(self) -> str | int | None:
        """What ended the output, as vLLM reports it: the stop string, or the stop token (one of stop_token_ids);
        None for EOS, the length budget and a finished grammar."""
        if self.finish_reason == "stop" and self.text is not None and self.text.matched is not None:
            return self.text.matched
        if self.finish_reason == "eos" and self.output_ids and self.output_ids[-1] in self.generation.stop_token_ids:
            return self.output_ids[-1]
        return None

    @property
    def prefilling(self) -> bool:
        return not self.ready

    @property
    def output_ids(self) -> list[int]:
        return self.ctx.tokens[self.prompt_len :]


@dataclass(frozen=True)
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: GenerationMetrics
    logprobs: tuple[TokenLogprob, ...] | None = None  # per token (GenerationConfig.logprobs), else None


# where a committed token came from: an accepted draft token (the drafter's, or "grammar": forced by the request's
# structure), or the target's own token: "bonus" after a draft path accepted to its end, "correction" in place of
# a refused draft token, "target" where nothing was drafted
Origin = Literal["draft", "grammar", "bonus", "correction", "target"]


@dataclass(frozen=True)
class StepOutcome:
    """What one step did to one sequence. Callers (the server's scheduler, `stream`) read this instead of
    diffing the sequence's metrics."""

    token_ids: list[int]  # committed this step, cut at a stop (EOS kept, stop string's tokens kept)
    text: str  # the text they completed, cut before a stop string ("" without a tokenizer or detokenize)
    k: int  # the speculation length the step asked the drafter for
    depth: int  # the draft's depth (0: plain decoding)
    accepted: int  # draft tokens accepted
    draft_s: float  # this step's drafting time (the batch's, shared by its rows)
    verify_s: float  # this step's target pass, verification and commit
    finish_reason: str | None = None  # set when this step finished the sequence
    error: Exception | None = None  # committing this row failed (finish_reason "error"); the other rows are fine
    forced: int = 0  # of the accepted draft tokens, those the grammar forced (structured outputs)
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token (GenerationConfig.logprobs), else None
    origins: tuple[Origin, ...] = ()  # one per token: where it came from
    free: bool = False  # the drafter's draft cost no draft pass (Draft.free)


@dataclass(frozen=True)
class Committed:
    """What `_commit` did to one row (the step turns it into a StepOutcome)."""

    tokens: list[int]
    text: str
    forced: int  # accepted draft tokens that the grammar forced
    logprobs: tuple[TokenLogprob, ...] | None
    error: Exception | None = None
    origins: tuple[Origin, ...] = ()  # one per token
