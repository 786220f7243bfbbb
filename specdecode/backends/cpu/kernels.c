/* Weight-only quantized linear layers for x86 CPUs with AVX2: y[r, n] = sum_k x[r, k] * w[n, k].

Weights come in blocks of 32 along k, one or two fp16 numbers per block:
  q4: 4-bit codes c in 0..15, value = d * c + m  (16 bytes of codes + d + m per block; byte j holds element j in
      its low nibble and element j + 16 in its high one)
  q8: int8 codes c in -127..127, value = d * c     (32 bytes of codes + d per block)
Activations are quantized per row and block to int8 with one fp32 scale (and the block's scaled sum for q4's
offset), so a block's dot product is integer arithmetic (vpmaddubsw / vpmaddwd) and one fused multiply-add.

Every output element is accumulated in the same order whatever the number of rows or threads, so a row's
result does not depend on what it is batched with: a verify pass of k tokens gives each token the logits a
one-token pass gives it, bit for bit. Threads split the output columns (OpenMP: torch's own runtime, which is
already loaded under the same soname when this library is opened after torch). */
#include "simd.h"
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#ifndef SD_VARIANT
#define SD_VARIANT avx2
#endif
#include "native.h"

/* GCC otherwise sinks every single-use value to its one use (TER), which moves all of a block step's products to
its end: every unpacked weight vector and product is then alive at once and spills (q4 at 2-8 rows: 15-25% slower). */
#pragma GCC optimize("no-tree-ter")

#define QK SD_QK
#define ROWS 8 /* rows accumulated together: the weight block is unpacked once for them */
/* Where there is a tile path (AMX), the fewest rows it takes. q4 weights need their codes unpacked for the tiles:
a large q4 product (1 MiB of codes or more, each of Qwen2.5's projections) takes them from 8 rows (whole Qwen2.5
1.5B passes of 10 / 12 / 14 rows: 86 / 96 / ~110 -> 74 / 81 / 89 ms); a small one (SmolLM2's) from 16 rows: alone,
one product repeated, the tiles win from 6 rows, but in whole SmolLM2 passes they were 0.5-1 ms slower at 6-8 rows,
even at 10-12 and ~0.5 ms ahead at 14 (the cause not found). Past 16 rows a q4 product of any size takes the tiles
for a rest of 8 rows or more as well (whole SmolLM2 passes of 29 rows: 25.9 -> 24.4-24.7 ms; 24 rows even). q8 weights are copied as they are. A large q8 product is read from memory, and its
tiles' fixed work per block hides under the read from 2 rows (the head of a verify pass: ~12 ms against ~15.5 for 4
rows of Qwen2.5 1.5B's 151,936 x 1,536 head). A small one comes from cache fast enough that the vector path wins up
to 4 rows (SmolLM2's 49,152 x 576 head, min of 60: 0.56 / 0.56 / 0.69 / 0.83 ms at 2 / 3 / 4 / 5 rows against
0.68 / 0.70 / 0.73 / 0.76 with tiles). */
#ifndef TILE_MIN_ROWS_Q4
#define TILE_MIN_ROWS_Q4 8
#endif
#define TILE_MIN_ROWS_Q4_SMALL 16
#define TILE_Q4_LARGE ((int64_t)1 << 20) /* bytes of codes from which a q4 product counts as large */
#ifndef TILE_MIN_ROWS_Q8
#define TILE_MIN_ROWS_Q8 2
#endif
#define TILE_MIN_ROWS_Q8_SMALL 5
#define TILE_Q8_LARGE ((int64_t)64 << 20) /* weights (bytes of codes) from which a q8 product counts as large */
#ifndef PREFETCH
#define PREFETCH 2048 /* bytes ahead of the weights being read */
#endif

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* x [R, K] fp32 -> codes [R, K] int8, scale [R, K/32], scaled sums [R, K/32] (scale * sum of codes). */
void SD(quantize_activations)(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scale, float *sums) {
    const int64_t nb = k / QK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *src = x + r * k + b * QK;
            __m256 v[4], amax = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(src + 8 * i);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_movehdup_ps(m));
            const float d = _mm_cvtss_f32(m) / 127.0f;
            const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
            __m256i q[4];
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
            s = _mm_hadd_epi32(s, s);
            s = _mm_hadd_epi32(s, s);
            /* pack 32 int32 -> 32 int8 in order (packs interleave lanes; the permute restores it) */
            __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
            __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
            __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(codes + r * k + b * QK), p8);
            scale[r * nb + b] = d;
            sums[r * nb + b] = d * (float)_mm_cvtsi128_si32(s);
        }
    }
}

/* Weights are packed in groups of 8 output columns, block by block, so that one block step yields the dot
products of the 8 columns in the 8 lanes of one vector, in column order, with no horizontal sums: vector V_t
(t = 0..7) holds inputs 4t..4t+3 of every column, byte 4c + i = code of column c, input 4t + i, so vpmaddubsw
against the row's 4 activation codes x[4t..4t+3] broadcast to every 32-bit lane leaves column c's partial sums
in lane c, and vpmaddwd with ones finishes them.
  q4: codes [N/8, K/32, 128]: four 32-byte vectors R_p, byte 4c + i = code(c, 4p + i) | code(c, 4p + 16 + i) << 4,
      so R_p's low nibbles are V_p and its high ones V_{p+4}; the eight products (pair sums within 2 * 15 * 127,
      eight of them within 30480) add in int16 without overflow before one vpmaddwd. d, m [N/8, K/32, 8] fp16 in
      column order
  q8: codes [N/8, K/32, 256]: V_0..V_7 in turn; a product pair can reach 2 * 127 * 127, so each is widened
      on its own. d [N/8, K/32, 8] fp16 in column order
For RR activation rows (a compile-time constant, so the loops over them unroll) each weight vector is unpacked
once per block for all of them; the order of every floating-point operation on a row's sums is fixed by the block
alone, never by RR. */

/* A block's integer dot products. With VNNI (vpdpbusd: unsigned x signed bytes, four products summed into each
32-bit lane) one instruction does what vpmaddubsw + vpmaddwd + vpaddd do without it. The sums are the same
integers either way: no pair sum saturates int16 (q4: 2 * 15 * 127; q8: 2 * 127 * 127), and q4's int16 running
sum of a block stays within 30480; so both builds give every output the same bits.
  Q4_PAIR(acc, lo, xl, hi, xh): acc + lo . xl + hi . xh   (int16 lanes without VNNI, finished by Q4_FINISH)
  Q8_STEP(acc, w, x): acc + w . x in 32-bit lanes */
#if defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#endif
#ifdef DPBUSD
#define Q4_PAIR(acc, lo, xl, hi, xh) DPBUSD(DPBUSD(acc, lo, xl), hi, xh)
#define Q4_FINISH(s) (s)
#define Q8_STEP(acc, w, x) DPBUSD(acc, w, x)
#else
#define Q4_PAIR(acc, lo, xl, hi, xh) \
    _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)))
#define Q4_FINISH(s) _mm256_madd_epi16(s, _mm256_set1_epi16(1))
#define Q8_STEP(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#endif

/* x[0..3] in every 32-bit lane */
static inline __m256i broadcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

#define Q4_GROUP(RR)                                                                                           \
    static inline void q4_group_##RR(const uint8_t *wc, const uint16_t *dc, const uint16_t *mc, int64_t nb,      \
                                     int64_t k, const int8_t *xq, const float *xd, const float *xs, float *out,   \
                                     int64_t out_stride) {                                                     \
        const __m256i low = _mm256_set1_epi8(0x0F);                                                            \
        __m256 acc[RR];                                                                                        \
        for (int j = 0; j < RR; j++) acc[j] = _mm256_setzero_ps();                                             \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            const uint8_t *c = wc + b * 128;                                                                   \
            const int8_t *x = xq + b * QK;                                                                     \
            _mm_prefetch((const char *)(c + PREFETCH), _MM_HINT_T0);                                           \
            _mm_prefetch((const char *)(c + PREFETCH + 64), _MM_HINT_T0);                                      \
            __m256i s[RR];                                                                                     \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                              \
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(c + 32 * p));                         \
                const __m256i lo = _mm256_and_si256(raw, low);                                                 \
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);                           \
                _Pragma("GCC unroll 8") for (int j = 0; j < RR; j++)                                           \
                    s[j] = Q4_PAIR(p ? s[j] : _mm256_setzero_si256(), lo, broadcast4(x + j * k + 4 * p),       \
                                   hi, broadcast4(x + j * k + 4 * p + 16));                                    \
            }                                                                                                  \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dc + b * 8)));                  \
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mc + b * 8)));                  \
            _Pragma("GCC unroll 8") for (int j = 0; j < RR; j++) {                                             \
                const __m256i dot = Q4_FINISH(s[j]);                                                           \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(xd[j * nb + b])), \
                                         acc[j]);                                                              \
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[j * nb + b]), acc[j]);                           \
            }                                                                                                  \
        }                                                                                                      \
        for (int j = 0; j < RR; j++) _mm256_storeu_ps(out + j * out_stride, acc[j]);                           \
    }

#define Q8_GROUP(RR)                                                                                           \
    static inline void q8_group_##RR(const int8_t *wc, const uint16_t *dc, int64_t nb, int64_t k,              \
                                     const int8_t *xq, const float *xd, float *out, int64_t out_stride) {      \
        __m256 acc[RR];                                                                                        \
        for (int j = 0; j < RR; j++) acc[j] = _mm256_setzero_ps();                                             \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            const int8_t *c = wc + b * 256;                                                                    \
            const int8_t *x = xq + b * QK;                                                                     \
            for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(c + PREFETCH + l), _MM_HINT_T0);     \
            __m256i s[RR];                                                                                     \
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {                                              \
                const __m256i w = _mm256_loadu_si256((const __m256i *)(c + 32 * t));                           \
                const __m256i mag = _mm256_sign_epi8(w, w);                                                    \
                _Pragma("GCC unroll 8") for (int j = 0; j < RR; j++) {                                         \
                    const __m256i xw = _mm256_sign_epi8(broadcast4(x + j * k + 4 * t), w);                     \
                    s[j] = Q8_STEP(t ? s[j] : _mm256_setzero_si256(), mag, xw);                                \
                }                                                                                              \
            }                                                                                                  \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dc + b * 8)));                  \
            _Pragma("GCC unroll 8") for (int j = 0; j < RR; j++)                                               \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(d, _mm256_set1_ps(xd[j * nb + b])), \
                                         acc[j]);                                                              \
        }                                                                                                      \
        for (int j = 0; j < RR; j++) _mm256_storeu_ps(out + j * out_stride, acc[j]);                           \
    }

#define GROUPS(RR) Q4_GROUP(RR) Q8_GROUP(RR)
GROUPS(1)
GROUPS(2)
GROUPS(3)
GROUPS(4)
GROUPS(5)
GROUPS(6)
GROUPS(7)
GROUPS(8)

/* AMX (Intel's tile unit, in the build with -DTILES): sixteen rows at a time, a block's 16 x 16 integer dot products
(two column groups) in one tile multiply, TDPBSSD (signed bytes; q4 codes 0..15 are non-negative signed bytes).
The tile's B operand is exactly the vector path's V_0..V_7 of the two groups side by side, and its A operand is
sixteen rows' activation codes as they lie; the sums are the same integers as the vector path's, and each goes
through the same floating-point steps in the same block order, so a row gets the same bits either way (the rows
past the last multiple of 16 take the vector path). Linux grants the tile state per process on request. */
#ifdef TILES /* the amx build (native.py); only this section is compiled for AVX-512 and AMX */
#include <sys/syscall.h>
#include <unistd.h>
#pragma GCC push_options
#pragma GCC target("avx512f,amx-tile,amx-int8")

#define TILE_ROWS 16

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int amx_state; /* 0: not asked yet, 1: granted, -1: refused */

static int amx_granted(void) {
    if (!amx_state) /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA */
        amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    return amx_state > 0;
}

static void amx_configure(int rows) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = rows, c.colsb[0] = 64;   /* C: rows x 16 int32 sums */
    c.rows[1] = rows, c.colsb[1] = QK;   /* A: rows x a block's 32 activation codes */
    c.rows[2] = QK / 4, c.colsb[2] = 64; /* B: V_t of two groups per row t */
    c.rows[3] = rows, c.colsb[3] = 64;   /* the same three for a second block */
    c.rows[4] = rows, c.colsb[4] = QK;
    c.rows[5] = QK / 4, c.colsb[5] = 64;
    c.rows[6] = rows, c.colsb[6] = 64;   /* C again, for the pairs that alternate with 0 and 3 */
    c.rows[7] = rows, c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

/* Stage block b of groups g (w0) and g + 1 (w1) as a B tile: row t = V_t of g, then V_t of g + 1. */
static inline void stage_b(const uint8_t *w0, const uint8_t *w1, int q4, int64_t b, int8_t *b_tile) {
    if (q4) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        const uint8_t *c0 = w0 + b * 128, *c1 = w1 + b * 128;
        _mm_prefetch((const char *)(c0 + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(c0 + PREFETCH + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(c1 + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(c1 + PREFETCH + 64), _MM_HINT_T0);
        for (int p = 0; p < 4; p++) {
            const __m256i r0 = _mm256_loadu_si256((const __m256i *)(c0 + 32 * p));
            const __m256i r1 = _mm256_loadu_si256((const __m256i *)(c1 + 32 * p));
            _mm256_store_si256((__m256i *)(b_tile + 64 * p), _mm256_and_si256(r0, low));
            _mm256_store_si256((__m256i *)(b_tile + 64 * p + 32), _mm256_and_si256(r1, low));
            _mm256_store_si256((__m256i *)(b_tile + 64 * (p + 4)), _mm256_and_si256(_mm256_srli_epi16(r0, 4), low));
            _mm256_store_si256((__m256i *)(b_tile + 64 * (p + 4) + 32), _mm256_and_si256(_mm256_srli_epi16(r1, 4), low));
        }
    } else {
        const uint8_t *c0 = w0 + b * 256, *c1 = w1 + b * 256;
        for (int l = 0; l < 256; l += 64) {
            _mm_prefetch((const char *)(c0 + PREFETCH + l), _MM_HINT_T0);
            _mm_prefetch((const char *)(c1 + PREFETCH + l), _MM_HINT_T0);
        }
        for (int t = 0; t < 8; t++) {
            _mm256_store_si256((__m256i *)(b_tile + 64 * t), _mm256_loadu_si256((const __m256i *)(c0 + 32 * t)));
            _mm256_store_si256((__m256i *)(b_tile + 64 * t + 32), _mm256_loadu_si256((const __m256i *)(c1 + 32 * t)));
        }
    }
}

/* acc[j] += block b's sums of row j, scaled as the vector path scales them (m: q4's offsets, else NULL). */
static inline __attribute__((always_inline)) void scale_sums(const int32_t *sums, const uint16_t *d0,
                                                            const uint16_t *d1, const uint16_t *m0, const uint16_t *m1,
                                                            int64_t nb, int64_t b, const float *xd, const float *xs,
                                                            __m512 *acc, const int R) {
    const __m512 d = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(d1 + b * 8)),
                                                      _mm_loadu_si128((const __m128i *)(d0 + b * 8))));
    if (m0) {
        const __m512 m = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(m1 + b * 8)),
                                                          _mm_loadu_si128((const __m128i *)(m0 + b * 8))));
        for (int j = 0; j < R; j++) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * j));
            acc[j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(xd[j * nb + b])), acc[j]);
            acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[j * nb + b]), acc[j]);
        }
    } else {
        for (int j = 0; j < R; j++) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * j));
            acc[j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(xd[j * nb + b])), acc[j]);
        }
    }
}

/* R <= 16 rows (x, xd, xs from the chunk's first row; the tiles configured for R rows) x 16 columns: groups g
(w0, d0, m0) and g + 1 (w1, d1, m1). For q8, m0 is NULL and w* point at 256-byte blocks.
A software pipeline two blocks wide: while a pair of blocks multiplies in its tiles, the pair before it is scaled
from the sums it stored and the pair after it is staged. A tile load of freshly staged codes, and a vector load of
freshly stored sums, wait for the stores to reach the cache; done in order (stage, multiply, store, scale) each
block waited for both (an 8960 x 1536 q4 layer, alone, from cache, at 4 / 8 / 12 rows: 0.47 / 0.50 / 0.54 ms ->
0.28 / 0.36 / 0.50). At 16 rows it is unchanged (~0.6 ms): scaling the sums, four vector operations per row and
block, bounds it there.
Two sets of sum tiles (0, 3 and 6, 7) take turns, so a pair's multiplies do not wait for the store of the pair
before. The blocks are scaled in order, as the vector path scales them. */
#define TILE_MULTIPLY(C, A, B, blk, staged) \
    do { _tile_zero(C); _tile_loadd(A, xq + (blk) * QK, k); _tile_loadd(B, staged, 64); _tile_dpbssd(C, A, B); } while (0)

static inline __attribute__((always_inline)) void tile_rows(const uint8_t *w0, const uint8_t *w1, const uint16_t *d0,
                                                            const uint16_t *d1, const uint16_t *m0, const uint16_t *m1,
                                                            int64_t nb, int64_t k, const int8_t *xq, const float *xd,
                                                            const float *xs, float *out, int64_t out_stride,
                                                            const int R) {
    int8_t b_tile[2][QK / 4 * 64] __attribute__((aligned(64)));   /* the next pair's B operands */
    int32_t sums[2][2][TILE_ROWS * 16] __attribute__((aligned(64))); /* [pair parity][block of the pair] */
    __m512 acc[TILE_ROWS];
    const int q4 = m0 != NULL;
    for (int j = 0; j < TILE_ROWS; j++) acc[j] = _mm512_setzero_ps();
    stage_b(w0, w1, q4, 0, b_tile[0]);
    if (nb > 1) stage_b(w0, w1, q4, 1, b_tile[1]);
    for (int64_t b = 0; b < nb; b += 2) {
        const int odd = (int)(b / 2) & 1, two = b + 1 < nb;
        if (odd) {
            TILE_MULTIPLY(6, 1, 2, b, b_tile[0]);
            if (two) TILE_MULTIPLY(7, 4, 5, b + 1, b_tile[1]);
        } else {
            TILE_MULTIPLY(0, 1, 2, b, b_tile[0]);
            if (two) TILE_MULTIPLY(3, 4, 5, b + 1, b_tile[1]);
        }
        if (b > 0) { /* the pair before, stored last time round: always two blocks */
            scale_sums(sums[!odd][0], d0, d1, m0, m1, nb, b - 2, xd, xs, acc, R);
            scale_sums(sums[!odd][1], d0, d1, m0, m1, nb, b - 1, xd, xs, acc, R);
        }
        if (b + 2 < nb) stage_b(w0, w1, q4, b + 2, b_tile[0]);
        if (b + 3 < nb) stage_b(w0, w1, q4, b + 3, b_tile[1]);
        if (odd) {
            _tile_stored(6, sums[1][0], 64);
            if (two) _tile_stored(7, sums[1][1], 64);
        } else {
            _tile_stored(0, sums[0][0], 64);
            if (two) _tile_stored(3, sums[0][1], 64);
        }
    }
    { /* the last pair */
        const int64_t b = (nb - 1) & ~(int64_t)1;
        const int odd = (int)(b / 2) & 1;
        scale_sums(sums[odd][0], d0, d1, m0, m1, nb, b, xd, xs, acc, R);
        if (b + 1 < nb) scale_sums(sums[odd][1], d0, d1, m0, m1, nb, b + 1, xd, xs, acc, R);
    }
    for (int j = 0; j < R; j++) _mm512_storeu_ps(out + j * out_stride, acc[j]);
}
#undef TILE_MULTIPLY

#define TILE_CASE(R) \
    case R: tile_rows(w0, w1, d0, d1, m0, m1, nb, k, xq, xd, xs, out, out_stride, R); break;

static void tile_chunk(const uint8_t *w0, const uint8_t *w1, const uint16_t *d0, const uint16_t *d1,
                       const uint16_t *m0, const uint16_t *m1, int64_t nb, int64_t k, const int8_t *xq,
                       const float *xd, const float *xs, float *out, int64_t out_stride, int64_t rows) {
    switch (rows) {
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
        TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12) TILE_CASE(13) TILE_CASE(14) TILE_CASE(15) TILE_CASE(16)
    }
}

/* The tile path over the first rows of a layer whose N is a multiple of 16, if it has at least min_rows rows:
chunks of 16, then the rest if it has at least min_rest rows; returns the rows done (0: no tile path here), the
caller does the others. */
static int64_t amx_rows(const uint8_t *w, int64_t block_bytes, const uint16_t *wd, const uint16_t *wm, int64_t n,
                        int64_t k, const int8_t *xq, const float *xd, const float *xs, int64_t rows, float *out,
                        int64_t out_stride, int64_t threads, int64_t min_rows, int64_t min_rest) {
    const int64_t nb = k / QK, full = rows - rows % TILE_ROWS;
    if (rows < min_rows || n % 16 || !amx_granted()) return 0;
    if (rows - full < min_rest) rows = full;
    const int64_t rest = rows - full;
#pragma omp parallel num_threads(threads > 0 ? (int)threads : omp_get_max_threads())
    {
        int configured = 0; /* the rows the tiles are configured for */
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < n / 16; pair++) {
            const int64_t g = 2 * pair;
            const uint8_t *w0 = w + g * nb * block_bytes, *w1 = w0 + nb * block_bytes;
            const uint16_t *d0 = wd + g * nb * 8, *m0 = wm ? wm + g * nb * 8 : NULL;
            for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
                const int64_t chunk = r0 < full ? TILE_ROWS : rest;
                if (configured != chunk) amx_configure((int)(configured = (int)chunk));
                tile_chunk(w0, w1, d0, d0 + nb * 8, m0, m0 ? m0 + nb * 8 : NULL, nb, k, xq + r0 * k, xd + r0 * nb,
                           xs ? xs + r0 * nb : NULL, out + r0 * out_stride + g * 8, out_stride, chunk);
            }
        }
        _tile_release();
    }
    return rows;
}
#pragma GCC pop_options
#else
static int64_t amx_rows(const uint8_t *w, int64_t block_bytes, const uint16_t *wd, const uint16_t *wm, int64_t n,
                        int64_t k, const int8_t *xq, const float *xd, const float *xs, int64_t rows, float *out,
                        int64_t out_stride, int64_t threads, int64_t min_rows, int64_t min_rest) {
    (void)min_rows, (void)min_rest, (void)w, (void)block_bytes, (void)wd, (void)wm, (void)n, (void)k, (void)xq, (void)xd, (void)xs, (void)rows;
    (void)out, (void)out_stride, (void)threads;
    return 0;
}
#endif

/* native.h: threads <= 0 is OpenMP's default, torch's setting. */
void SD(gemm_q4)(const uint8_t *w, const uint16_t *wd, const uint16_t *wm, int64_t n, int64_t k, const int8_t *xq,
                 const float *xd, const float *xs, int64_t rows, float *out, int64_t out_stride, int64_t threads) {
    const int64_t nb = k / QK;
    {
        const int64_t done = amx_rows(w, 128, wd, wm, n, k, xq, xd, xs, rows, out, out_stride, threads,
                                      n * k / 2 >= TILE_Q4_LARGE ? TILE_MIN_ROWS_Q4 : TILE_MIN_ROWS_Q4_SMALL,
                                      TILE_MIN_ROWS_Q4);
        xq += done * k, xd += done * nb, xs += done * nb, out += done * out_stride, rows -= done;
    }
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? (int)threads : omp_get_max_threads())
    for (int64_t g = 0; g < n / 8; g++) {
        const uint8_t *wc = w + g * nb * 128;
        const uint16_t *dc = wd + g * nb * 8, *mc = wm + g * nb * 8;
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int64_t rr = rows - r0 < ROWS ? rows - r0 : ROWS;
            const int8_t *x = xq + r0 * k;
            const float *d = xd + r0 * nb, *s = xs + r0 * nb;
            float *o = out + r0 * out_stride + g * 8;
            switch (rr) {
                case 1: q4_group_1(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 2: q4_group_2(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 3: q4_group_3(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 4: q4_group_4(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 5: q4_group_5(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 6: q4_group_6(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 7: q4_group_7(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
                case 8: q4_group_8(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
            }
        }
    }
}

void SD(gemm_q8)(const int8_t *w, const uint16_t *wd, int64_t n, int64_t k, const int8_t *xq, const float *xd,
                 int64_t rows, float *out, int64_t out_stride, int64_t threads) {
    const int64_t nb = k / QK;
    {
        const int64_t least = n * k >= TILE_Q8_LARGE ? TILE_MIN_ROWS_Q8 : TILE_MIN_ROWS_Q8_SMALL;
        const int64_t done = amx_rows((const uint8_t *)w, 256, wd, NULL, n, k, xq, xd, NULL, rows, out, out_stride,
                                      threads, least, least);
        xq += done * k, xd += done * nb, out += done * out_stride, rows -= done;
    }
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? (int)threads : omp_get_max_threads())
    for (int64_t g = 0; g < n / 8; g++) {
        const int8_t *wc = w + g * nb * 256;
        const uint16_t *dc = wd + g * nb * 8;
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int64_t rr = rows - r0 < ROWS ? rows - r0 : ROWS;
            const int8_t *x = xq + r0 * k;
            const float *d = xd + r0 * nb;
            float *o = out + r0 * out_stride + g * 8;
            switch (rr) {
                case 1: q8_group_1(wc, dc, nb, k, x, d, o, out_stride); break;
                case 2: q8_group_2(wc, dc, nb, k, x, d, o, out_stride); break;
                case 3: q8_group_3(wc, dc, nb, k, x, d, o, out_stride); break;
                case 4: q8_group_4(wc, dc, nb, k, x, d, o, out_stride); break;
                case 5: q8_group_5(wc, dc, nb, k, x, d, o, out_stride); break;
                case 6: q8_group_6(wc, dc, nb, k, x, d, o, out_stride); break;
                case 7: q8_group_7(wc, dc, nb, k, x, d, o, out_stride); break;
                case 8: q8_group_8(wc, dc, nb, k, x, d, o, out_stride); break;
            }
        }
    }
}
