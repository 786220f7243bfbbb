"""The fast path (gpt-fast style): a static cache read whole, fixed-shape steps (block sizes padded to a few
buckets) and `torch.compile` (inductor) of the model's own forward, each step shape then recorded in our
own CUDA graph on CUDA (cuda_graphs.py). Prefill stays eager (its length varies)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .trees import Block


@dataclass(frozen=True)
class FastPathConfig:
    """enabled: static cache + padded steps; compile: torch.compile them (backend/mode below);
    capacity: static cache slots per row at first (a request that needs more doubles it, at the price of a
    recompilation); None = 2048 on CUDA, where reading unused slots is nearly free, 512 on CPU, where every
    pass reads the whole static cache (measured: docs/design-notes.md, "Measured defaults");
    grouped_attention: attention reads each cached key/value head once (attention.py) instead of transformers'
    copy of the whole static cache per layer;
    capture: on CUDA, record each compiled step shape in our own CUDA graph (cuda_graphs.py) instead of
    torch.compile's "reduce-overhead" graph trees, whose per-call Python checks made decoding host-bound;
    attention_kernels: SDPA kernels the compiled steps may use on CUDA, in order of preference ("flash",
    "efficient", "cudnn", "math"); empty = torch's own choice (cuDNN on an H100). Measured there (bf16, one
    query over a 1024-slot cache): the memory-efficient kernel 58 us a call (1.7 ms of a 135M-model step),
    cuDNN 17 us; cuDNN and math gave the same step time (2.59 ms);
    dynamic: torch.compile's `dynamic` — False compiles every bucket separately (~40 s each for the 135M model
    on an H100); None lets it make the block length symbolic once a second bucket appears."""

    enabled: bool = False
    compile: bool = True
    backend: str = "inductor"
    mode: str | None = None  # None: "default" (+ our graphs on CUDA); "reduce-overhead" when capture is off
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    capacity: int | None = None
    grouped_attention: bool = True
    capture: bool = True
    attention_kernels: tuple[str, ...] = ()
    dynamic: bool | None = None

    def mode_for(self, device: torch.device) -> str:
        if self.mode:
            return self.mode
        return "reduce-overhead" if device.type == "cuda" and not self.capture else "default"

    def capacity_for(self, device: torch.device) -> int:
        return self.capacity or (2048 if device.type == "cuda" else 512)

    def captures(self, device: torch.device) -> bool:
        """Whether compiled steps are recorded in our own CUDA graphs on this device."""
        return self.enabled and self.compile and self.capture and device.type == "cuda" \
            and self.backend != "cudagraphs" and self.mode_for(device) != "reduce-overhead"


def bucket_for(q: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest bucket >= q, or None when q is larger than every bucket (then the step runs eager)."""
    return next((b for b in buckets if b >= q), None)


def pad_block(block: Block, q_to: int, kv_len: int, pad_id: int) -> Block:
    """Pad a block to q_to queries and a kv_len-wide mask. Pad queries write the slots right after the real
    ones (never committed, masked for everyone else) and see only themselves."""
    b, q = block.input_ids.shape
    extra = q_to - q
    device = block.input_ids.device
    slots = block.slots.to(device, copy=True)  # always a fresh tensor: made under the caller's inference mode
    # like every other padded tensor (a compiled step guards on that; a mix recompiled in the first request)
    if extra:
        tail = slots[:, -1:] + torch.arange(1, extra + 1, device=device)  # [b, extra]
        slots = torch.cat([slots, tail], dim=1)
    mask = torch.zeros((b, 1, q_to, kv_len), dtype=torch.bool, device=device)
    mask[:, :, :q, : block.kv_len] = block.mask
    if extra:
        rows = torch.arange(b, device=device)[:, None]
        queries = torch.arange(q, q_to, device=device)[None, :].expand(b, -1)
        mask[rows, 0, queries, slots[:, q:]] = True
    input_ids = torch.cat([block.input_ids, torch.full((b, extra), pad_id, dtype=torch.long, device=device)], 1)
    positions = torch.cat([block.positions, block.positions[:, -1:].expand(b, extra)], 1)
    return Block(input_ids, positions, slots, mask, kv_len, None)


def raise_recompile_limits() -> None:
    """Buckets x (full, layer-skip) forwards are distinct graphs of one function: allow enough of them."""
    config = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 256))
