"""A GGUF file converted once into a plain Hugging Face directory in the user cache, in the dtype it is loaded in.

The directory is written atomically (a staging directory renamed into place, its manifest of SHA-256s last) and
trusted only while every file matches the manifest, so a partial or corrupt copy is rebuilt. Its safetensors
weights are written only for a load that reads them: a packed format keeps its packed copy instead
(packed_cache.py), so the Qwen pair's first load writes ~2 GB instead of ~10."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from unittest import mock

import torch
from safetensors import SafetensorError
from safetensors.torch import save_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils

from specdecode.errors import ModelError, first_line
from specdecode.paths import cache_root

MANIFEST = "specdecode-manifest.json"


CACHE_FORMAT = 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_dir(gguf: Path, dtype: torch.dtype = torch.float32, size: int | None = None) -> Path:
    """One converted copy per GGUF and dtype (float32 keeps the key it always had). size: the file's pinned
    size, for a GGUF that need not exist (yet) to name its copy."""
    size = gguf.stat().st_size if size is None else size
    suffix = "" if dtype == torch.float32 else f"|{dtype}"
    key = hashlib.sha256(f"{gguf.resolve()}|{size}|{CACHE_FORMAT}{suffix}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{key}"


def cache_is_valid(directory: Path, weights: bool = True) -> bool:
    """A cache entry is valid only if its manifest exists and every file matches its recorded SHA-256.
    weights=False: every file but the weights (for a load that reads a packed copy instead: packed_cache.py)."""
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != CACHE_FORMAT:
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
        (staging / MANIFEST).write_text(json.dumps({"format": CACHE_FORMAT, "source": str(gguf),
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
    directory = gguf_cache_dir(gguf, dtype)
    if cache_is_valid(directory, weights):
        return directory, None
    try:
        return directory, _convert_gguf(gguf, directory, dtype, weights)
    # not a GGUF, one transformers cannot convert, or the copy cannot be written (a full disk)
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        raise ModelError(f"could not convert {str(gguf)!r}: {first_line(error)}") from error


def converted_gguf_dir(gguf: Path, dtype: torch.dtype = torch.float32, weights: bool = True) -> Path:
    """The cached HF copy of a GGUF in `dtype` (converted_gguf)."""
    return converted_gguf(gguf, dtype, weights)[0]


@contextmanager
def _bar_on_terminal_only() -> Iterator[None]:
    """transformers draws its GGUF conversion bar with a plain tqdm that ignores its own progress-bar switch;
    written to a log or a captured stderr it is ~20 lines, e.g. before a one-line error. Give it tqdm's
    disable=None (off unless stderr is a terminal) for the conversion only."""
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    with mock.patch.object(gguf_utils, "tqdm", partial(bar, disable=None)):
        yield
