"""The end-to-end sampling setting the statistical tests share: a tiny target, a repetitive prompt (so
prompt lookup drafts from it), and the exact joint distribution of the first two generated tokens. The tests
draft from the first step (SpecConfig.first_step_drafts), so the verifier decides both tokens; by default a
drafter without free drafts (a draft model) leaves the first token to the target and only the second is verified
(test_e2e_sampling tests that too)."""
from __future__ import annotations

import dataclasses

import torch

from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core.engine import Engine
from specdecode.core.sampling import probabilities
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from tests.tiny import tiny_llama

VOCAB = 12
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]
SAMPLING = SamplingConfig(temperature=0.9, top_p=0.95)


def tiny_target() -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, layers=3, hidden=32, seed=5, std=0.2, eos_token_id=None))


def exact_pairs(target: Target, sampling: SamplingConfig = SAMPLING) -> dict[tuple[int, int], float]:
    """P(t1, t2 | PROMPT) under the target with the sampling transform."""
    with torch.no_grad():
        first = probabilities(last_logits(target, [PROMPT])[0], sampling)  # [V]
        second = probabilities(last_logits(target, [PROMPT + [t] for t in range(VOCAB)]), sampling)  # [V, V]
    return {(a, b): float(first[a] * second[a, b]) for a in range(VOCAB) for b in range(VOCAB)
            if first[a] * second[a, b] > 0}


def last_logits(target: Target, prompts: list[list[int]]) -> torch.Tensor:
    """[len(prompts), V]: the next-token logits after each prompt, as the target decodes: its native decoder
    where it has one (its own arithmetic, an fp16 cache included), else the model's forward."""
    if not target.packed_decoder:
        return target.model(torch.tensor(prompts)).logits[:, -1]
    rows = []
    for ids in prompts:
        block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], target.pad_id, "cpu")
        rows.append(target.forward(target.new_cache(), [0], block, keep="last").logits[0, -1])
    return torch.stack(rows)


def sample_pairs(engine: Engine, samples: int, sampling: SamplingConfig = SAMPLING,
                 generation: GenerationConfig | None = None) -> list[tuple[int, int]]:
    """The first two tokens of `samples` generations, seeds 0..samples-1 (3 tokens asked: no length cut)."""
    pairs = []
    generation = generation or GenerationConfig(max_new_tokens=3, stop_on_eos=False)
    for seed in range(samples):
        seeded = dataclasses.replace(sampling, seed=seed)
        out = engine.generate(PROMPT, seeded, generation).token_ids
        pairs.append((out[0], out[1]))
    return pairs
