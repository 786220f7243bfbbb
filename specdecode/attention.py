"""Grouped-query attention over a masked static cache without copying the cache.

transformers' SDPA path repeats every key/value head `groups` times (`repeat_kv`) whenever a mask is given
and it is traced by torch.compile: on the fast path that is a copy of the whole static cache per layer per
pass (two extra kernels a layer; at the 8B shape ~0.5 GB of extra traffic a pass). Here the query heads that
share a key/value head are folded into the query-length dimension instead, so attention reads each cached
head once: query [b, H, q, d] -> [b, kv_heads, groups * q, d], the mask repeated per group (it is small).
Registered in transformers' AttentionInterface under NAME; `Target` switches a model to it only for its own
fast-path passes (`using_grouped_attention`), so transformers' `generate` on the same model is untouched."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "specdecode_grouped_sdpa"


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    # query: [b, H, q, d]; key, value: [b, kv_heads, S, d]; attention_mask: [b, 1, q, S] bool (True = visible)
    unusual = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    if attention_mask is None or unusual or heads == kv_heads or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    folded = query.reshape(b, kv_heads, groups * q, d)  # head h = kv_head * groups + g -> row g * q + t
    mask = attention_mask.expand(b, groups, q, attention_mask.shape[-1]).reshape(b, 1, groups * q, -1)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)  # [b, kv_heads, groups * q, d]
    return out.reshape(b, heads, q, d).transpose(1, 2).contiguous(), None  # [b, q, H, d]


AttentionInterface.register(NAME, grouped_sdpa_forward)


@contextlib.contextmanager
def using_grouped_attention(config, enabled: bool = True) -> Iterator[None]:
    """Route the model's attention through grouped_sdpa_forward for the duration; always restores."""
    previous = getattr(config, "_attn_implementation", None)
    if not enabled or previous not in ("sdpa", NAME):  # eager / flash / flex models keep their own kernels
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
