"""Per-generation metrics. Conventions (as in vLLM's spec-decode metrics):

- new_tokens counts every committed token, the target's own included.
- target_passes counts verification passes (the prefill pass is timed apart and not counted).
- tau = new_tokens / target_passes: mean tokens per target pass, counting the target's token, so plain
  decoding has tau = 1 and a draft whose K tokens all pass gives K + 1.
- acceptance_rate = accepted draft tokens / proposed draft depth: for a chain, accepted / K; for a tree the
  depth of its longest path stands for K (nodes on rejected sibling branches are not "proposals" of a step).
- acceptance_by_position[i] = P(depth i + 1 accepted | the draft reached depth i + 1).
- forced counts the accepted draft tokens that a structure's grammar forced (they are in `accepted` too).
- paused_steps counts steps that drafted nothing because speculation did not pay (speculation.py's pause), by
  the rule that paused it ("acceptance", "time"); row_cost is what one more verify row cost, in one-token passes,
  when the generation ended (pass_costs.RowCostEstimate): why a drafter on the CPU drafted as deep as it did.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationMetrics:
    new_tokens: int = 0
    target_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    first_token_s: float | None = None  # total_s when the first token was committed (prefill and first step)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, those whose KV an earlier request left in the row (not prefilled)
    forced: int = 0
    grammar_s: float = 0.0  # walking the grammar over drafts and masking the target's scores (in draft_s, verify_s)
    paused_steps: dict[str, int] = field(default_factory=dict)  # by the rule that paused speculation
    row_cost: float | None = None  # one more verify row, in one-token passes, at the end (None: not asked)

    def observe(self, depth: int, accepted: int, committed: int, forced: int = 0) -> None:
        """One verification pass: a draft of this depth, `accepted` draft tokens kept (`forced` of them the
        grammar's), `committed` added."""
        self.target_passes += 1
        self.forced += forced
        self.new_tokens += committed
        self.proposed += depth
        self.accepted += accepted
        while len(self.proposed_at) < depth:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for position in range(depth):
            self.proposed_at[position] += 1
            if position < accepted:
                self.accepted_at[position] += 1

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "target_passes": self.target_passes,
            "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
            "forced": self.forced,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "total_s": round(self.total_s, 4),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 4),
            "grammar_s": round(self.grammar_s, 4),
            "paused_steps": dict(self.paused_steps),
            "row_cost": None if self.row_cost is None else round(self.row_cost, 4),
        }
