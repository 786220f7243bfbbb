"""Which linear-weight format a model decodes with (`--weights`, `--draft-weights`), and applying it.

  fp32 / bf16   every weight in that float dtype (torch's kernels)
  int8          linear layers q8 (blocks of 32, int8 activations: backends/cpu/linear.py); where the native
                kernel cannot run, torch's per-channel int8 kernel (backends/cpu/int8.py)
  int4          linear layers q4, the output head q8 (the head decides every token: llama.cpp's Q4_K_M keeps
                it at 6 bits too)
  int4-all      every linear layer q4, the head too: a draft model's default on the CPU, where the head is
                ~a third of a 0.5B's pass in q8 (151,936 x 896) and only ranks what the target then verifies
  gguf          each linear layer in the format nearest its GGUF tensor's own: 4-bit types q4, 5- to 8-bit q8,
                float tensors stay float (needs a GGUF model)
  same          linear weights in the model's dtype (--dtype)
  auto          the model's own choice on the device (packages.default_weights)
The quantized model IS the target: speculation over it is lossless with respect to it."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from gguf import GGUFReader
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.int8 import Int8Linear, kernel_missing, quantize_linears
from specdecode.backends.cpu.linear import PackedLinear, pack_model
from specdecode.config import DRAFT_WEIGHTS, WEIGHTS
from specdecode.errors import OptionError

QUANTIZED = ("int8", "int4", "int4-all", "gguf")  # formats that quantize the linear layers (float32 activations)
FLOAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
_Q4_TYPES = ("Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS")
_GGUF_MODULES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
# architectures whose GGUF tensors hold fused projections (llama.cpp's names; transformers' modules)
_GGUF_FUSED = {"phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}}


class WeightsError(ValueError):
    """A weight format that cannot be used here; the message is one line for the user."""


def check(choice: str, choices: tuple[str, ...] = WEIGHTS, what: str = "weights") -> str:
    if choice not in choices:
        raise WeightsError(f"{what} must be one of {', '.join(choices)}, got {choice!r}")
    return choice


def resolve(choice: str, default: str, device: str, *, what: str = "weights", fallback: str = "int8") -> str:
    """The format to apply: "auto" becomes `default` (the model's own; a quantized default the device cannot
    run falls back to `fallback` where that runs, else "same"), an explicit quantized choice the device cannot
    run is a WeightsError."""
    check(choice, WEIGHTS if what == "weights" else DRAFT_WEIGHTS, what)
    chosen = default if choice == "auto" else choice
    if chosen not in QUANTIZED:
        return chosen
    reason = unavailable(chosen, device)
    if reason is None:
        return chosen
    if choice == "auto":
        usable = fallback == "int8" and chosen != "int8" and unavailable("int8", device) is None
        return "int8" if usable else "same"
    raise WeightsError(f"{what} {chosen}: {reason}")


def unavailable(fmt: str, device: str) -> str | None:
    """Why `fmt` cannot run on `device` (None: it can)."""
    if not device.startswith("cpu"):
        return f"quantized weights run on the CPU only, not on {device}"
    missing = native.missing()
    if missing is None:
        return None
    if fmt == "int8":
        return None if kernel_missing(torch.device("cpu")) is None else missing
    return missing


def apply(model: nn.Module, fmt: str, gguf_file: Path | None = None) -> str:
    """Quantize `model`'s linear layers in place to `fmt` (a resolved choice) -> what it now decodes with."""
    if fmt in ("same", "fp32", "bf16"):
        return fmt
    if fmt in ("int4", "int4-all"):
        pack_model(model, "q4", head_fmt="q8" if fmt == "int4" else "q4")
    elif fmt == "int8" and native.missing() is None:
        pack_model(model, "q8")
    elif fmt == "int8":
        quantize_linears(model)
    elif fmt == "gguf":
        if gguf_file is None:
            raise WeightsError("weights gguf need a GGUF model (a packaged model or a .gguf file)")
        pack_model(model, by_path=gguf_formats(gguf_file))
    return fmt


def gguf_formats(path: Path) -> dict[str, str | None]:
    """Module-path suffix ("layers.3.self_attn.q_proj", "lm_head") -> "q4", "q8" or None (float), read from the
    GGUF's tensor types (the file is mapped, not read)."""
    formats: dict[str, str | None] = {}
    reader = GGUFReader(str(path))
    architecture = reader.fields["general.architecture"].contents() if "general.architecture" in reader.fields else ""
    modules = {**_GGUF_MODULES, **_GGUF_FUSED.get(architecture, {})}
    types = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    for name, kind in types.items():
        fmt = None if kind in ("F32", "F16", "BF16") else "q4" if kind in _Q4_TYPES else "q8"
        match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
        if match and match.group(2) in modules:
            formats[f"layers.{match.group(1)}.{modules[match.group(2)]}"] = fmt
    head = types.get("output.weight", types.get("token_embd.weight"))  # a tied head is the embeddings
    if head is not None:
        formats["lm_head"] = None if head in ("F32", "F16", "BF16") else "q4" if head in _Q4_TYPES else "q8"
    return formats


def describe(model: nn.Module) -> str:
    """What a loaded model's linear layers are: "int4", "int8", "q4+q8" (mixed), or its dtype."""
    formats = {m.fmt for m in model.modules() if isinstance(m, PackedLinear)}
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        return "int8"
    if formats:
        return "+".join(sorted(formats))
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def draft_format(choice: str, device: torch.device) -> str:
    """The weight format a draft model on `device` gets (see above): "auto" = int4-all on the CPU (the
    cheapest draft pass, its head in 4 bits too: docs/design-notes.md), int8 where only torch's int8 kernel can
    run, else the target's dtype ("same"); "int8" / "int4" / "int4-all" = must (a clear error where they cannot
    run)."""
    if choice not in DRAFT_WEIGHTS:
        raise OptionError(f"{{draft_weights}} must be one of {', '.join(DRAFT_WEIGHTS)}, got {choice!r}",
                          "draft_weights")
    default = "int4-all" if device.type == "cpu" else "same"
    try:
        return resolve(choice, default, str(device), what="draft_weights")
    except WeightsError as error:
        raise OptionError("{draft_weights}" + str(error).removeprefix("draft_weights"), "draft_weights") from None
