"""Logits -> probabilities (temperature, min-p, top-k, top-p) and sampling. Used identically for target p and
draft q. (Penalties and logit_bias depend on the context: penalties.py, before this.)"""
from __future__ import annotations

import torch

from specdecode.config import SamplingConfig

# The smallest normal float32. A temperature below it may round to 0 (or lose all precision) in float32, so the
# transform takes its limit there: all mass on the largest logit(s), which is what greedy decoding picks.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """logits: [..., vocab] -> probs: [..., vocab] (float32). Greedy configs get temperature 1 here; callers
    that decode greedily use argmax and need no probabilities."""
    scores = logits.float()
    if sampling.temperature > 0:
        scores = _temper(scores, sampling.temperature)
    if sampling.min_p > 0:  # as vLLM: after the temperature, before top-k / top-p
        probs = scores.softmax(dim=-1)
        scores = scores.masked_fill(probs < sampling.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        scores = scores.masked_fill(_top_p_drop(scores, sampling.top_p), float("-inf"))
    return scores.softmax(dim=-1)


def _temper(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """scores: [..., vocab] -> (scores - max) / temperature, which softmax maps to the same distribution as
    scores / temperature but cannot overflow: the largest score becomes 0 and the others fall towards -inf
    (where softmax gives 0) as the temperature shrinks. Below MIN_TEMPERATURE the limit itself is returned
    (0 at the maximum, -inf elsewhere): greedy, with ties shared. Example: scores [1, 3, 3], temperature 1e-38
    -> [-inf, 0, 0] -> probabilities [0, 0.5, 0.5]."""
    top = scores.amax(dim=-1, keepdim=True)  # [..., 1]
    if temperature < MIN_TEMPERATURE:
        return torch.where(scores == top, 0.0, float("-inf"))
    return (scores - top) / temperature


def _top_p_drop(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """scores: [..., vocab] -> drop mask [..., vocab]: a token is dropped when the mass strictly before it (in
    descending order) already reaches top_p. The most likely token always stays, even for a top_p that rounds
    to 0 in float32 (5e-324), so the result is never all -inf."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    sorted_probs = sorted_scores.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits: [..., vocab] -> [...] the index of the largest logit (the first of tied ones, NaN counting as
    largest), as argmax. Why not argmax: torch's CPU argmax kernel is ~3x slower than max's over a vocabulary's
    logits (docs/design-notes.md, "Native decoder layers"), and greedy decoding takes one per verify pass and
    per greedy draft token."""
    return logits.max(dim=-1).indices


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
