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
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define QK 32
#define ROWS 4 /* rows accumulated together: the weight block is unpacked once for them */
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
void quantize_activations(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scale, float *sums) {
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
products of 8 columns in the 8 lanes of one vector, multiplied by the 8 columns' scales at once:
  q4: codes [N/8, K/32, 128]: four 32-byte pairs, pair p = column 2p's 16 bytes then column 2p+1's;
      d, m [N/8, K/32, 8] fp16 in lane order (columns 0 2 4 6 1 3 5 7, the order the reduction leaves them in)
  q8: codes [N/8, K/32, 256]: column c's 32 codes at 32 c; d [N/8, K/32, 8] fp16 in column order
For RR activation rows (a compile-time constant, so accumulators stay in registers) the weights are unpacked
once per block; the order of every operation on a row's sums is fixed by the block alone, never by RR. */

/* sum the 8 lanes of each of v0..v7 into lane i of the result (i = 0..7) */
static inline __m256i reduce8(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4, __m256i v5, __m256i v6,
                              __m256i v7) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v4, v5), _mm256_hadd_epi32(v6, v7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

#define Q4_GROUP(RR)                                                                                           \
    static inline void q4_group_##RR(const uint8_t *wc, const uint16_t *dc, const uint16_t *mc, int64_t nb,      \
                                     int64_t k, const int8_t *xq, const float *xd, const float *xs, float *out,   \
                                     int64_t out_stride) {                                                     \
        const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);                               \
        __m256 acc[RR];                                                                                        \
        for (int j = 0; j < RR; j++) acc[j] = _mm256_setzero_ps();                                             \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            const uint8_t *c = wc + b * 128;                                                                   \
            _mm_prefetch((const char *)(c + PREFETCH), _MM_HINT_T0);                                           \
            _mm_prefetch((const char *)(c + PREFETCH + 64), _MM_HINT_T0);                                      \
            __m256i lo[4], hi[4];                                                                              \
            for (int p = 0; p < 4; p++) {                                                                      \
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(c + 32 * p));                         \
                lo[p] = _mm256_and_si256(raw, low);                                                            \
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);                                      \
            }                                                                                                  \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dc + b * 8)));                  \
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mc + b * 8)));                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < RR; j++) {                                             \
                const int8_t *x = xq + j * k + b * QK;                                                         \
                const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x));           \
                const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x + 16)));    \
                __m256i s[4];                                                                                  \
                for (int p = 0; p < 4; p++)                                                                    \
                    s[p] = _mm256_madd_epi16(                                                                  \
                        _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], xl), _mm256_maddubs_epi16(hi[p], xh)), ones); \
                /* [A B] [C D] [E F] [G H] -> lanes A C E G B D F H */                                         \
                const __m256i dot = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3])); \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(xd[j * nb + b])), \
                                         acc[j]);                                                              \
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[j * nb + b]), acc[j]);                           \
            }                                                                                                  \
        }                                                                                                      \
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);                                       \
        for (int j = 0; j < RR; j++) _mm256_storeu_ps(out + j * out_stride, _mm256_permutevar8x32_ps(acc[j], order)); \
    }
Q4_GROUP(1)
Q4_GROUP(2)
Q4_GROUP(3)
Q4_GROUP(4)

#define Q8_GROUP(RR)                                                                                           \
    static inline void q8_group_##RR(const int8_t *wc, const uint16_t *dc, int64_t nb, int64_t k,              \
                                     const int8_t *xq, const float *xd, float *out, int64_t out_stride) {      \
        const __m256i ones = _mm256_set1_epi16(1);                                                             \
        __m256 acc[RR];                                                                                        \
        for (int j = 0; j < RR; j++) acc[j] = _mm256_setzero_ps();                                             \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            const int8_t *c = wc + b * 256;                                                                    \
            for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(c + PREFETCH + l), _MM_HINT_T0);     \
            __m256i w[8], mag[8];                                                                              \
            for (int p = 0; p < 8; p++) {                                                                      \
                w[p] = _mm256_loadu_si256((const __m256i *)(c + 32 * p));                                      \
                mag[p] = _mm256_sign_epi8(w[p], w[p]);                                                         \
            }                                                                                                  \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dc + b * 8)));                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < RR; j++) {                                             \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + j * k + b * QK));                 \
                __m256i s[8];                                                                                  \
                for (int p = 0; p < 8; p++)                                                                    \
                    s[p] = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[p], _mm256_sign_epi8(xv, w[p])), ones);   \
                const __m256i dot = reduce8(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);                   \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(xd[j * nb + b])), \
                                         acc[j]);                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int j = 0; j < RR; j++) _mm256_storeu_ps(out + j * out_stride, acc[j]);                           \
    }
Q8_GROUP(1)
Q8_GROUP(2)
Q8_GROUP(3)
Q8_GROUP(4)

/* out[r, col] (row stride out_stride) for packed q4 weights of N output columns (N a multiple of 8), on
`threads` threads (<= 0: OpenMP's default, torch's setting). */
void gemm_q4_on(const uint8_t *w, const uint16_t *wd, const uint16_t *wm, int64_t n, int64_t k, const int8_t *xq,
                const float *xd, const float *xs, int64_t rows, float *out, int64_t out_stride, int64_t threads) {
    const int64_t nb = k / QK;
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
                default: q4_group_4(wc, dc, mc, nb, k, x, d, s, o, out_stride); break;
            }
        }
    }
}

/* The same for packed q8 weights. */
void gemm_q8_on(const int8_t *w, const uint16_t *wd, int64_t n, int64_t k, const int8_t *xq, const float *xd,
                int64_t rows, float *out, int64_t out_stride, int64_t threads) {
    const int64_t nb = k / QK;
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
                default: q8_group_4(wc, dc, nb, k, x, d, o, out_stride); break;
            }
        }
    }
}

void gemm_q4(const uint8_t *w, const uint16_t *wd, const uint16_t *wm, int64_t n, int64_t k,
             const int8_t *xq, const float *xd, const float *xs, int64_t rows, float *out, int64_t out_stride) {
    gemm_q4_on(w, wd, wm, n, k, xq, xd, xs, rows, out, out_stride, 0);
}

void gemm_q8(const int8_t *w, const uint16_t *wd, int64_t n, int64_t k,
             const int8_t *xq, const float *xd, int64_t rows, float *out, int64_t out_stride) {
    gemm_q8_on(w, wd, n, k, xq, xd, rows, out, out_stride, 0);
}
