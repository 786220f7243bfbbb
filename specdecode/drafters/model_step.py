"""Shared by the model-based drafters: turn one step of draft logits into a token, its q row and a confidence."""
from __future__ import annotations

import torch

from ..config import SamplingConfig
from ..sampling import probabilities, sample


def choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator, vocab: int
           ) -> tuple[int, torch.Tensor | None, float]:
    """logits: [draft_vocab] -> (token, q [vocab] or None when greedy, top probability).

    Only the first `vocab` (target) columns are used, so q is the distribution actually sampled from."""
    logits = logits[:vocab]
    if sampling.greedy:
        probs = logits.float().softmax(-1)
        top, token = probs.max(-1)
        return int(token), None, float(top)
    q = probabilities(logits, sampling)
    return sample(q, generator), q, float(q.max())
