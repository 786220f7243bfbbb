"""A packed model saved once and loaded again without its float weights.

Packing reads the model's float32 copy first: for the Qwen 1.5B ~13 s and a 9.2 GB peak (the float weights
plus the packed ones), against ~1.3 GB packed. So the first load of a model in a format saves its packed
tensors to the user cache, and later loads build the model's modules on the meta device (no memory), put the
saved tensors in place and never read the float copy: a few seconds, and a peak about the packed size.

The file is `torch.save` of plain tensors (loaded with `weights_only=True`, read into memory rather than
mapped, so its pages do not count twice). Its name hashes the source (the converted copy's manifest of
SHA-256s less the weights', or a directory's file names, sizes and times), the format and this packing's code,
so a changed model or packing never reads a stale file; an unreadable file is rebuilt."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from specdecode.backends.cpu import linear
from specdecode.backends.cpu.linear import HalfEmbedding, PackedLinear
from specdecode.loading.gguf import MANIFEST
from specdecode.paths import write_whole

FORMAT = 2
_CODE = (Path(linear.__file__),)  # the packing code: a change to it names new copies


def path_for(source: str, fmt: str, root: Path, extra: str = "") -> Path | None:
    """Where the packed copy of the model in directory `source` lives (None: not a local directory)."""
    directory = Path(source)
    if not directory.is_dir():
        return None
    manifest = directory / MANIFEST
    if manifest.is_file():
        fingerprint = _without_weights(manifest.read_text())
    else:
        fingerprint = json.dumps(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                                        for p in directory.iterdir() if p.is_file()))
    digest = hashlib.sha256()
    for part in (str(directory.resolve()), fingerprint, fmt, extra, str(FORMAT), *(p.read_text() for p in _CODE)):
        digest.update(part.encode() + b"\0")
    return root / "packed" / f"{_stem(directory, fmt, extra)}-{digest.hexdigest()[:16]}.pt"


def _without_weights(manifest: str) -> str:
    """A converted copy's manifest less its weights' entries: a copy converted for a packed format has none
    (loading/gguf.py), and writing them later for a float load must not make its packed copies stale. The weights are
    the source GGUF's, which the directory's name and the manifest's other entries already fix."""
    try:
        data = json.loads(manifest)
        data["files"] = {name: digest for name, digest in data["files"].items() if not name.endswith(".safetensors")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return manifest
    return json.dumps(data, sort_keys=True)


def _stem(directory: Path, fmt: str, extra: str) -> str:
    """What every copy of one model in one format shares, whatever the model files' or packing code's version."""
    where = hashlib.sha256(f"{directory.resolve()}|{extra.partition('|')[0]}".encode()).hexdigest()[:8]
    return f"{directory.name}-{fmt}-{where}"


def _stale(path: Path) -> list[Path]:
    """Older copies of the model `path` is for: the same stem, another digest (a changed model or packing code),
    or the name an earlier version gave them (the stem without its location part, then the digest)."""
    stem = path.stem.rsplit("-", 1)[0]
    legacy = stem.rsplit("-", 1)[0]  # "<model>-<format>"
    found = []
    for other in path.parent.glob(f"{legacy}-*.pt"):
        parts = other.stem[len(legacy) + 1:].split("-")
        same_model = parts[0] == stem.rsplit("-", 1)[1] and len(parts) == 2
        if other != path and (same_model or (len(parts) == 1 and len(parts[0]) == 16)):
            found.append(other)
    return found


def save(model: nn.Module, path: Path) -> bool:
    """Write the packed model's tensors to `path` atomically -> whether it was written (a full disk is not an
    error: the next load packs again). Older copies of the same model and format are deleted: each is as large
    as the model in its format (1.5 GB for the Qwen 1.5B in int4), and nothing reads them again."""
    packed, half, skip = {}, {}, set()
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear):
            packed[name] = (module.codes, module.d, module.m, None if module.bias is None else module.bias.data)
            skip.update(f"{name}.{key}" for key in ("codes", "d", "m", "bias"))
        elif isinstance(module, HalfEmbedding):
            half[name] = (module.padding_idx, module.scale)
    tensors = {key: value for key, value in model.state_dict().items() if key not in skip}
    persistent = set(model.state_dict())
    buffers = {key: value for key, value in model.named_buffers() if key not in persistent}
    saved = {"format": FORMAT, "packed": packed, "half": half, "tensors": tensors, "buffers": buffers}
    if not write_whole(path, lambda staging: torch.save(saved, staging)):
        return False
    for old in _stale(path):
        try:
            old.unlink()
        except OSError:  # another process's, or gone already
            pass
    return True


def load(path: Path, source: str) -> nn.Module | None:
    """The packed model saved at `path` for the model in `source`, eval mode (None: no usable file)."""
    try:
        data = torch.load(path, weights_only=True, mmap=False)
        if data.get("format") != FORMAT:
            return None
        config = AutoConfig.from_pretrained(source)
    except Exception:  # a partial, corrupt or foreign file: pack again  # noqa: BLE001
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = dict(data["tensors"])
    for name, (codes, d, m, bias) in data["packed"].items():
        _replace(model, name, PackedLinear.from_packed(codes, d, m, bias))
    for name, (padding_idx, scale) in data["half"].items():
        _replace(model, name, HalfEmbedding(table=tensors.pop(f"{name}.table"), padding_idx=padding_idx, scale=scale))
    result = model.load_state_dict(tensors, strict=False, assign=True)
    if result.unexpected_keys:
        return None
    for name, value in data["buffers"].items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner).register_buffer(leaf, value, persistent=False)
    for module in model.modules():  # e.g. a rotary embedding's copy of its inverse frequencies
        if getattr(module, "original_inv_freq", None) is not None and module.original_inv_freq.is_meta:
            module.original_inv_freq = module.inv_freq.clone()
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        return None
    try:
        model.generation_config = GenerationConfig.from_pretrained(source)
    except OSError:
        model.generation_config = GenerationConfig.from_model_config(config)
    return model.eval()


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, leaf, module)
