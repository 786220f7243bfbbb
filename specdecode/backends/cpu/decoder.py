"""A packed Llama-family model's decoder layers run by layers.c, all of a pass's layers in one native call.

Why not the model's own forward: on a one-token pass, transformers' eager decoder layer is ~50 small torch
operations plus seven linear layers that each quantize their input; for a packed model that dispatch costs more
than reading the weights (SmolLM2 135M int4: most of a pass, several times what its packed weights take; Qwen2.5
1.5B: about a third of a pass; docs/design-notes.md, "Native decoder layers"). The embedding and head stay the
model's own modules, and the rotary values are its module's (`RotaryTable`); the final norm is computed as the
layers' norms are; what layers.c replaces is exactly a Llama / Qwen2 decoder layer (RMSNorm, q/k/v with optional
bias, rotate-half RoPE, grouped-query attention, o, RMSNorm, SiLU-gated MLP), read from the model's modules, never
copied, and the same layer with what Qwen3 and Gemma 3 add (FAMILIES): per-head q/k norms, Gemma's norms of each
block's output, its GELU-gated MLP, (1 + w) norm weights and attention scale, and its sliding-window layers, which
read a windowed copy of the pass's mask (Target._layer_masks) and their own rotary table. Mistral is Llama's layer
with every layer in a window (the one windowed mask); Phi-3 is Llama's layer with fused q/k/v and gate/up
projections, read as views of their packed rows (_linears); Llama 3.x's RoPE scaling is in its rotary table.

A row's arithmetic does not depend on the rest of its pass (layers.c), so the packed model decodes to the same
tokens whether a token is verified alone or in a tree; transformers' forward on the same modules is the same
model up to rounding (tests/unit/test_packed_decoder.py)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.linear import PackedLinear
from specdecode.backends.cpu.share import CpuShare, TorchThreads


@dataclass(frozen=True)
class Family:
    """How one architecture's decoder layer differs from Llama's, for layers.c."""

    norm_offset: float = 0.0  # an RMSNorm's weight is (offset + w): Gemma stores w - 1
    sandwich: bool = False  # norms of the attention's and the MLP's outputs (post_attention_layernorm is one)
    qk_norm: bool = False  # per-head RMS norms of queries and keys (self_attn.q_norm / k_norm)


FAMILIES = {"llama": Family(), "qwen2": Family(), "qwen3": Family(qk_norm=True), "mistral": Family(),
            "phi3": Family(), "gemma3_text": Family(norm_offset=1.0, sandwich=True, qk_norm=True)}
ARCHITECTURES = tuple(FAMILIES)
ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1}  # layers.c's decoder_layer_t.gelu
LAYER_KINDS = ("full_attention", "sliding_attention")  # decoder_layer_t.kind: which mask and rotary table
_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def unsupported(model: nn.Module) -> str | None:
    """Why layers.c cannot run this model's decoder layers (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', None)!r} is not one of {', '.join(ARCHITECTURES)}"
    activation = _activation(config)
    if activation not in ACTIVATIONS:
        return f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}"
    if any(kind not in LAYER_KINDS for kind in getattr(config, "layer_types", None) or ()):
        return f"layer types {sorted(set(config.layer_types) - set(LAYER_KINDS))} are not {' or '.join(LAYER_KINDS)}"
    if _rotary_share(config) != 1.0:
        return f"the model rotates {_rotary_share(config)} of each head (partial rotary), layers.c all of it"
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, cap, None) is not None:
            return f"the model uses {cap}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "the model has no decoder layer list or rotary embedding"
    for layer in inner.layers:
        if not all(isinstance(linear, PackedLinear) for linear in _linears(layer)):
            return "not every decoder linear layer is packed"
    return native.missing()


def _rotary_share(config) -> float:
    """The share of each head's dimensions that RoPE rotates (Phi-3.5 / Phi-4-mini: 0.75)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    flat = parameters if "rope_type" in parameters or not parameters else next(iter(parameters.values()))
    return float(flat.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0))


def _linears(layer: nn.Module) -> list[nn.Module | None]:
    """A decoder layer's projections as layers.c reads them: q, k, v, o, gate, up, down (None where one is
    missing). Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj (in that order, as its forward splits
    them): those are cut into views of their packed rows, read in place, never copied."""
    attention, mlp = layer.self_attn, layer.mlp
    config, head_dim = attention.config, attention.head_dim
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    half = getattr(getattr(mlp, "gate_up_proj", None), "out_features", 0) // 2
    return [*_parts(attention, ("q", "k", "v"), "qkv_proj", (q, kv, kv)), getattr(attention, "o_proj", None),
            *_parts(mlp, ("gate", "up"), "gate_up_proj", (half, half)), getattr(mlp, "down_proj", None)]


def _parts(module: nn.Module, names: tuple[str, ...], fused: str, sizes: tuple[int, ...]) -> list[nn.Module | None]:
    """module's `{name}_proj` layers, or the packed layer `fused` cut into them by `sizes` (None each where it
    cannot be)."""
    whole = getattr(module, fused, None)
    if whole is None:
        return [getattr(module, f"{name}_proj", None) for name in names]
    return whole.split(sizes) if isinstance(whole, PackedLinear) and whole.splits(sizes) else [None] * len(names)


def _activation(config) -> str:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")


class RotaryTable:
    """cos and sin of the model's rotary embedding per position, computed once by the model's own module and
    looked up per pass (calling the module is a string of small operations every pass: docs/design-notes.md,
    "Native decoder layers"). Each position's values are an elementwise function of that position alone, so the
    table holds exactly what the module returns for it; that is checked whenever the table grows, and a module
    whose values are not (a rope rescaled by the sequence length) is called every pass instead."""

    STATIC = ("default", "linear", "llama3")  # rope types whose frequencies do not depend on the sequence

    def __init__(self, rotary: nn.Module, layer_type: str | None = None):
        """layer_type: which of the module's tables (Gemma 3's rotary module holds one per layer type)."""
        self.rotary, self.layer_type = rotary, layer_type
        rope_type = getattr(rotary, "rope_type", "default")
        self.exact = (rope_type.get(layer_type) if isinstance(rope_type, dict) else rope_type) in self.STATIC
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
        kind = {} if self.layer_type is None else {"layer_type": self.layer_type}
        cos, sin = self.rotary(torch.empty(1, dtype=torch.float32), positions, **kind)
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
    taps: torch.Tensor | None = None  # [b, q, len(taps) x hidden] the tapped layers' input states, when asked for


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
        self.family = FAMILIES[config.model_type]
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * len(inner.layers))
        self.variant = native.variant_index()
        # the layers as ops.cpp holds them (their tensors checked against the shapes layers.c reads)
        self.stack = torch.classes.specdecode_native.DecoderStack(
            self.variant, self.heads, self.kv_heads, self.head_dim, self.hidden, self.inter,
            self.kv_dtype == torch.float16, _activation(config) == "gelu_pytorch_tanh")
        for layer, kind in zip(inner.layers, self.layer_types):
            self._add_layer(layer, config, kind)
        self.num_layers = len(inner.layers)
        self._norm_weight = self._norm(self.norm)
        self._norm_eps = _eps(self.norm, config)
        typed = isinstance(getattr(self.rotary, "rope_type", None), dict)  # one table per layer type (Gemma 3)
        self.ropes = {kind: RotaryTable(self.rotary, kind if typed else None) for kind in set(self.layer_types)}
        # threads per pass, fewer while other processes hold cores; torch's own operations follow the same count
        self.torch_threads = TorchThreads(torch.get_num_threads, torch.set_num_threads)
        self.share = CpuShare(self.torch_threads.budget)

    def _norm(self, norm: nn.Module | None) -> torch.Tensor | None:
        """An RMSNorm's weight as layers.c multiplies by it, float32; None for no norm."""
        if norm is None:
            return None
        return (norm.weight.detach().float() + self.family.norm_offset).contiguous()

    def _add_layer(self, layer: nn.Module, config, kind: str) -> None:
        attention, family = layer.self_attn, self.family
        if family.sandwich:  # Gemma: post_attention_layernorm is the attention output's; the MLP's input has its own
            norm_post, attn_out, mlp_out = (layer.pre_feedforward_layernorm, layer.post_attention_layernorm,
                                            layer.post_feedforward_layernorm)
        else:
            norm_post, attn_out, mlp_out = layer.post_attention_layernorm, None, None
        q_norm, k_norm = (attention.q_norm, attention.k_norm) if family.qk_norm else (None, None)
        linears = _linears(layer)
        scale = getattr(attention, "scaling", None) or self.head_dim ** -0.5
        self.stack.add_layer([linear.codes for linear in linears], [linear.d for linear in linears],
                             [linear.m for linear in linears], [linear.bias for linear in linears],
                             self._norm(layer.input_layernorm), self._norm(norm_post), self._norm(attn_out),
                             self._norm(mlp_out), self._norm(q_norm), self._norm(k_norm),
                             _eps(layer.input_layernorm, config), scale, LAYER_KINDS.index(kind))

    @torch.inference_mode()
    def forward(self, cache, rows: list[int], input_ids: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor | dict[str, torch.Tensor], keep_last: bool = False,
                num_layers: int | None = None, lengths: tuple[int, ...] | None = None,
                taps: tuple[int, ...] = (), logit_rows: int | None = None) -> DecoderOutput:
        # input_ids, positions, slots: [b, q]; mask: [b, 1, q, kv_len] bool (True = visible), or one per layer type
        # (Target._layer_masks: sliding-window layers see a windowed copy)
        # lengths: row b's real tokens (the first lengths[b]; the rest is padding, not computed); None: all q
        # taps: layers whose input states come back side by side in DecoderOutput.taps (EAGLE-3), each < the count
        # logit_rows: only the first logit_rows rows get logits, over their widest length (None: every row); the
        # rest are prompt chunks riding in the pass, whose scores no one reads (the head is a fifth of SmolLM2)
        masks = mask if isinstance(mask, dict) else {kind: mask for kind in LAYER_KINDS}
        mask = masks["full_attention"] if "full_attention" in masks else next(iter(masks.values()))
        b, q = input_ids.shape
        kv_len = mask.shape[-1]
        lengths = tuple(lengths) if lengths is not None else (q,) * b
        real = None if min(lengths) == q else torch.cat([torch.arange(i * q, i * q + n) for i, n in enumerate(lengths)])
        starts = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)  # [b + 1]

        def flat(t: torch.Tensor) -> torch.Tensor:  # [b, q, ...] -> [R, ...], the real rows only
            t = t.reshape(b * q, *t.shape[2:])
            return (t if real is None else t[real]).contiguous()

        x = flat(self.embed(input_ids).float())  # [R, hidden]
        tables = {kind: [flat(t) for t in rope(positions)] for kind, rope in self.ropes.items()}  # [R, head_dim]
        slot_list = flat(slots.to(torch.int64))  # [R]
        visible = {kind: flat(masks.get(kind, mask)[:, 0]).view(torch.uint8) for kind in self.ropes}  # [R, kv_len]
        used = [tables.get(kind) or next(iter(tables.values())) for kind in LAYER_KINDS]
        seen = [visible.get(kind, next(iter(visible.values()))) for kind in LAYER_KINDS]
        ends = [int(slots[i, n - 1]) + 1 for i, n in enumerate(lengths)]
        cache.prepare(rows, slots, kv_len)
        if b == 1:
            ends = [max(ends[0], kv_len)]
        like = x.new_empty(1, self.kv_heads, 0, self.head_dim, dtype=self.kv_dtype)
        count, threads = num_layers or self.num_layers, self.share.threads()
        self.torch_threads.follow(threads)
        pointers = cache.row_pointers(count, ends, like)  # [layers, 3, b]: keys, values, capacities
        tapped = {}
        first = 0
        for end in [*sorted({t for t in taps if 0 < t < count}), count]:  # stretches of layers between the taps
            if first in taps:
                tapped[first] = x.clone()
            self.stack.forward(x, starts, [c for c, _ in used], [s for _, s in used], pointers, slot_list, seen,
                               first, end, threads)
            first = end
        if any(t not in tapped for t in taps):
            raise ValueError(f"taps {taps} must be layers below {count}")
        # [R, hidden]: the final norm, natively (transformers' is slow after the kernels)
        states = native.ops().rms_norm_rows(x, self._norm_weight, self._norm_eps, self.variant)
        scored = b if logit_rows is None else logit_rows
        width = max(lengths[:scored], default=0) if scored < b else q
        if keep_last:  # each row's last real position
            logits = self._head(states[starts[1 : scored + 1] - 1], threads)  # [scored, vocab]
        else:
            logits = self._head(states[: starts[scored]], threads)  # [R', vocab]: the head once per real row
            if real is not None or width < q:  # a padded position gets its row's last real one: never garbage
                logits = logits[_padded_index(starts[: scored + 1], width)]  # [scored * width, vocab]
        side = torch.cat([tapped[t] for t in taps], dim=-1) if taps else None  # [R, taps x hidden]
        if real is not None:  # (read by no one)
            index = _padded_index(starts, q)  # [b * q]
            states = states[index]
            side = None if side is None else side[index]
        states = states.reshape(b, q, self.hidden)
        logits = logits.reshape(scored, 1 if keep_last else width, logits.shape[-1])
        return DecoderOutput(logits, states, None if side is None else side.reshape(b, q, -1))

    def _head(self, rows: torch.Tensor, threads: int) -> torch.Tensor:
        """[R, hidden] -> [R, vocab]."""
        if not len(rows):  # a pass of riding prompt chunks only: no scores wanted
            return rows.new_zeros(0, getattr(self.head, "out_features", None) or self.model.config.vocab_size)
        if getattr(self.head, "threaded", False):  # a PackedLinear, or a draft's shortlist of one
            return self.head(rows, threads)
        # a float head multiplies row by row: a float matmul's rounding depends on how many rows it has
        return torch.stack([self.head(row) for row in rows])


def _padded_index(starts: torch.Tensor, width: int) -> torch.Tensor:
    """starts: [n + 1] offsets of n rows' real positions in a flat [R, ...] tensor -> [n * width] indices that lay
    them out `width` wide, a padded position taking its row's last real one."""
    return torch.minimum(starts[:-1, None] + torch.arange(width), starts[1:, None] - 1).reshape(-1)


def _eps(norm: nn.Module, config) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or config.rms_norm_eps
