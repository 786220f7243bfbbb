"""torch's int8 kernel: where the packed layers (linear.py) cannot run (no x86-64 with AVX2, no C compiler),
int8 weights (loading/formats.py) are Int8Linear below.

A cheaper draft costs nothing in exactness.
A draft's tokens only decide how many of them the target accepts; the target verifies every one, so the draft
may compute more roughly than the target (with sampling, q is the distribution the int8 draft really drew
from, so rejection sampling stays exact). On the CPU a draft pass is bound by reading its weights, and int8
weights are a quarter of fp32's bytes.

Weight-only int8 (per output channel), activations in bf16: `torch._weight_int8pack_mm`, the CPU kernel
torchao and gpt-fast use for int8 weights. On SmolLM2-135M it made a one-token pass about three times faster
than transformers' fp32 forward, and still well ahead of fp32 with the few-row kernel (skinny.py); its greedy
choices, teacher-forced over answer tokens, agreed with the fp32 model's nearly as often as a bf16 copy's did.
We first used PyTorch's dynamic quantization (`torch.ao`, int8 activations with one scale per call): as fast,
but agreeing less than half as often (the MLP down projections' inputs have outliers that one activation scale
cannot hold), which would throw away most of a good draft's acceptance (docs/design-notes.md, "Weights and
dtypes": "Draft models ran in int8 on the CPU").

Where the kernel is missing (it is a private op of torch) the draft keeps full precision: `available()`."""
from __future__ import annotations

import torch
from torch import nn

ACTIVATION_DTYPE = torch.bfloat16  # the kernel's activation and scale dtype


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights, one bf16 scale per output channel; x is cast to bf16 and back."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(1).clamp(min=1e-12) / 127  # [out]
        self.register_buffer("weight_int8", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(ACTIVATION_DTYPE))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight [out, in] in float32, made on demand: for code that reads a head's weight
        (EAGLE's draft head copies rows of the target's), never on the decoding path."""
        return self.weight_int8.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features).to(ACTIVATION_DTYPE)
        out = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def available() -> bool:
    """Whether this torch build has the int8-weight CPU kernel (checked by running it once)."""
    try:
        probe = Int8Linear(nn.Linear(8, 4))
        return probe(torch.ones(1, 8)).shape == (1, 4)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def quantize_linears(model: nn.Module) -> bool:
    """Replace every nn.Linear of `model` (a CPU model; `wants_int8` decides whether to) by an Int8Linear, in
    place -> whether there was any. Embeddings and norms stay as they are (a tied output head gets its own int8
    copy)."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child))
                replaced += 1
    return replaced > 0


def kernel_missing(device: torch.device) -> str | None:
    """Why int8 weights cannot run on `device` (None: they can): the kernel is a CPU op of torch's."""
    if device.type != "cpu":
        return f"not on {device.type}"
    return None if available() else "this torch build lacks the kernel"
