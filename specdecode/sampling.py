"""Logits -> probabilities (temperature, top-k, top-p) and sampling. Used identically for target p and draft q."""
from __future__ import annotations

import torch

from .config import SamplingConfig


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """logits: [..., vocab] -> probs: [..., vocab] (float32). Greedy configs get temperature 1 here; callers
    that decode greedily use argmax and need no probabilities."""
    scores = logits.float()
    if sampling.temperature > 0:
        scores = scores / sampling.temperature
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """probs: [vocab] -> one token id."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
