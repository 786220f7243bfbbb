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
    return feed_rows(draft, cache, [row], rows, [cached], [ids])[0]


def feed_rows(draft: Target, cache, rows: list[int], pool_rows: int, cached: list[list[int]],
              ids: list[list[int]]) -> torch.Tensor:
    """feed_chain for several cache rows in ONE pass: row i appends ids[i] after its cached[i] (each extended in
    place); returns the logits [len(rows), draft_vocab] after each row's last id. A pass over four rows of the
    Qwen 0.5B draft costs 1.7 one-row passes on the 2-core CPU (14.8 against 8.8 ms), so rows drafted together
    cost far less than rows drafted one by one (docs/drafters.md, "draft-model"). Rows of different lengths
    share a pass only on the native decoder, which takes each row's own last position; elsewhere (transformers'
    forward, whose last position is the padded block's, and fixed-shape caches) they are fed one by one."""
    lengths = {len(row_ids) for row_ids in ids}
    if len(rows) > 1 and (cache.static or (len(lengths) > 1 and not draft.packed_decoder)):
        return torch.stack([feed_rows(draft, cache, [row], pool_rows, [c], [i])[0]
                            for row, c, i in zip(rows, cached, ids)])
    starts = [len(c) for c in cached]
    cache.ensure(max(pool_rows, 1), max(start + len(i) for start, i in zip(starts, ids)) + 1)
    block = build_block(starts, ids, [list(range(-1, len(i) - 1)) for i in ids], draft.pad_id, draft.device)
    out = draft.forward(cache, rows, block, keep="last")
    for c, i in zip(cached, ids):
        c.extend(i)
    return out.logits[:, -1]  # [rows, draft_vocab]
