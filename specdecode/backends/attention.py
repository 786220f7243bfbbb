"""Grouped-query attention over a masked static cache without copying the cache.

transformers' SDPA path repeats every key/value head `groups` times (`repeat_kv`) whenever a mask is given
and it is traced by torch.compile: on the fast path that is a copy of the whole static cache per layer per
pass (two extra kernels a layer; at the 8B shape ~0.5 GB of extra traffic a pass). Here the query heads that
share a key/value head are folded into the query-length dimension instead, so attention reads each cached
head once: query [b, H, q, d] -> [b, kv_heads, groups * q, d], the mask repeated per group (it is small).
Registered in transformers' AttentionInterface under NAME; `Target` switches a model to it only for its own
fast-path passes (`using_grouped_attention`), so transformers' `generate` on the same model is untouched.

Per-row attention (ROWS_NAME) is for batches over the dynamic cache, whose rows hold contexts of different
lengths: padding every row to the longest one (a 2,000-token prompt being prefilled next to a 50-token chat)
copies every row's keys into a padded tensor per layer and makes each row attend over the longest context.
Instead the cache writes each row in place and hands attention the rows' own buffers, and attention runs once
per row over that row's length (transformers' SDPA function, so the arithmetic is the padded path's)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

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

ROWS_NAME = "specdecode_row_sdpa"
RowKV = list[tuple[torch.Tensor, torch.Tensor, int]]  # per batch row: its keys, values [kv_heads, S, d], length


def row_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, specdecode_rows: Callable[[int], RowKV] | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    # query: [b, H, q, d]; key, value: this pass's new keys only (the cache did not gather the rows); the rows'
    # buffers come from specdecode_rows(layer index); attention_mask: [b, 1, q, S]
    if specdecode_rows is None:
        raise RuntimeError("per-row attention needs the cache's rows (specdecode_rows)")
    outputs = []
    for i, (keys, values, length) in enumerate(specdecode_rows(module.layer_idx)):
        mask = None if attention_mask is None else attention_mask[i : i + 1, ..., :length]
        out, _ = sdpa_attention_forward(module, query[i : i + 1], keys[None, :, :length], values[None, :, :length],
                                        mask, **kwargs)  # [1, q, H, d]
        outputs.append(out)
    return torch.cat(outputs), None  # [b, q, H, d]


AttentionInterface.register(ROWS_NAME, row_sdpa_forward)


@contextlib.contextmanager
def using_grouped_attention(config, enabled: bool = True, name: str = NAME) -> Iterator[None]:
    """Route the model's attention through grouped_sdpa_forward (or another of ours, `name`) for the duration;
    always restores."""
    previous = getattr(config, "_attn_implementation", None)
    if not enabled or previous not in ("sdpa", NAME, ROWS_NAME):  # eager / flash / flex models keep their kernels
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


def per_row_attention_applies(config) -> bool:
    """Whether a model's attention can be switched to row_sdpa_forward (it is SDPA's, or already ours)."""
    return getattr(config, "_attn_implementation", None) in ("sdpa", NAME, ROWS_NAME)

EXACT_NAME = "specdecode_row_exact"
EXACT_MAX_ROWS = 64  # longer query blocks (prefill chunks) take SDPA: every method prefills alike


def row_exact_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention that gives a query row the same bits whatever else is in its pass: each row attends over
    exactly its visible keys, gathered in position order, with products of shapes set by that count alone.
    SDPA and batched matmuls pick kernels and summation orders by the block's size, and a masked key still
    changes the length a softmax sums over: ~1e-7 apart, which int8 activations (backends/cpu/) round into different
    codes, so a verify pass over k tokens would not reproduce the one-token logits and speculation would
    leave plain decoding's output. A tree node sees the cache and its ancestors: the very keys, in the same
    order, that the same token sees when decoded alone."""
    # query: [b, H, q, d]; key, value: [b, kv_heads, S, d]; attention_mask: [b, 1, q, S] bool or additive
    b, heads, q, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    unusual = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))
    if q > EXACT_MAX_ROWS or unusual or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scale = scaling if scaling is not None else d ** -0.5
    if attention_mask is None:  # causal over this block: row t sees the cache and block rows <= t
        visible = torch.ones(q, length, dtype=torch.bool).tril(length - q)[None, None].expand(b, 1, q, length)
    elif attention_mask.dtype == torch.bool:
        visible = attention_mask
    else:
        visible = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    out = query.new_empty(b, q, heads, d)
    for i in range(b):
        for t in range(q):
            seen = visible[i, 0, t].nonzero().squeeze(-1)  # [n] positions, ascending
            keys, values = key[i][:, seen], value[i][:, seen]  # [kv, n, d]
            row = query[i, :, t].reshape(kv_heads, groups, d)  # [kv, g, d]
            probs = torch.softmax(torch.matmul(row, keys.transpose(-1, -2)) * scale, -1)  # [kv, g, n]
            out[i, t] = torch.matmul(probs, values).reshape(heads, d)
    return out, None  # [b, q, H, d]


AttentionInterface.register(EXACT_NAME, row_exact_forward)
