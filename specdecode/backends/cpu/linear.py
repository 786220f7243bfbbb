"""Quantized linear layers (4- or 8-bit weights in blocks of 32, int8 activations) and the packing of a model.

Formats (kernels.c has the packed layout):
  q4: value = d * c + m, c in 0..15, one fp16 d and m per block of 32 inputs (GGUF's Q4_1; Q4_0 and Q4_K
      blocks convert to it exactly, up to the fp16 rounding of Q4_K's two-level scales)
  q8: value = d * c, c in -127..127, one fp16 d per block (GGUF's Q8_0)
A layer is packed from float weights: q4 takes each block's min and max as its grid ends (which recovers a
4-bit GGUF block's grid whenever the block used its extreme codes), q8 its largest magnitude.

Each forward quantizes its input to int8 per row and block of 32 (GGUF's Q8_0 for activations, as llama.cpp
does). The output is float32 and a row's
values do not depend on the other rows of the call (kernels.c), so speculative passes over several tokens give
each token exactly the one-token logits: greedy output stays bit-identical to plain decoding of the same
quantized model."""
from __future__ import annotations

import torch
from torch import nn

from specdecode.backends.cpu import native

BLOCK = 32  # inputs per quantization block
GROUP = 8  # output columns packed together
FORMATS = ("q4", "q8")


def packable(linear: nn.Linear) -> bool:
    """Whether a linear layer's shape fits the packed layout (inputs in blocks of 32, outputs in groups of 8)."""
    return linear.in_features % BLOCK == 0 and linear.out_features % GROUP == 0


def quantize_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> codes [N, K/32, 32] uint8, d [N, K/32] fp16, m [N, K/32] fp16 (value = d * c + m)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    low, high = blocks.amin(-1), blocks.amax(-1)
    d = ((high - low) / 15).half()
    m = low.half()
    step = d.float().clamp(min=torch.finfo(torch.float16).tiny)[..., None]
    codes = ((blocks - m.float()[..., None]) / step).round_().clamp_(0, 15).to(torch.uint8)
    return codes, d, m


def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> codes [N, K/32, 32] int8, d [N, K/32] fp16 (value = d * c)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    d = (blocks.abs().amax(-1) / 127).half()
    step = d.float().clamp(min=torch.finfo(torch.float16).tiny)[..., None]
    codes = (blocks / step).round_().clamp_(-127, 127).to(torch.int8)
    return codes, d


class PackedLinear(nn.Module):
    """nn.Linear with q4 or q8 weights packed for kernels.c; float32 in and out."""

    threaded = True  # forward takes a thread count (decoder.py passes CpuShare's)

    def __init__(self, linear: nn.Linear, fmt: str):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown packed format {fmt!r}")
        if not packable(linear):
            raise ValueError(f"a {linear.in_features} -> {linear.out_features} layer does not fit the packed layout")
        self.fmt, self.in_features, self.out_features = fmt, linear.in_features, linear.out_features
        n, k = linear.out_features, linear.in_features
        groups, blocks = n // GROUP, k // BLOCK
        if fmt == "q4":
            codes, d, m = quantize_q4(linear.weight)
            nibbles = codes[..., :16] | (codes[..., 16:] << 4)  # [N, K/32, 16]: j low, j + 16 high
            self.register_buffer("codes", _interleave(nibbles, groups, blocks))
            self.register_buffer("d", d.reshape(groups, GROUP, blocks).transpose(1, 2).contiguous())
            self.register_buffer("m", m.reshape(groups, GROUP, blocks).transpose(1, 2).contiguous())
        else:
            codes, d = quantize_q8(linear.weight)
            self.register_buffer("codes", _interleave(codes, groups, blocks))
            self.register_buffer("d", d.reshape(groups, GROUP, blocks).transpose(1, 2).contiguous())
            self.m = None
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float().clone(),
                                                                  requires_grad=False)
        self.variant = native.variant_index()  # the kernels this CPU runs, chosen once (forward)

    @classmethod
    def from_packed(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
                    bias: torch.Tensor | None) -> PackedLinear:
        """A layer from tensors a PackedLinear held (loading/packed_cache.py), without float weights."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        groups, blocks = codes.shape[:2]
        layer.fmt = "q4" if m is not None else "q8"
        layer.in_features, layer.out_features = blocks * BLOCK, groups * GROUP
        layer.register_buffer("codes", codes)
        layer.register_buffer("d", d)
        if m is not None:
            layer.register_buffer("m", m)
        else:
            layer.m = None
        layer.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        layer.variant = native.variant_index()
        return layer

    def splits(self, sizes: tuple[int, ...]) -> bool:
        """Whether `split(sizes)` can cut this layer: the sizes add up to its outputs, each a whole number of
        column groups."""
        return sum(sizes) == self.out_features and all(size % GROUP == 0 for size in sizes)

    def split(self, sizes: tuple[int, ...]) -> list[PackedLinear]:
        """The layer's outputs cut into consecutive layers of `sizes` columns (a fused projection's parts: Phi-3's
        qkv_proj, gate_up_proj), each a view of this layer's packed groups and its bias, not a copy."""
        if not self.splits(sizes):
            raise ValueError(f"{self.out_features} outputs do not split into {sizes} in groups of {GROUP}")
        parts, start = [], 0
        for size in sizes:
            rows = slice(start // GROUP, (start + size) // GROUP)
            parts.append(PackedLinear.from_packed(self.codes[rows], self.d[rows],
                                                  None if self.m is None else self.m[rows],
                                                  None if self.bias is None else self.bias.data[start:start + size]))
            start += size
        return parts

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight [N, K] in float32, made on demand: for code that reads a layer's weight (an
        EAGLE head copies rows of the target's), never on the decoding path."""
        if self.fmt == "q4":
            nibbles = _deinterleave(self.codes)  # [G, B, 8, 16]
            codes = torch.cat([nibbles & 15, nibbles >> 4], -1).float()  # [G, B, 8, 32]
            values = codes * self.d.float()[..., None] + self.m.float()[..., None]
        else:
            values = _deinterleave(self.codes).float() * self.d.float()[..., None]
        return values.transpose(1, 2).reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, threads: int = 0) -> torch.Tensor:
        # x: [..., K] -> [..., N]; threads: 0 = torch's setting
        flat = x.reshape(-1, self.in_features)
        # the operator itself (native.ops() loaded it; the variant is this layer's), so torch.compile traces this
        # call alone: packed_matmul's cached lookups (native.ops, variant_index) would be traced too, each warned of
        out = torch.ops.specdecode_native.packed_matmul(flat, self.codes, self.d, self.m, threads, self.variant)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.fmt}"


def _interleave(codes: torch.Tensor, groups: int, blocks: int) -> torch.Tensor:
    """codes [N, K/32, L] (a block's L bytes per column) -> [N/8, K/32, 8 L] in kernels.c's order: the group's 8
    columns interleaved 4 bytes at a time, byte 32 t + 4 c + i = column c's byte 4 t + i."""
    width = codes.shape[-1]
    words = codes.reshape(groups, GROUP, blocks, width // 4, 4)  # [G, c, B, t, i]
    return words.permute(0, 2, 3, 1, 4).reshape(groups, blocks, GROUP * width).contiguous()


def _deinterleave(packed: torch.Tensor) -> torch.Tensor:
    """_interleave's inverse: [N/8, K/32, 8 L] -> [N/8, K/32, 8, L] (group, block, column, byte)."""
    groups, blocks, size = packed.shape
    words = packed.reshape(groups, blocks, size // (4 * GROUP), GROUP, 4)  # [G, B, t, c, i]
    return words.permute(0, 1, 3, 2, 4).reshape(groups, blocks, GROUP, size // GROUP)


def packed_matmul(flat: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
                  threads: int = 0, variant: str | None = None) -> torch.Tensor:
    """flat [rows, K] float -> [rows, N] float32 through kernels.c (m None: q8 weights, else q4) on `threads`
    threads (0: torch's setting), in the kernel `variant` (None: the best for this CPU; native.VARIANTS)."""
    return native.ops().packed_matmul(flat, codes, d, m, threads, native.variant_index(variant))


def quantize_activations(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flat [rows, K] -> codes [rows, K] int8, scales [rows, K/32], scaled code sums [rows, K/32] (the q4
    offset term), as the kernels quantize a layer's input."""
    return native.ops().quantize_activations(flat, native.variant_index())


class HalfEmbedding(nn.Module):
    """nn.Embedding with its table in float16 (half the memory; a quantized model's input embeddings are the
    largest float tensor left), looked up and returned in float32, times the embedding's own scale where it has
    one (Gemma's embeddings are scaled by sqrt(hidden) in their module's forward)."""

    def __init__(self, embedding: nn.Embedding | None = None, table: torch.Tensor | None = None,
                 padding_idx: int | None = None, scale: float | None = None):
        super().__init__()
        if embedding is not None:
            table, padding_idx = embedding.weight.detach().to(torch.float16).contiguous(), embedding.padding_idx
            found = getattr(embedding, "embed_scale", None)
            scale = None if found is None else float(found)
        self.register_buffer("table", table)  # [vocab, D] float16
        self.num_embeddings, self.embedding_dim = table.shape
        self.padding_idx, self.scale = padding_idx, scale

    @property
    def weight(self) -> torch.Tensor:
        return self.table.float()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [...] -> [..., D]
        looked_up = nn.functional.embedding(ids, self.table).float()
        return looked_up if self.scale is None else looked_up * self.scale


def pack_model(model: nn.Module, fmt: str | None = None, head_fmt: str | None = None,
               by_path: dict[str, str | None] | None = None) -> int:
    """Replace, in place, every nn.Linear of `model` that fits the layout by a PackedLinear, and float32 input
    embeddings by a HalfEmbedding -> layers packed. The format is `fmt` (the output head's `head_fmt`, default
    `fmt`), or with `by_path` the one it gives the layer's module path or a suffix of it ("layers.3.mlp.up_proj",
    "lm_head"; None keeps that layer float: weights.gguf_formats)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    packed = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not (isinstance(child, nn.Linear) and packable(child)):
                continue
            if by_path is not None:
                path = f"{parent_name}.{name}" if parent_name else name
                layer_fmt = next((f for suffix, f in by_path.items() if path == suffix or path.endswith("." + suffix)),
                                 None)
            else:
                layer_fmt = (head_fmt or fmt) if child is head else fmt
            if layer_fmt is not None:
                setattr(parent, name, PackedLinear(child, layer_fmt))
                packed += 1
    if packed and hasattr(model, "get_input_embeddings"):
        embeddings = model.get_input_embeddings()
        if isinstance(embeddings, nn.Embedding) and embeddings.weight.dtype == torch.float32:
            model.set_input_embeddings(HalfEmbedding(embeddings))
    return packed
