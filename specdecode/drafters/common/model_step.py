"""Shared by the model-based drafters: turn one step of draft logits into a token, its q row and a confidence."""
from __future__ import annotations

import torch

from specdecode.config import SamplingConfig
from specdecode.core.sampling import greedy_tokens, probabilities, sample
from specdecode.core.target import Target
from specdecode.core.trees import build_block


def choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator, vocab: int,
           confidence: bool = True) -> tuple[int, torch.Tensor | None, float]:
    """logits: [draft_vocab] -> (token, q [vocab] or None when greedy, top probability).

    Only the first `vocab` (target) columns are used, so q is the distribution actually sampled from.
    confidence False: a greedy draft's top probability is not needed (returned as 1.0), so no softmax over the
    vocabulary is taken (a noticeable share of a draft token's time with a 151,936-token head: docs/drafters.md,
    "draft-model")."""
    logits = logits[:vocab]
    if sampling.greedy:
        if not confidence:
            return int(greedy_tokens(logits)), None, 1.0
        probs = logits.float().softmax(-1)
        top, token = probs.max(-1)
        return int(token), None, float(top)
    q = probabilities(logits, sampling)
    return sample(q, generator), q, float(q.max())


def feed_chain(draft: Target, cache, row: int, rows: int, cached: list[int], ids: list[int]) -> torch.Tensor:
    """Append `ids` after the `cached` tokens of a draft model's cache row (cached is extended in place);
    returns the logits [draft_vocab] after the last of them. rows: rows the cache must hold."""
    start = len(cached)
    cache.ensure(max(rows, 1), start + len(ids) + 1)
    block = build_block([start], [ids], [list(range(-1, len(ids) - 1))], draft.pad_id, draft.device)
    out = draft.forward(cache, [row], block, keep="last")
    cached.extend(ids)
    return out.logits[0, -1]
