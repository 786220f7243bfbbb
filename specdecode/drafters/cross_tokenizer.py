"""Cross-tokenizer drafting: a draft model whose tokenizer differs from the target's drafts *text*, which is
re-tokenised into target ids and verified as an ordinary chain (reached by `--drafter draft-model` when the
tokenizers differ).

Each step: committed target ids -> text -> draft ids (the draft's cache keeps the longest common prefix with
what it saw last step) -> the draft model decodes greedily, one draft token at a time, until its new text
re-tokenises into k target ids (or it stops: EOS, or top probability below `confidence`). The k-th id may be a
word the draft had not finished; verifying it costs next to nothing, and drafting one more token only to
prove it complete would cost a draft forward per step, the dominant cost here.

Lossless for sampling too: the draft is a function of the context and the drafter's own choices, independent
of the verifier's coins, so it is verified as deterministic proposals (q = None: accept x with probability
p(x), otherwise draw from p with x removed). That keeps the target distribution exact whatever the draft
model is; the price is lower acceptance than min(1, p/q) would give for a well-calibrated q.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdecode.core.drafting import Draft, SequenceContext
from specdecode.core.target import Target
from specdecode.drafters.common.base import RowStateDrafter
from specdecode.drafters.common.model_step import feed_chain
from specdecode.drafters.common.text_bridge import appended_text, committed_text, continuation_ids, encode
from specdecode.errors import ConfigError


@dataclass
class _State:
    row: int
    cached: list[int] = field(default_factory=list)  # draft ids whose KV the draft cache row holds


class CrossTokenizerDrafter(RowStateDrafter):
    name = "draft-model"  # the registry entry that reaches it
    state_type = _State

    def __init__(self, draft: Target, target: Target, confidence: float = 0.0, max_draft_steps: int = 0):
        if draft.tokenizer is None or target.tokenizer is None:
            raise ConfigError("cross-tokenizer drafting needs the tokenizers of both the draft and the target model")
        self.draft, self.target, self.confidence = draft, target, confidence
        self.max_draft_steps = max_draft_steps  # draft tokens per step; 0 = 2k
        self.cache = draft.new_cache(rows=1, capacity=256)
        super().__init__()

    # -- per-sequence state -------------------------------------------------------------------------------

    # -- drafting -------------------------------------------------------------------------------------------
    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        return [self._draft_one(seq) for seq in seqs]

    def _draft_one(self, seq: SequenceContext) -> Draft:
        if seq.k <= 0:
            return Draft()
        text = committed_text(self.target.tokenizer, seq.tokens)
        if text is None:  # the committed ids end inside a character: let the target finish it first
            return Draft()
        context = encode(self.draft.tokenizer, text, special=True)
        if not context:
            return Draft()
        state: _State = seq.state
        logits = self._sync(state, context)
        new: list[int] = []
        target_ids: list[int] = []
        for _ in range(self.max_draft_steps or 2 * seq.k):
            probs = logits.float().softmax(-1)  # [draft_vocab]
            top, token = probs.max(-1)
            if (self.confidence and float(top) < self.confidence) or int(token) in self.draft.eos_ids:
                break
            new.append(int(token))
            piece = appended_text(self.draft.tokenizer, context, new)
            target_ids = continuation_ids(self.target.tokenizer, seq.tokens, piece)
            if len(target_ids) >= seq.k:
                break
            logits = self._feed(state, [int(token)])
        return Draft.chain(target_ids[: seq.k])

    def _sync(self, state: _State, context: list[int]) -> torch.Tensor:
        """Make the draft cache hold `context` (keeping its common prefix with what it holds; the last id is
        always fed) -> logits [draft_vocab] after it."""
        keep, limit = 0, min(len(state.cached), len(context) - 1)
        while keep < limit and state.cached[keep] == context[keep]:
            keep += 1
        del state.cached[keep:]
        return self._feed(state, context[keep:])

    def _feed(self, state: _State, ids: list[int]) -> torch.Tensor:
        """Append `ids` after the cached ones -> logits [draft_vocab] after the last of them."""
        return feed_chain(self.draft, self.cache, state.row, self._pool.rows, state.cached, ids)
