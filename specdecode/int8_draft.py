"""Int8 weights for a draft model on the CPU: a cheaper draft at no cost to exactness.

A draft's tokens only decide how many of them the target accepts; the target verifies every one, so the draft
may compute more roughly than the target (with sampling, q is the distribution the int8 draft really drew
from, so rejection sampling stays exact). On the CPU a draft pass is bound by reading its weights: int8 weights
are a quarter of fp32's bytes. Measured over all 211 linear layers of SmolLM2-135M (fp32, 2 threads, ms per
sweep, 2026-11-23): our fp32 kernel (cpu_gemm) 20.0 / 18.6 / 32.7 / 43.6 at 1 / 2 / 4 / 8 rows, dynamic int8
linears 12.9 / 10.4 / 14.8 / 10.8; a whole one-token draft pass 29.0 -> 19.1 ms (the rest is attention,
norms and Python, which int8 does not touch).

The kernel is PyTorch's dynamic quantization (`torch.ao`, fbgemm: int8 weights, activations quantized per call,
weights per output channel). torch marks `torch.ao` quantization for migration to torchao, whose CPU int8
paths need torch.compile to be fast; so we use torch.ao while it exists and fall back to the full-precision
draft, with a one-line warning, where it does not."""
from __future__ import annotations

import warnings

import torch
from torch import nn


def available() -> bool:
    """Whether this torch build can run dynamic int8 linears (fbgemm or another quantized engine)."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic  # noqa: F401
    except ImportError:
        return False
    return any(engine != "none" for engine in torch.backends.quantized.supported_engines)


def quantize_linears(model: nn.Module) -> bool:
    """Replace every nn.Linear of `model` (a CPU model) by a dynamic int8 linear, in place -> whether it did.
    Embeddings and norms stay as they are (a tied output head gets its own int8 copy)."""
    if next(model.parameters()).device.type != "cpu" or not available():
        return False
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao's deprecation notice, once per module: see the docstring
        warnings.simplefilter("ignore")
        quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    return True


CHOICES = ("auto", "int8", "same")  # DrafterConfig.draft_weights / --draft-weights


def wants_int8(choice: str, device: torch.device) -> bool:
    """Whether a draft model on `device` gets int8 weights: "auto" = on the CPU when torch can (measured faster
    there, see the docstring), "int8" = must (a clear error where it cannot), "same" = the target's dtype."""
    from .config import ConfigError

    if choice not in CHOICES:
        raise ConfigError(f"--draft-weights must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "same":
        return False
    usable = device.type == "cpu" and available()
    if choice == "int8" and not usable:
        where = "this torch build has no quantized engine" if device.type == "cpu" else f"not on {device.type}"
        raise ConfigError(f"--draft-weights int8 needs dynamic int8 linears on the CPU ({where})")
    return usable
