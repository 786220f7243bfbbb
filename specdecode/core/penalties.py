"""Logits that depend on the context beyond the model: OpenAI's logit_bias, presence and frequency penalties and
the repetition penalty of transformers and vLLM, applied to every position a verify pass scores.

Each position of a draft tree predicts the token after its own path, so its context is the committed tokens plus
the draft tokens from the root to it. Its counts are built as integers, exactly as plain decoding would count the
same context, and every transform is elementwise, so a position's logits are the bits plain decoding computes
there: greedy output stays equal to plain greedy decoding with the same settings, and sampling samples the
penalized distribution exactly (the verifier's p). In order, as vLLM applies them:
    x += logit_bias[t]
    x = x / r if x > 0 else x * r          for t in the prompt or the generated text (repetition penalty r)
    x -= frequency * count(t);  x -= presence * (count(t) > 0)    count(t): times t was generated
Written here rather than taken from transformers' LogitsProcessors, which see one context per row and so
cannot score a tree's positions, each with its own path. vLLM's min_tokens depends on the position alone: a node
at depth d picks the output's (n + d + 1)-th token, and before the least the ending tokens are masked
(`hold_ends`)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from specdecode.config import SamplingConfig
from specdecode.errors import ConfigError


def check_bias(sampling: SamplingConfig, vocab: int) -> None:
    """A logit_bias token outside the vocabulary is a ConfigError (a 400 in the server)."""
    for token, _ in sampling.logit_bias:
        if token >= vocab:
            raise ConfigError(f"logit_bias token {token} is outside the vocabulary ({vocab} tokens)")


def path_tokens(tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """The draft tokens on the path to each position of a verify block: [] for the root (position 0), then for
    draft node j (position j + 1) its parent's path plus its own token. parents: -1 for the root's children.

    Example: tokens [5, 6, 7], parents [-1, 0, -1] -> [[], [5], [5, 6], [7]]."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents):
        paths.append(paths[parent + 1] + [token])
    return paths


@torch.inference_mode()  # the target's outputs are inference tensors, written in place
def hold_ends(logits: torch.Tensor, ends: Sequence[int], produced: int, depths: Sequence[int], least: int) -> None:
    """logits: [len(depths), vocab], position i (at depth depths[i], the root 0) picking the output's
    (produced + depths[i] + 1)-th token; where that is within the first `least`, the `ends` are masked, in place."""
    rows = [i for i, depth in enumerate(depths) if produced + depth < least]
    if rows and ends:
        index = torch.tensor(rows, device=logits.device)[:, None], torch.tensor(list(ends), device=logits.device)
        logits[index] = float("-inf")


@torch.inference_mode()  # the target's outputs are inference tensors, written in place
def penalize(logits: torch.Tensor, sampling: SamplingConfig, prompt: Sequence[int], output: Sequence[int],
             paths: Sequence[Sequence[int]]) -> None:
    """logits: [len(paths), vocab], position i scoring the token after `prompt + output + paths[i]`; changed in
    place. output: the generated tokens so far (the block's root among them)."""
    if not sampling.penalized:
        return
    rows = logits.shape[0]
    device = logits.device
    if sampling.logit_bias:
        ids = torch.tensor([t for t, _ in sampling.logit_bias], device=device)
        logits[:, ids] += torch.tensor([b for _, b in sampling.logit_bias], device=device, dtype=logits.dtype)
    # only the columns of tokens that occur change (a count of 0 subtracts exactly 0): [rows, C] of them
    repeat = sampling.repetition_penalty != 1.0
    touched = set(output).union(*map(set, paths), set(prompt) if repeat else ())
    if not touched:
        return
    cols = torch.tensor(sorted(touched), device=device)  # [C]

    def at(tokens: Sequence[int]) -> torch.Tensor:  # tokens -> their column indices
        return torch.searchsorted(cols, torch.tensor(list(tokens), dtype=torch.long, device=device))

    counts = torch.zeros(rows, len(cols), device=device)  # [rows, C] generated-token counts per position
    if output:
        counts += torch.bincount(at(output), minlength=len(cols)).to(counts.dtype)
    for i, path in enumerate(paths):
        if path:
            counts[i].index_put_((at(path),), torch.ones(len(path), device=device), accumulate=True)
    sub = logits[:, cols]  # [rows, C]
    if repeat:
        seen = counts > 0
        if prompt:
            seen[:, at(prompt)] = True
        r = sampling.repetition_penalty
        sub = torch.where(seen, torch.where(sub > 0, sub / r, sub * r), sub)
    if sampling.frequency_penalty:
        sub = sub - sampling.frequency_penalty * counts
    if sampling.presence_penalty:
        sub = sub - sampling.presence_penalty * (counts > 0).to(sub.dtype)
    logits[:, cols] = sub
