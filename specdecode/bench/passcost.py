"""The per-pass cost curve and the memory-bandwidth floor (issue: fast path).

Decoding must read every weight once per target pass, so a pass can take no less than
weight bytes / memory bandwidth. `pass_costs` times one verify pass of q tokens (q = 1, 2, 4, ...) over a
cache of `context` tokens through the same Target.forward the engine uses (eager or fast path);
`copy_bandwidth` measures the device's bandwidth with a large tensor copy (bytes read + bytes written per
second, as in the measurements the floor figures came from). Random Llama-shaped configs let the curve be
measured at 1B and 8B scale without weights (acceptance there is meaningless; only the cost matters)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdecode.core.pass_costs import synchronize, time_passes
from specdecode.core.target import Target

RANDOM_CONFIGS = {
    # SmolLM2-135M (the default model's shape, without its weights), Llama-3.2-1B and Llama-3.1-8B shapes
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, head_dim=64),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, head_dim=128),
}


def random_model(name: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A random-initialised Llama of a named shape, built directly on the device."""
    if name not in RANDOM_CONFIGS:
        raise ValueError(f"unknown random config {name!r}; choose one of {', '.join(RANDOM_CONFIGS)}")
    config = LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, **RANDOM_CONFIGS[name])
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def copy_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Bytes moved (read + written) per second by a device-to-device copy."""
    src = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    began = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    synchronize(device)
    return 2 * src.numel() * repeats / (time.perf_counter() - began)


@dataclass(frozen=True)
class PassCost:
    q: int
    ms: float  # median over repeats


def pass_costs(target: Target, qs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), context: int = 512,
               repeats: int = 20) -> list[PassCost]:
    """Median time of one forward of q chain tokens after `context` cached tokens (core/pass_costs.time_passes)."""
    median = time_passes(target, [(1, q) for q in qs], context=context, rounds=repeats, reduce="median")
    return [PassCost(q, median[1, q] * 1000) for q in qs]
