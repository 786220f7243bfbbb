"""The native kernels of the quantized linear layers (kernels.c) and decoder layers (layers.c): built at install
by setup.py, reached as torch operators (ops.cpp, namespace specdecode_native), run in the variant this CPU's
features call for.

Why a kernel of our own: on the AVX2 CPUs we decode on, torch's weight-only kernels (`_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`) dequantise weights to bf16 and multiply in emulated bf16, which is compute-bound
far below the memory bandwidth: a 1.5B pass took about nine times as long as llama.cpp takes to read the same
file's weights. kernels.c multiplies int8 activations by 4- or 8-bit weights with integer instructions, as
llama.cpp does, and reads the weights at close to the memory bandwidth (docs/design-notes.md, "Quantized
weights"). torchao's CPU kernels for int4 are the same torch ops on x86 (its dynamic-activation kernels target
ARM).

One build holds every variant (native.h): AMX, VNNI and AVX-512 VNNI builds use their integer dot-product
instructions and give the AVX2 build's outputs bit for bit (kernels.c); the portable build (SIMDe's plain-C
intrinsics) runs on CPUs without AVX2. Nothing is compiled at run time. The library is linked against OpenMP and
loaded after torch, so it shares torch's OpenMP runtime (same soname): its threads are torch's and
`torch.set_num_threads` governs both."""
from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path

import torch

_OPENMP_LOADED_BY = torch.__name__  # torch loads its OpenMP runtime, which the kernel library then shares

# in order of preference, the CPU flags (/proc/cpuinfo) each variant needs; setup.py has their compiler flags
X86 = ("avx2", "fma", "f16c")
VARIANTS = {"amx": (*X86, "amx_tile", "amx_int8", "avx512f", "avx_vnni"),
            "vnni": (*X86, "avx_vnni"),
            "avx512_vnni": (*X86, "avx512_vnni", "avx512vl"),
            "avx2": X86,
            "portable": ()}
CHOICE = "SPECDECODE_KERNELS"  # environment: run this variant (a key of VARIANTS) rather than the best


class KernelUnavailable(RuntimeError):
    """The native kernels cannot run on this machine; the message says why, in one line."""


@functools.cache
def ops():
    """The kernels' torch operators (torch.ops.specdecode_native), loaded once (raises KernelUnavailable)."""
    try:
        importlib.import_module("specdecode.backends.cpu._native")
    except ImportError as error:
        raise KernelUnavailable(f"the native kernels were not built at install ({error}; `make setup` builds them "
                                f"and says why when it cannot)") from None
    return torch.ops.specdecode_native


@functools.cache
def built() -> tuple[str, ...]:
    """The variants this build holds, in order of preference."""
    return tuple(ops().variants())


def lacking(variant: str) -> str | None:
    """Why this CPU or build cannot run `variant` (None: it can)."""
    if variant not in VARIANTS:
        return f"unknown kernel variant {variant!r} (one of {', '.join(VARIANTS)})"
    if variant not in built():
        return f"the {variant} kernels are not in this build (built: {', '.join(built())})"
    needs = [flag for flag in VARIANTS[variant] if flag not in cpu_flags()]
    if needs:
        return f"the {variant} kernels need a CPU with {', '.join(needs)}"
    return None


def best_variant() -> str:
    """The variant to run: $SPECDECODE_KERNELS where set, else the fastest this CPU runs (raises
    KernelUnavailable)."""
    chosen = os.environ.get(CHOICE)
    if chosen:
        reason = lacking(chosen)
        if reason:
            raise KernelUnavailable(f"{CHOICE}={chosen}: {reason}")
        return chosen
    runnable = [variant for variant in built() if lacking(variant) is None]
    if not runnable:
        raise KernelUnavailable(f"no kernel variant of this build ({', '.join(built())}) runs on this CPU")
    return runnable[0]


def variant_index(variant: str | None = None) -> int:
    """The operators' `variant` argument for `variant` (None: best_variant(), chosen once); raises
    KernelUnavailable."""
    if variant is None:
        return _best_index()
    reason = lacking(variant)
    if reason:
        raise KernelUnavailable(reason)
    return built().index(variant)


@functools.cache
def _best_index() -> int:
    return variant_index(best_variant())


def missing() -> str | None:
    """Why the kernels cannot run here (None: they can); the reason is one line for the user."""
    try:
        best_variant()
    except KernelUnavailable as error:
        return str(error)
    return None


@functools.cache
def _cpuinfo(field: str) -> str:
    """The first `field` line's value in Linux's /proc/cpuinfo ("" where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo has none)."""
    return frozenset(_cpuinfo("flags").split())


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC" on the Zen 4 VM; "" where /proc/cpuinfo has none)."""
    return _cpuinfo("model name")


def describe() -> str:
    """One line on what this machine runs: the variant and the build's others, or why none."""
    reason = missing()
    if reason:
        return f"native kernels: unavailable ({reason}); packed models use torch's int8 kernel"
    return f"native kernels: {best_variant()} (built: {', '.join(built())})"
