"""`prompt-lookup`: model-free n-gram drafting (Saxena 2023). Find the most recent earlier occurrence of the
context's last n tokens (n from max_ngram down to min_ngram) and propose the tokens that followed it.

An index from n-gram to its latest end position is kept per sequence and extended as tokens are committed,
so a lookup costs O(max_ngram) instead of a scan of the context.

How many of the found tokens to propose depends on what a row of the verify pass costs (row_budget): all of
them on a GPU; on a CPU the depth that pays by how often tokens after a match of that length were accepted
in this sequence so far (a one-token match usually earns one token at most, a three-token match all k)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.ngram_index import NgramIndex
from specdecode.drafters.common.row_budget import DepthPolicy, RowCost, row_cost_for

# acceptance by depth (token j given token j-1) after a match of 1, 2, 3 tokens, measured with k = 8 on the
# default model's greedy answers to the first turns of 6 bench questions per category (48), replaying the index
PRIOR_RATES = {1: (0.2, 0.6, 0.68, 0.7), 2: (0.49, 0.57, 0.78, 0.74, 0.76), 3: (0.86, 0.81, 0.84, 0.86, 0.93)}


@dataclass
class _State:
    index: NgramIndex
    depths: DepthPolicy
    match: int = 0  # the match length of the draft in flight (0: none)
    drafted: int = 0


class PromptLookup(BaseDrafter):
    name = "prompt-lookup"
    capabilities = Capabilities(prices_rows=True, free_drafts=True)

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, row_cost: float | RowCost = 0.0):
        self.min_n, self.max_n = min_ngram, max_ngram
        # 0: rows are free, every match is drafted in full
        self._cost = row_cost if isinstance(row_cost, RowCost) else RowCost(configured=row_cost)

    @property
    def row_cost(self) -> float:
        return self._cost.value

    def start(self, seq: SequenceContext) -> None:
        priors = {n: PRIOR_RATES[min(n, 3)] for n in range(self.min_n, self.max_n + 1)}
        depths = DepthPolicy(priors, self._cost.planner(seq.sampling.seeded))
        seq.state = _State(NgramIndex(self.min_n, self.max_n), depths)

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        drafts = []
        for seq in seqs:
            state: _State = seq.state
            # n-grams whose continuation is known; the newest one (the lookup key) has none yet
            state.index.extend(seq.tokens)
            match, found = state.index.match(seq.tokens, seq.k) if seq.k > 0 else (0, [])
            depth = state.depths.depth(match, len(found)) if found else 0
            state.match, state.drafted = match, depth
            drafts.append(Draft.chain(found[:depth], free=True))
        return drafts

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        state: _State = seq.state
        if state.drafted:
            state.depths.add(state.match, state.drafted, accepted)


SPEC = DrafterSpec(
    "prompt-lookup",
    lambda target, config, spec: PromptLookup(config.min_ngram, config.max_ngram,
                                              row_cost_for(target, config.row_cost)),
    "n-gram match in prompt + generated text (model-free)",
)
