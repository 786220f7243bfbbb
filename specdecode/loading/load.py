"""Load a model as configured (config.ModelConfig): find it (names.py), convert a GGUF once (gguf.py), read a
packed copy or pack its linear layers into the chosen format (formats.py, packed_cache.py), and give the model
the attention its format needs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdecode.backends.attention import EXACT_NAME
from specdecode.backends.cpu.linear import PackedLinear
from specdecode.backends.cpu.native import missing as native_missing
from specdecode.config import ModelConfig
from specdecode.errors import ConfigError, ModelError, first_line
from specdecode.loading import packed_cache
from specdecode.loading.formats import FLOAT_DTYPES, QUANTIZED, WeightsError, resolve
from specdecode.loading.formats import apply as apply_weights
from specdecode.loading.names import DEFAULT_MODEL, canonical_name, gguf_source, resolve_model, resolve_model_dir
from specdecode.loading.packages import default_dtype, default_weights, fallback_weights
from specdecode.paths import cache_root


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module  # a transformers causal LM, eval mode
    tokenizer: object  # a transformers tokenizer
    name: str


def load_model(config: ModelConfig) -> LoadedModel:
    """Load a causal LM and its tokenizer as `config` says: its dtype (None: the model's own on the device,
    packages.default_dtype) and its linear layers' format (formats.py). Its KV cache and fast path are the
    Target's business."""
    spec, device, dtype = config.name, config.device, config.dtype
    fmt = resolve_weights(config)
    if fmt in FLOAT_DTYPES:
        if dtype is not None and parse_dtype(dtype) != parse_dtype(FLOAT_DTYPES[fmt]):
            raise ModelError(f"weights {fmt} contradict dtype {dtype}")
        dtype = FLOAT_DTYPES[fmt]
    gguf_file = gguf_source(spec) if fmt == "gguf" else None
    torch_dtype = parse_dtype(dtype if dtype is not None else model_dtype(spec, device))
    if fmt in QUANTIZED and torch_dtype != torch.float32:
        raise ModelError(f"{fmt} weights decode with float32 activations; drop --dtype {dtype}")
    packs = fmt in QUANTIZED and native_missing() is None  # a packed copy is kept, never the float weights
    source, converted = resolve_model(spec, torch_dtype, weights=not packs)
    packed_path = _packed_path(source, fmt, gguf_file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = packed_cache.load(packed_path, source) if packed_path and packed_path.is_file() else None
        model = converted if model is None else model
        if model is None:  # the float weights are read: check them first
            source = resolve_model_dir(spec, torch_dtype) if fmt in QUANTIZED else source
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except (OSError, ValueError) as error:
        raise ModelError(f"could not load model {spec or DEFAULT_MODEL!r}: {first_line(error)}") from error
    model.to(device).eval()
    if fmt in QUANTIZED:
        if not any(isinstance(module, PackedLinear) for module in model.modules()):
            apply_weights(model, fmt, gguf_file)
            _own_tensors(model)
            if packed_path and any(isinstance(module, PackedLinear) for module in model.modules()):
                packed_cache.save(model, packed_path)
        exact_attention(model)
    return LoadedModel(model=model, tokenizer=tokenizer, name=canonical_name(spec) or spec)


def _packed_path(source: str, fmt: str, gguf_file: Path | None) -> Path | None:
    """Where a packed copy of the model is cached (packed_cache.py); None: the format is not packed here."""
    if fmt not in QUANTIZED or native_missing() is not None:
        return None
    extra = "" if gguf_file is None else f"{gguf_file.resolve()}|{gguf_file.stat().st_size}"
    return packed_cache.path_for(source, fmt, cache_root(), extra)


def exact_attention(model: torch.nn.Module) -> None:
    """Switch a quantized model's SDPA attention to attention.row_exact_forward, so that a verify pass gives
    every token its one-token logits bit for bit (int8 activations amplify SDPA's row-count-dependent rounding
    into different tokens)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = EXACT_NAME


def _own_tensors(model: torch.nn.Module) -> None:
    """Copy every parameter and buffer into memory of its own. Loaded weights are views of the safetensors file
    mapped whole; once the linears are quantized copies, the few float tensors left (embeddings, norms) would
    keep the whole fp32 file mapped: 6.1 GB of resident file pages for the 1.5B, against 1.9 GB of its own
    (measured with /proc/self/status RssFile / RssAnon)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()


def resolve_weights(config: ModelConfig) -> str:
    """The format the model's linear layers get (formats.resolve); a choice that cannot be honoured is one
    line."""
    try:
        name = canonical_name(config.name)
        return resolve(config.weights, default_weights(name, config.device), config.device,
                       fallback=fallback_weights(name))
    except WeightsError as error:
        raise ModelError(str(error)) from None


def check_kv_half(config: ModelConfig) -> None:
    """Refuses an fp16 KV cache (config.kv_half) before a model loads where its weights will not be packed (a
    float format, or not the CPU): only the native decoder stores fp16 keys and values. Target checks again once
    the model is loaded (an architecture layers.c cannot run)."""
    if not config.kv_half:
        return
    fmt = resolve_weights(config)
    why = (f"device {config.device}" if config.on_cuda
           else f"weights {fmt} are not packed" if fmt not in QUANTIZED else None)
    if why:
        raise ConfigError("an fp16 KV cache needs the native decoder (a packed Llama or Qwen2 model on the CPU): "
                          f"{why}")


def model_dtype(spec: str | None, device: str = "cpu") -> str:
    """The dtype `spec` loads in when none is given."""
    return default_dtype(canonical_name(spec), device)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]
