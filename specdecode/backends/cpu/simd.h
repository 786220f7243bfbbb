/* The vector instructions kernels.c and layers.c are written in: x86's own (immintrin.h), or, in the portable
variant (SD_PORTABLE, for CPUs without AVX2), SIMDe's implementations of the same intrinsics in plain C that the
compiler vectorises for whatever CPU it targets (libsimde-dev; see docs/design-notes.md, "Native kernels"). SIMDe
keeps each intrinsic's lane-for-lane semantics, so the portable build computes what the AVX2 build computes. */
#ifndef SPECDECODE_SIMD
#define SPECDECODE_SIMD
#ifdef SD_PORTABLE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx2.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
/* the scalar fp16 conversions, through the vector ones */
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#define _cvtsh_ss(h) _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((int)(h))))
#define _cvtss_sh(x, rounding) ((uint16_t)_mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(x), rounding)))
#else
#include <immintrin.h>
#endif
#endif
