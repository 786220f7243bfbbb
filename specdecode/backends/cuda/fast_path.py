"""The fast path (gpt-fast style): a static cache read whole, fixed-shape steps (block sizes padded to a few
buckets) and `torch.compile` (inductor) of the model's own forward, each step shape then recorded in our
own CUDA graph on CUDA (graphs.py). Prefill stays eager (its length varies)."""
from __future__ import annotations

import torch


def bucket_for(q: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest bucket >= q, or None when q is larger than every bucket (then the step runs eager)."""
    return next((b for b in buckets if b >= q), None)


def raise_recompile_limits() -> None:
    """Buckets x (full, layer-skip) forwards are distinct graphs of one function: allow enough of them."""
    config = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 256))
