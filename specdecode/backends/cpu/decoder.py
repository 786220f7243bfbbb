"""A packed Llama-family model's decoder layers run by layers.c, all of a pass's layers in one native call.

Why not the model's own forward: on a one-token pass, transformers' eager decoder layer is ~50 small torch
operations plus seven linear layers that each quantize their input; for a packed model that dispatch costs more
than reading the weights (SmolLM2 135M int4: most of a pass, several times what its packed weights take; Qwen2.5
1.5B: about a third of a pass; docs/design-notes.md, "Native decoder layers"). The embedding and head stay the
model's own modules, and the rotary values are its module's (`RotaryTable`); the final norm is computed as the
layers' norms are; what layers.c replaces is exactly a Llama / Qwen2 decoder layer (RMSNorm, q/k/v with optional
bias, rotate-half RoPE, grouped-query attention, o, RMSNorm, SiLU-gated MLP), read from the model's modules, never
copied.

A row's arithmetic does not depend on the rest of its pass (layers.c), so the packed model decodes to the same
tokens whether a token is verified alone or in a tree; transformers' forward on the same modules is the same
model up to rounding (tests/unit/test_packed_decoder.py)."""
from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.linear import BLOCK, PackedLinear
from specdecode.backends.cpu.share import CpuShare

ARCHITECTURES = ("llama", "qwen2")
_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


class _QLinear(ctypes.Structure):
    _fields_ = [("q4", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("codes", ctypes.c_void_p),
                ("d", ctypes.c_void_p), ("m", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [*((name, _QLinear) for name in _PROJECTIONS), ("norm_in", ctypes.c_void_p),
                ("norm_post", ctypes.c_void_p), ("eps", ctypes.c_float), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("hidden", ctypes.c_int64),
                ("inter", ctypes.c_int64), ("kv_half", ctypes.c_int64)]


class _Scratch(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("xq", "xd", "xs", "h", "q", "k", "v", "att", "g", "u", "out")]


def unsupported(model: nn.Module) -> str | None:
    """Why layers.c cannot run this model's decoder layers (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', None)!r} is not one of {', '.join(ARCHITECTURES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "the model has sliding-window layers"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "the model uses a sliding window"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "the model has no decoder layer list or rotary embedding"
    for layer in inner.layers:
        linears = [*(getattr(layer.self_attn, f"{p}_proj", None) for p in ("q", "k", "v", "o")),
                   *(getattr(layer.mlp, f"{p}_proj", None) for p in ("gate", "up", "down"))]
        if not all(isinstance(linear, PackedLinear) for linear in linears):
            return "not every decoder linear layer is packed"
    return native.missing()


def _qlinear(linear: PackedLinear) -> _QLinear:
    return _QLinear(int(linear.fmt == "q4"), linear.out_features, linear.in_features, linear.codes.data_ptr(),
                    linear.d.data_ptr(), 0 if linear.m is None else linear.m.data_ptr(),
                    0 if linear.bias is None else linear.bias.data_ptr())


SCRATCH_ROWS = 64  # passes of up to this many rows share one set of work buffers


class RotaryTable:
    """cos and sin of the model's rotary embedding per position, computed once by the model's own module and
    looked up per pass (calling the module is a string of small operations every pass: docs/design-notes.md,
    "Native decoder layers"). Each position's values are an elementwise function of that position alone, so the
    table holds exactly what the module returns for it; that is checked whenever the table grows, and a module
    whose values are not (a rope rescaled by the sequence length) is called every pass instead."""

    STATIC = ("default", "linear", "llama3")  # rope types whose frequencies do not depend on the sequence

    def __init__(self, rotary: nn.Module):
        self.rotary = rotary
        self.exact = getattr(rotary, "rope_type", "default") in self.STATIC
        self.cos = self.sin = torch.empty(0)  # [positions, head_dim]

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [b, q] -> cos, sin [b, q, head_dim] float32
        if not self.exact:
            return self._module(positions)
        last = int(positions.max())
        if last >= self.cos.shape[0]:
            self._grow(max(last + 1, 2 * self.cos.shape[0], 1024))
            if not self.exact:
                return self._module(positions)
        return self.cos[positions], self.sin[positions]

    def _module(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(torch.empty(1, dtype=torch.float32), positions)
        return cos.float().contiguous(), sin.float().contiguous()

    def _grow(self, size: int) -> None:
        cos, sin = self._module(torch.arange(size)[None])  # [1, size, head_dim]
        probe = torch.tensor([[0, 1, size // 3, size - 1]])
        alone = [self._module(probe[:, i : i + 1]) for i in range(probe.shape[1])]
        self.exact = all(torch.equal(c[0, 0], cos[0, p]) and torch.equal(s[0, 0], sin[0, p])
                         for (c, s), p in zip(alone, probe[0].tolist()))
        self.cos, self.sin = cos[0], sin[0]


@dataclass(frozen=True)
class DecoderOutput:
    logits: torch.Tensor  # [b, q_kept, vocab]
    hidden: torch.Tensor  # [b, q, hidden] after the final norm


class PackedDecoder:
    """The decoder of a packed Llama-family model, over a dynamic RollbackCache (see the module docstring)."""

    def __init__(self, model: nn.Module, kv_half: bool = False):
        """kv_half: keep the cache's keys and values in fp16 (half the bytes a pass reads from it; a batched or
        long-context pass is bound by that read), else fp32."""
        reason = unsupported(model)
        if reason:
            raise ValueError(f"packed decoder unavailable: {reason}")
        self.kv_dtype = torch.float16 if kv_half else torch.float32
        self.model, inner, config = model, model.model, model.config
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, inner.norm
        self.head = model.get_output_embeddings()
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden, self.inter = config.hidden_size, config.intermediate_size
        self._keep: list[torch.Tensor] = []  # norm weights in float32, alive as long as the structs point at them
        self.layers = [self._layer(layer, config) for layer in inner.layers]
        self._layer_table = (ctypes.c_void_p * len(self.layers))(*map(ctypes.addressof, self.layers))  # for C
        norm = self.norm.weight.detach().float().contiguous()
        self._keep.append(norm)
        self._norm_weight = norm
        self._norm_eps = getattr(self.norm, "variance_epsilon", None) or config.rms_norm_eps
        self.rope = RotaryTable(self.rotary)
        self._small: tuple[_Scratch, list[torch.Tensor]] | None = None
        self._lib = native.library()
        self.share = CpuShare(torch.get_num_threads)  # threads per pass, fewer while other processes hold cores

    def _layer(self, layer: nn.Module, config) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        norms = [norm.weight.detach().float().contiguous() for norm in (layer.input_layernorm,
                                                                         layer.post_attention_layernorm)]
        self._keep.extend(norms)
        projections = {p: _qlinear(getattr(attention, f"{p}_proj")) for p in ("q", "k", "v", "o")}
        projections.update({p: _qlinear(getattr(mlp, f"{p}_proj")) for p in ("gate", "up", "down")})
        eps = getattr(layer.input_layernorm, "variance_epsilon", None) or config.rms_norm_eps
        return _Layer(**projections, norm_in=norms[0].data_ptr(), norm_post=norms[1].data_ptr(), eps=eps,
                      heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim, hidden=self.hidden,
                      inter=self.inter, kv_half=int(self.kv_dtype == torch.float16))

    @torch.inference_mode()
    def forward(self, cache, rows: list[int], input_ids: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, keep_last: bool = False,
                num_layers: int | None = None, lengths: tuple[int, ...] | None = None) -> DecoderOutput:
        # input_ids, positions, slots: [b, q]; mask: [b, 1, q, kv_len] bool (True = visible)
        # lengths: row b's real tokens (the first lengths[b]; the rest is padding, not computed); None: all q
        b, q = input_ids.shape
        kv_len = mask.shape[-1]
        lengths = tuple(lengths) if lengths is not None else (q,) * b
        real = None if min(lengths) == q else torch.cat([torch.arange(i * q, i * q + n) for i, n in enumerate(lengths)])
        starts = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)  # [b + 1]

        def flat(t: torch.Tensor) -> torch.Tensor:  # [b, q, ...] -> [R, ...], the real rows only
            t = t.reshape(b * q, *t.shape[2:])
            return (t if real is None else t[real]).contiguous()

        x = flat(self.embed(input_ids).float())  # [R, hidden]
        rows_total = x.shape[0]
        cos, sin = (flat(t) for t in self.rope(positions))  # [R, head_dim] each
        slot_list = flat(slots.to(torch.int64))  # [R]
        visible = flat(mask[:, 0]).view(torch.uint8)  # [R, kv_len]
        ends = [int(slots[i, n - 1]) + 1 for i, n in enumerate(lengths)]
        cache.prepare(rows, slots, kv_len)
        if b == 1:
            ends = [max(ends[0], kv_len)]
        scratch, keepalive = self._scratch(rows_total)
        like = x.new_empty(1, self.kv_heads, 0, self.head_dim, dtype=self.kv_dtype)
        layers, threads = self.layers[: num_layers or len(self.layers)], self.share.threads()
        pointers = cache.row_pointers(len(layers), ends, like)  # [layers, 3, b]: keys, values, capacities
        self._lib.decoder_layers(self._layer_table, len(layers), x.data_ptr(), rows_total, b, starts.data_ptr(),
                                 cos.data_ptr(), sin.data_ptr(), pointers.data_ptr(), slot_list.data_ptr(),
                                 visible.data_ptr(), kv_len, ctypes.addressof(scratch), threads)
        states = torch.empty_like(x)  # [R, hidden]: the final norm, natively (transformers' is slow after the kernels)
        self._lib.rms_norm_rows(x.data_ptr(), self._norm_weight.data_ptr(), self._norm_eps, rows_total, self.hidden,
                                states.data_ptr())
        if keep_last:  # each row's last real position
            logits = self._head(states[starts[1:] - 1], threads)[:, None]  # [b, 1, vocab]
        else:
            logits = self._head(states, threads)  # [R, vocab]: the head once per real row
        if real is not None:  # a padded position gets its row's last real one: read by no one, never garbage
            index = torch.minimum(starts[:-1, None] + torch.arange(q), starts[1:, None] - 1).reshape(-1)  # [b * q]
            states = states[index]
            logits = logits if keep_last else logits[index]
        states = states.reshape(b, q, self.hidden)
        logits = logits.reshape(b, -1, logits.shape[-1])
        del keepalive
        return DecoderOutput(logits, states)

    def _head(self, rows: torch.Tensor, threads: int) -> torch.Tensor:
        """[R, hidden] -> [R, vocab]."""
        if getattr(self.head, "threaded", False):  # a PackedLinear, or a draft's shortlist of one
            return self.head(rows, threads)
        # a float head multiplies row by row: a float matmul's rounding depends on how many rows it has
        return torch.stack([self.head(row) for row in rows])

    def _scratch(self, rows: int) -> tuple[_Scratch, list[torch.Tensor]]:
        """Per-pass work buffers: those of a decode or verify pass (up to SCRATCH_ROWS rows) made once and
        reused, a prefill chunk's made for it and freed after."""
        if rows > SCRATCH_ROWS:
            return self._make_scratch(rows)
        if self._small is None:
            self._small = self._make_scratch(SCRATCH_ROWS)
        return self._small

    def _make_scratch(self, rows: int) -> tuple[_Scratch, list[torch.Tensor]]:
        widest = max(self.hidden, self.inter, self.heads * self.head_dim)
        qd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        tensors = {
            "xq": torch.empty(rows, widest, dtype=torch.int8),
            "xd": torch.empty(rows, widest // BLOCK), "xs": torch.empty(rows, widest // BLOCK),
            "h": torch.empty(rows, self.hidden), "q": torch.empty(rows, qd), "k": torch.empty(rows, kvd),
            "v": torch.empty(rows, kvd), "att": torch.empty(rows, qd), "g": torch.empty(rows, self.inter),
            "u": torch.empty(rows, self.inter), "out": torch.empty(rows, self.hidden),
        }
        return _Scratch(**{name: t.data_ptr() for name, t in tensors.items()}), list(tensors.values())
