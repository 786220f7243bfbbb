"""Builds the native kernels at install (pyproject.toml has the rest of the package's metadata).

kernels.c and layers.c are compiled once per CPU variant, side by side, each exporting its symbols under its own
name (native.h), and linked with the torch binding ops.cpp into specdecode/backends/cpu/_native: one build
serves every x86-64 CPU, and native.py picks the variant by the CPU's features at run time. A variant the
compiler cannot build is left out; if the binding itself cannot be built, installation goes on without it
(one line says why) and packed models run on torch's int8 kernel or float weights instead."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

CPU = Path("specdecode/backends/cpu")
SOURCES = ("kernels.c", "layers.c")
BASE = ("-O3", "-fopenmp", "-std=gnu11")
X86 = ("-mavx2", "-mfma", "-mf16c")
# each variant's compiler flags; the sources choose their instructions by the macros these flags define
VARIANTS = {
    "avx2": X86,
    "vnni": (*X86, "-mavxvnni"),
    "avx512_vnni": (*X86, "-mavx512vnni", "-mavx512vl"),
    "amx": (*X86, "-mavxvnni", "-DTILES"),
    # SIMDe's plain C (simd.h); at -O2, as -O3 took three times as long to compile (~3 min) for no gain to measure
    "portable": ("-DSD_PORTABLE", "-O2", "-Wno-psabi"),
}


def _say(line: str) -> None:
    print(f"specdecode: {line}", file=sys.stderr, flush=True)


def _extensions() -> tuple[list, dict]:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say("torch is not importable at build time, so the native kernels are not built (packed models will "
             "use torch's int8 kernel)")
        return [], {}

    class BuildNative(BuildExtension):
        """Compiles each variant's objects (side by side, one compiler process each), then the binding; a failure is
        one line, never a failed install."""

        def build_extension(self, ext) -> None:
            from concurrent.futures import ThreadPoolExecutor

            from setuptools.errors import CompileError, LinkError

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objects = dict(zip(VARIANTS, pool.map(self._variant, VARIANTS)))
            if objects["avx2"] is None:
                _say("the native kernels did not compile (no C compiler with AVX2 support?); packed models will use "
                     "torch's int8 kernel")
                return
            for variant, built in objects.items():
                if built is None:
                    _say(f"the {variant} variant of the native kernels did not compile; the others are built")
                    continue
                ext.extra_objects.extend(built)
                ext.extra_compile_args["cxx"].append(f"-DSD_HAS_{variant}")
            try:
                super().build_extension(ext)
            except (CompileError, LinkError) as error:
                _say(f"the native kernels' torch binding did not build ({error}); packed models will use torch's "
                     "int8 kernel")

        def _variant(self, variant: str) -> list[str] | None:
            """The variant's object files (None: it did not compile), from the C compiler (torch's compiles
            everything as C++)."""
            from distutils.ccompiler import new_compiler
            from distutils.sysconfig import customize_compiler

            from setuptools.errors import CompileError

            compiler = new_compiler()
            customize_compiler(compiler)
            try:
                return compiler.compile([str(CPU / name) for name in SOURCES],
                                        output_dir=str(Path(self.build_temp) / variant),
                                        macros=[("SD_VARIANT", variant)], extra_postargs=[*BASE, *VARIANTS[variant]])
            except CompileError:
                return None

    native = CppExtension("specdecode.backends.cpu._native", [str(CPU / "ops.cpp")],
                          extra_compile_args={"cxx": ["-O2", "-g0", "-fopenmp"]}, extra_link_args=["-fopenmp"])
    return [native], {"build_ext": BuildNative.with_options(no_python_abi_suffix=False)}


extensions, commands = _extensions()
setup(ext_modules=extensions, cmdclass=commands)
