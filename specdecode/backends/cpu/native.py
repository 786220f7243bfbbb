"""The native kernels of the quantized linear layers (kernels.c) and decoder layers (layers.c), compiled on first
use and loaded with ctypes.

Why a kernel of our own: on the AVX2 CPUs we decode on, torch's weight-only kernels (`_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`) dequantise weights to bf16 and multiply in emulated bf16, which is compute-bound
far below the memory bandwidth: a 1.5B pass took about nine times as long as llama.cpp takes to read the same
file's weights. kernels.c multiplies int8 activations by 4- or 8-bit weights with integer instructions, as
llama.cpp does, and reads the weights at close to the memory bandwidth (docs/design-notes.md, "Quantized
weights"). torchao's CPU kernels for int4 are the same torch ops on x86 (its dynamic-activation kernels target
ARM).

On CPUs with VNNI or AMX the same sources build with their integer dot-product instructions (VARIANTS); the
outputs are the AVX2 build's, bit for bit (kernels.c).

The library is built with the system C compiler ($CC, else cc) into the user cache, keyed by the source's hash,
and linked against OpenMP: opened after torch, it shares torch's OpenMP runtime (same soname), so its threads
are torch's and `torch.set_num_threads` governs both."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from specdecode.paths import cache_root

_OPENMP_LOADED_BY = torch.__name__  # torch loads its OpenMP runtime, which the kernel library then shares

SOURCES = tuple(Path(__file__).with_name(name) for name in ("kernels.c", "layers.c"))
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
_CPU_FLAGS = ("avx2", "fma", "f16c")
# integer dot products with AMX tiles for passes of a few rows or more (kernels.c: TILE_MIN_ROWS_*) and VNNI
# where the CPU has them (kernels.c: the same sums, so the same bits), else AVX-512 VNNI on 256-bit vectors, else
# AVX2; in order of preference, the CPU flags each needs and its compiler flags; each variant is its own cached build
VARIANTS = {"amx": (("amx_tile", "amx_int8", "avx512f", "avx_vnni"), ("-DTILES", "-mavxvnni")),
            "vnni": (("avx_vnni",), ("-mavxvnni",)),
            "avx512-vnni": (("avx512_vnni", "avx512vl"), ("-mavx512vnni", "-mavx512vl")),
            "avx2": ((), ())}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "quantize_activations": [_P, _I, _I, _P, _P, _P],
    "gemm_q4": [_P, _P, _P, _I, _I, _P, _P, _P, _I, _P, _I],
    "gemm_q8": [_P, _P, _I, _I, _P, _P, _I, _P, _I],
    "gemm_q4_on": [_P, _P, _P, _I, _I, _P, _P, _P, _I, _P, _I, _I],
    "gemm_q8_on": [_P, _P, _I, _I, _P, _P, _I, _P, _I, _I],
    "decoder_layer": [_P, _P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _P, _I],
    "decoder_layers": [_P, _I, _P, _I, _I, _P, _P, _P, _P, _P, _P, _I, _P, _I],
    "rms_norm_rows": [_P, _P, ctypes.c_float, _I, _I, _P],
}


def missing() -> str | None:
    """Why the kernel cannot run here (None: it can); the reason is one line for the user."""
    try:
        library()
    except KernelUnavailable as error:
        return str(error)
    return None


class KernelUnavailable(RuntimeError):
    """The native kernel cannot be built or run on this machine; the message says why, in one line."""


def best_variant() -> str:
    """The fastest build of the kernels this CPU runs (a key of VARIANTS)."""
    flags = _cpu_flags()
    return next(name for name, (needs, _) in VARIANTS.items() if all(flag in flags for flag in needs))


@functools.cache
def library(variant: str | None = None) -> ctypes.CDLL:
    """The loaded kernel library (None: the best variant for this CPU), built on first use (raises
    KernelUnavailable)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise KernelUnavailable(f"the quantized kernel needs an x86-64 CPU, this is {platform.machine()}")
    lacking = [flag for flag in _CPU_FLAGS if flag not in _cpu_flags()]
    if lacking:
        raise KernelUnavailable(f"the quantized kernel needs a CPU with {', '.join(lacking)}")
    if variant is None:  # the best this CPU runs, else (a compiler without its flags) the plain AVX2 build
        best = best_variant()
        try:
            return library(best)
        except KernelUnavailable:
            if best == "avx2":
                raise
            return library("avx2")
    needs, extra = VARIANTS[variant]
    lacking = [flag for flag in needs if flag not in _cpu_flags()]
    if lacking:
        raise KernelUnavailable(f"the {variant} kernels need a CPU with {', '.join(lacking)}")
    path = _build(extra)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelUnavailable(f"could not load the quantized kernel {path}: {error}") from None
    for name, argtypes in _SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = None
    return lib


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _build(extra: tuple[str, ...] = ()) -> Path:
    source = b"".join(path.read_bytes() for path in SOURCES)
    compiler = os.environ.get("CC", "cc")
    flags = (*FLAGS, *extra)
    key = hashlib.sha256(source + " ".join((compiler, *flags)).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"quant-{key}.so"
    if target.is_file():
        return target
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"the quantized kernel is compiled on first use and needs a C compiler "
                                f"({compiler!r} not found; set CC)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        built = Path(work) / target.name
        result = subprocess.run([compiler, *flags, "-o", str(built), *map(str, SOURCES)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            first = (result.stderr.strip().splitlines() or ["no output"])[0]
            raise KernelUnavailable(f"compiling the quantized kernel failed: {first}")
        os.replace(built, target)  # atomic: a concurrent build writes the same bytes
    return target
