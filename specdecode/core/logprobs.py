"""Logprobs of committed tokens, read from the target pass that verified them.

A token's logprob is the log-softmax, at temperature 1, of the target's logits at the position that chose it,
after the grammar's mask when the sequence has a structure (tokens it forbids are -inf) and before temperature,
top-k and top-p (vLLM's `raw_logprobs`). Plain decoding and every drafter read the same quantity from the same
position, so they agree up to the float noise of passes of different widths.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the N most likely allowed tokens and their logprobs, most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], top_n: int) -> tuple[TokenLogprob, ...]:
    """logits: [t, vocab], row j the scores that chose tokens[j]; top_n: how many alternatives each (0: none)."""
    if not tokens:
        return ()
    logp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)  # [t, vocab]
    chosen = logp.gather(1, torch.tensor(tokens, device=logp.device).unsqueeze(1)).squeeze(1).tolist()
    if top_n:
        values, ids = logp.topk(top_n, dim=-1)
        # a token the grammar forbids (-inf) is no alternative: fewer than top_n are listed where it allows fewer
        tops = [tuple((t, lp) for t, lp in zip(i, v) if lp != float("-inf"))
                for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return tuple(TokenLogprob(t, lp, top) for t, lp, top in zip(tokens, chosen, tops))
