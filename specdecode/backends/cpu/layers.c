/* One decoder layer of a Llama-family model (Llama, Qwen2, Qwen3, Gemma 3) over packed weights, in one call.

transformers' eager layer is ~50 small torch operations and seven linear layers, each a Python call that
quantizes its own input: at a one-token pass that dispatch is most of the time for a small model (SmolLM2 135M:
~40 ms a pass, of which the packed weights take ~6). Here a layer is one call: the input is quantized once
per use (q/k/v share it, gate/up share it), and norms, rotary embedding, attention and the gated MLP are plain
loops over the rows. What the families add to Llama's layer is optional per layer: q/k/v biases (Qwen2), an RMS
norm of each head's query and key before the rotary (Qwen3, Gemma 3), norms of the attention's and the MLP's
outputs before their residual adds (Gemma 3's "sandwich"), a GELU-gated MLP (Gemma 3), an attention scale of the
model's own, and a second mask and rotary table for sliding-window layers (Gemma 3: the caller's mask hides the
slots outside the window, so a tree's nodes see the window plain decoding sees).

Every row's arithmetic is its own, in a fixed order: the linear layers' rows are independent (kernels.c) and
a row attends over exactly the cache slots its mask shows, in slot order, with one softmax per head. So a
verify pass of k tokens gives each token the bits a one-token pass gives it, and speculative output equals
plain decoding of the same model.

Layout: x [R, hidden] is the residual stream (updated in place); batch row b holds rows starts[b] <=
r < starts[b + 1] (rows need not be the same in number: a pass computes no padding). Keys and values of batch
row b live in its own buffers [kv_heads, cap[b], head_dim] (kv_cache.py), fp16 where L->kv_half (rounded to
nearest when written, read back into fp32 arithmetic), else fp32; row r writes slot slot[r] and reads
the slots j < kv_len with mask[r * kv_len + j] != 0. */
#include "simd.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef SD_VARIANT
#define SD_VARIANT avx2
#endif
#include "native.h"

/* y[r, :] = (x[r, :] quantized) @ W^T (+ bias), given x already quantized into s->xq/xd/xs with k columns. */
static void linear(const qlinear_t *w, const scratch_t *s, int64_t rows, float *y, int64_t threads) {
    if (w->q4)
        SD(gemm_q4)((const uint8_t *)w->codes, w->d, w->m, w->n, w->k, s->xq, s->xd, s->xs, rows, y, w->n, threads);
    else
        SD(gemm_q8)((const int8_t *)w->codes, w->d, w->n, w->k, s->xq, s->xd, rows, y, w->n, threads);
    if (w->bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < w->n; c++) y[r * w->n + c] += w->bias[c];
}

/* h = x / sqrt(mean(x^2) + eps) * weight, per row (transformers' RMSNorm in float32) */
static void rms_norm(const float *x, const float *weight, float eps, int64_t rows, int64_t n, float *h) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(sum / (float)n + eps);
        for (int64_t i = 0; i < n; i++) h[r * n + i] = weight[i] * (xr[i] * inv);
    }
}

/* The model's final norm over R rows of x [R, n] into h: the same arithmetic as the layers' norms. */
void SD(rms_norm_rows)(const float *x, const float *weight, float eps, int64_t rows, int64_t n, float *h) {
    rms_norm(x, weight, eps, rows, n, h);
}

/* rotate pairs (i, i + d/2) of every head: x * cos + rotate_half(x) * sin, cos/sin [R, head_dim] */
static void rotary(float *x, const float *cos, const float *sin, int64_t rows, int64_t heads, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t hh = 0; hh < heads; hh++) {
            float *v = x + (r * heads + hh) * d;
            const float *c = cos + r * d, *sn = sin + r * d;
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * sn[i];
                v[i + half] = b * c[i + half] + a * sn[i + half];
            }
        }
}

/* 8 cache elements from element i of a row of keys or values, as fp32 (half: the cache holds fp16) */
static inline __m256 cache8(const void *p, int64_t i, const int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
                : _mm256_loadu_ps((const float *)p + i);
}

static inline float cache1(const void *p, int64_t i, const int half) {
    return half ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* cache[at : at + n] = x[:n], rounded to the nearest fp16 where half */
static void store_cache(void *cache, int64_t at, const float *x, int64_t n, int64_t half) {
    if (!half) {
        memcpy((float *)cache + at, x, sizeof(float) * n);
        return;
    }
    uint16_t *out = (uint16_t *)cache + at;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* dot(a, cache[b0 : b0 + n]) */
static inline __attribute__((always_inline)) float dot(const float *a, const void *b, int64_t b0, int64_t n,
                                                       const int half) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), cache8(b, b0 + i, half), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float total = _mm_cvtss_f32(s);
    for (; i < n; i++) total += a[i] * cache1(b, b0 + i, half);
    return total;
}

/* hsum of each of a[0..7] into out[0..7], associated exactly as dot() associates one: ((l0 + l4) + (l2 + l6)) +
((l1 + l5) + (l3 + l7)); eight at a time through shuffles rather than eight chains of single-lane steps */
static inline void hsum8(const __m256 *a, float *out) {
    __m256 s[4];
    for (int j = 0; j < 4; j++) /* lanes i + (i + 4) of a[2j] (low half) and a[2j + 1] (high half) */
        s[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x31));
    /* t = [a0: s0 + s2, s1 + s3, a2: ..., | a1: ..., a3: ...], and the same for a4..a7 */
    const __m256 t0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
    const __m256 t1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
    const __m256 h = _mm256_hadd_ps(t0, t1); /* [a0, a2, a4, a6 | a1, a3, a5, a7] */
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* dot(q, keys[j]) for 8 consecutive keys [8, d] into out[0..7], each summed exactly as dot() sums it (for d a
multiple of 8): eight independent accumulator chains, so a key costs its multiply-adds rather than their latency */
static inline __attribute__((always_inline)) void dot8(const float *q, const void *keys, int64_t k0, int64_t d,
                                                       float *out, const int half) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(x, cache8(keys, k0 + j * d + i, half), acc[j]);
    }
    hsum8(acc, out);
}

/* e^x for x <= 0 (softmax's shifted scores), 8 at a time: Cephes' expf (range reduction by ln 2, a degree-5
polynomial, relative error ~2e-7), so a row's softmax costs a few instructions a key rather than a libm call */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* scores[i] = e^(scores[i] - best) for i < n -> their sum (fixed order: 8 lanes, then the tail) */
static float exp_shifted(float *scores, int64_t n, float best) {
    const __m256 shift = _mm256_set1_ps(best);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), shift));
        _mm256_storeu_ps(scores + i, v);
        sum = _mm256_add_ps(sum, v);
    }
    float buffer[8];
    if (i < n) { /* the tail through the same polynomial, padded with -inf (e^-87 ~ 0, not added) */
        for (int j = 0; j < 8; j++) buffer[j] = i + j < n ? scores[i + j] - best : -100.0f;
        _mm256_storeu_ps(buffer, exp8(_mm256_loadu_ps(buffer)));
    }
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    float total = _mm_cvtss_f32(t);
    for (int j = 0; i + j < n; j++) {
        scores[i + j] = buffer[j];
        total += buffer[j];
    }
    return total;
}

/* out[:d] = fma(p[t], values[t, :d], out[:d]) for t < count, t in order: one element's arithmetic is the same
whatever the count (64 columns per register block: eight independent chains) */
static inline __attribute__((always_inline)) void add_values(float *out, const float *p, const void *values,
                                                             int64_t v0, int64_t count, int64_t d, const int half) {
    int64_t e = 0;
    for (; e + 64 <= d; e += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_loadu_ps(out + e + 8 * j);
        for (int64_t t = 0; t < count; t++) {
            const __m256 w = _mm256_set1_ps(p[t]);
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(w, cache8(values, v0 + t * d + e + 8 * j, half), a[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + e + 8 * j, a[j]);
    }
    for (; e + 8 <= d; e += 8) {
        __m256 a = _mm256_loadu_ps(out + e);
        for (int64_t t = 0; t < count; t++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), cache8(values, v0 + t * d + e, half), a);
        _mm256_storeu_ps(out + e, a);
    }
    for (; e < d; e++)
        for (int64_t t = 0; t < count; t++) out[e] = fmaf(p[t], cache1(values, v0 + t * d + e, half), out[e]);
}

/* g[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u over R rows of n (a multiple of 32: down_proj's packed input),
8 at a time through exp8 (e^-|g|, then the sigmoid of either sign); each element's arithmetic depends on its
value alone. glibc's expf one element at a time was ~8 us a layer at one row for SmolLM2 (1,536), ~48 us for
the 1.5B. */
static void silu_mul(float *g, const float *u, int64_t rows, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < rows * n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_or_ps(x, sign)); /* e^-|x| */
        const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 sig = _mm256_blendv_ps(_mm256_mul_ps(e, inv), inv, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
    }
}

/* g[i] = gelu(g[i]) * u[i] with GELU's tanh approximation, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as
transformers' gelu_pytorch_tanh; tanh(y) = sign(y) (1 - e^-2|y|) / (1 + e^-2|y|) through exp8, 8 at a time (n a
multiple of 8, as silu_mul) */
static void gelu_mul(float *g, const float *u, int64_t rows, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), sign = _mm256_set1_ps(-0.0f);
    const __m256 c0 = _mm256_set1_ps(0.7978845608028654f), c1 = _mm256_set1_ps(0.044715f);
    const __m256 minus2 = _mm256_set1_ps(-2.0f);
    for (int64_t i = 0; i < rows * n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 y = _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_mul_ps(c1, x), _mm256_mul_ps(x, x), x));
        const __m256 e = exp8(_mm256_mul_ps(minus2, _mm256_andnot_ps(sign, y))); /* e^-2|y| */
        const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
        const __m256 tanh_y = _mm256_or_ps(t, _mm256_and_ps(sign, y));
        const __m256 gelu = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, tanh_y));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
    }
}

static inline int sees8(const uint8_t *visible) { /* all of 8 mask bytes (0 or 1) set */
    uint64_t v;
    memcpy(&v, visible, 8);
    return v == 0x0101010101010101ull;
}

static inline int blind8(const uint8_t *visible, int64_t width) { /* none of `width` <= 8 mask bytes set */
    if (width < 8) {
        for (int64_t t = 0; t < width; t++)
            if (visible[t]) return 0;
        return 1;
    }
    uint64_t v;
    memcpy(&v, visible, 8);
    return v == 0;
}

/* One past the last slot any of rows r0..r1 sees: the slots after it need not be swept (a causal prefill's early
rows see a fraction of the cache). Rows are scanned from the last, which usually sees the furthest, so the others
stop at once; 8 mask bytes at a time. */
static int64_t seen_end(const uint8_t *mask, int64_t kv_len, int64_t r0, int64_t r1) {
    int64_t end = 0;
    for (int64_t r = r1 - 1; r >= r0; r--) {
        const uint8_t *visible = mask + r * kv_len;
        int64_t e = kv_len;
        while (e - 8 >= end && blind8(visible + e - 8, 8)) e -= 8;
        while (e > end && !visible[e - 1]) e--;
        end = e > end ? e : end;
    }
    return end;
}

/* score[:n] *= scale -> their largest (NaN ignored, as a scalar `if (x > best)` would): the same products as one at
a time, and a max is exact in any order; 8 lanes rather than one latency-bound chain of compares */
static float scale_max(float *score, int64_t n, float scale) {
    const __m256 factor = _mm256_set1_ps(scale);
    __m256 most = _mm256_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(score + t), factor);
        _mm256_storeu_ps(score + t, v);
        most = _mm256_max_ps(v, most); /* the second operand where either is NaN */
    }
    float lanes[8], best = -INFINITY;
    _mm256_storeu_ps(lanes, most);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > best) best = lanes[j];
    for (; t < n; t++) {
        score[t] *= scale;
        if (score[t] > best) best = score[t];
    }
    return best;
}

/* att[r, h, :] for rows r0..r1 (of one batch row) x heads h0..h1 (of one kv head's group): softmax(q . K_j * scale
over the visible slots j) @ V_j. The cache is swept 8 slots at a time and each slice of keys, then of values, is
used by all the unit's queries while it is in L1 (a query alone would read the whole cache from L2). A query's
scores are in slot order and each is dot()'s sum, its softmax is one pass over them, and each output element is
accumulated in slot order: the same bits whatever else is in the unit. scores [queries, kv_len], used [queries].
keys, values: the kv head's [cap, d] elements, fp16 where half, else fp32. */
static inline __attribute__((always_inline)) void attend_unit(const decoder_layer_t *L, const scratch_t *s, int64_t r0,
                                                              int64_t r1, int64_t h0, int64_t h1, const void *keys,
                                                              const void *values, const uint8_t *mask, int64_t kv_len,
                                                              float *scores, int64_t *used, const int half) {
    const int64_t heads = L->heads, d = L->head_dim, nh = h1 - h0, queries = (r1 - r0) * nh;
    const float scale = L->scale;
    const int64_t end = seen_end(mask, kv_len, r0, r1);
    for (int64_t i = 0; i < queries; i++) used[i] = 0;
    for (int64_t j = 0; j < end; j += 8) { /* scores */
        const int64_t width = end - j < 8 ? end - j : 8;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *visible = mask + r * kv_len + j;
            if (blind8(visible, width)) continue;
            const int whole = width == 8 && d % 8 == 0 && sees8(visible);
            for (int64_t hh = h0; hh < h1; hh++) {
                const int64_t i = (r - r0) * nh + hh - h0;
                const float *query = s->q + (r * heads + hh) * d;
                float *score = scores + i * kv_len;
                if (whole) {
                    dot8(query, keys, j * d, d, score + used[i], half);
                    used[i] += 8;
                } else {
                    for (int64_t t = 0; t < width; t++)
                        if (visible[t]) score[used[i]++] = dot(query, keys, (j + t) * d, d, half);
                }
            }
        }
    }
    for (int64_t i = 0; i < queries; i++) { /* softmax */
        float *score = scores + i * kv_len;
        const int64_t n = used[i];
        const float best = scale_max(score, n, scale);
        const float total = exp_shifted(score, n, best);
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t t = 0; t < n; t++) score[t] *= inv;
        used[i] = 0;
        const int64_t r = r0 + i / nh, hh = h0 + i % nh;
        memset(s->att + (r * heads + hh) * d, 0, sizeof(float) * d);
    }
    for (int64_t j = 0; j < end; j += 8) { /* probabilities @ values */
        const int64_t width = end - j < 8 ? end - j : 8;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *visible = mask + r * kv_len + j;
            if (blind8(visible, width)) continue;
            const int whole = width == 8 && sees8(visible);
            for (int64_t hh = h0; hh < h1; hh++) {
                const int64_t i = (r - r0) * nh + hh - h0;
                float *out = s->att + (r * heads + hh) * d;
                const float *p = scores + i * kv_len;
                if (whole) {
                    add_values(out, p + used[i], values, j * d, 8, d, half);
                    used[i] += 8;
                } else {
                    for (int64_t t = 0; t < width; t++)
                        if (visible[t]) add_values(out, p + used[i]++, values, (j + t) * d, 1, d, half);
                }
            }
        }
    }
}

#define UNIT_QUERIES 16 /* most queries per unit (its scores are [queries, kv_len]) */

/* How attend() cuts a kv head's q_len rows x groups heads into units of at most UNIT_QUERIES queries: the largest
units (each reads its slice of the cache once) that still give the threads enough to balance: as many units as
threads for one-token rows, which are bound by reading the cache; otherwise a multiple of the threads from twice
their number, or four times it. Halves the rows per unit, then the heads, until then. -> units; *rows_per, *heads_per
(chunks as even as the counts allow). */
static int64_t unit_shape(int64_t batch, int64_t q_len, int64_t kv_heads, int64_t groups, int64_t threads,
                          int64_t *rows_per, int64_t *heads_per) {
    int64_t hc = groups < UNIT_QUERIES ? groups : UNIT_QUERIES, rc = UNIT_QUERIES / hc;
    for (;;) {
        rc = rc < q_len ? rc : q_len;
        rc = (q_len + (q_len + rc - 1) / rc - 1) / ((q_len + rc - 1) / rc); /* even chunks of the same count */
        hc = (groups + (groups + hc - 1) / hc - 1) / ((groups + hc - 1) / hc);
        const int64_t units = batch * kv_heads * ((q_len + rc - 1) / rc) * ((groups + hc - 1) / hc);
        if ((q_len == 1 && units >= threads) || (units >= 2 * threads && units % threads == 0) || units >= 4 * threads
            || (rc == 1 && hc == 1)) {
            *rows_per = rc, *heads_per = hc;
            return units;
        }
        if (rc > 1) rc = (rc + 1) / 2;
        else hc = (hc + 1) / 2;
    }
}

/* att[r, h, :] for every row and head, unit by unit (unit_shape, from the longest batch row; dynamic schedule).
Against one unit per row and head: docs/design-notes.md, "Native decoder layers" (scripts/bench_attention.c). */
static void attend(const decoder_layer_t *L, const scratch_t *s, int64_t batch, const int64_t *starts,
                   void *const *kbase, void *const *vbase, const int64_t *cap, const uint8_t *mask, int64_t kv_len,
                   int64_t threads) {
    const int64_t d = L->head_dim, kv_heads = L->kv_heads, groups = L->heads / L->kv_heads;
    int64_t longest = 1, rc, hc, units = 0;
    for (int64_t b = 0; b < batch; b++)
        longest = starts[b + 1] - starts[b] > longest ? starts[b + 1] - starts[b] : longest;
    unit_shape(batch, longest, kv_heads, groups, threads, &rc, &hc);
    const int64_t hchunks = (groups + hc - 1) / hc, queries = rc * hc;
    for (int64_t b = 0; b < batch; b++) units += kv_heads * ((starts[b + 1] - starts[b] + rc - 1) / rc) * hchunks;
    int64_t(*unit)[4] = malloc(sizeof(int64_t[4]) * (units > 0 ? units : 1)); /* batch row, kv head, r0, h0 */
    int64_t u = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t kvh = 0; kvh < kv_heads; kvh++)
            for (int64_t r0 = starts[b]; r0 < starts[b + 1]; r0 += rc)
                for (int64_t hi = 0; hi < hchunks; hi++, u++)
                    unit[u][0] = b, unit[u][1] = kvh, unit[u][2] = r0, unit[u][3] = kvh * groups + hi * hc;
#pragma omp parallel num_threads((int)threads)
    {
        float *scores = malloc(sizeof(float) * queries * (kv_len > 0 ? kv_len : 1));
        int64_t *used = malloc(sizeof(int64_t) * queries);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < units; i++) {
            const int64_t b = unit[i][0], kvh = unit[i][1], r0 = unit[i][2], h0 = unit[i][3];
            const int64_t r1 = r0 + rc < starts[b + 1] ? r0 + rc : starts[b + 1];
            const int64_t h1 = h0 + hc < (kvh + 1) * groups ? h0 + hc : (kvh + 1) * groups;
            const int64_t at = kvh * cap[b] * d; /* the kv head's first element in row b's buffers */
            if (L->kv_half)
                attend_unit(L, s, r0, r1, h0, h1, (const uint16_t *)kbase[b] + at, (const uint16_t *)vbase[b] + at,
                            mask, kv_len, scores, used, 1);
            else
                attend_unit(L, s, r0, r1, h0, h1, (const float *)kbase[b] + at, (const float *)vbase[b] + at, mask,
                            kv_len, scores, used, 0);
        }
        free(scores);
        free(used);
    }
    free(unit);
}

/* One layer over R = starts[batch] rows on `threads` threads (>= 1); x [R, hidden] updated in place; cos/sin
[R, head_dim]. */
static void decoder_layer(const decoder_layer_t *L, float *x, int64_t rows, int64_t batch, const int64_t *starts,
                   const float *cos, const float *sin, void *const *kbase, void *const *vbase, const int64_t *cap,
                   const int64_t *slot, const uint8_t *mask, int64_t kv_len, const scratch_t *s, int64_t threads) {
    const int64_t H = L->hidden, d = L->head_dim, kvd = L->kv_heads * d;
    /* attention */
    rms_norm(x, L->norm_in, L->eps, rows, H, s->h);
    SD(quantize_activations)(s->h, rows, H, s->xq, s->xd, s->xs);
    linear(&L->q, s, rows, s->q, threads);
    linear(&L->k, s, rows, s->k, threads);
    linear(&L->v, s, rows, s->v, threads);
    if (L->q_norm) rms_norm(s->q, L->q_norm, L->eps, rows * L->heads, d, s->q); /* in place: a head at a time */
    if (L->k_norm) rms_norm(s->k, L->k_norm, L->eps, rows * L->kv_heads, d, s->k);
    rotary(s->q, cos, sin, rows, L->heads, d);
    rotary(s->k, cos, sin, rows, L->kv_heads, d);
    for (int64_t b = 0; b < batch; b++) /* write this pass's keys and values before anyone reads them */
        for (int64_t r = starts[b]; r < starts[b + 1]; r++)
            for (int64_t kvh = 0; kvh < L->kv_heads; kvh++) {
                const int64_t at = (kvh * cap[b] + slot[r]) * d;
                store_cache(kbase[b], at, s->k + r * kvd + kvh * d, d, L->kv_half);
                store_cache(vbase[b], at, s->v + r * kvd + kvh * d, d, L->kv_half);
            }
    attend(L, s, batch, starts, kbase, vbase, cap, mask, kv_len, threads);
    SD(quantize_activations)(s->att, rows, L->heads * d, s->xq, s->xd, s->xs);
    linear(&L->o, s, rows, s->out, threads);
    if (L->norm_attn_out) rms_norm(s->out, L->norm_attn_out, L->eps, rows, H, s->out);
    for (int64_t i = 0; i < rows * H; i++) x[i] += s->out[i];
    /* gated MLP */
    rms_norm(x, L->norm_post, L->eps, rows, H, s->h);
    SD(quantize_activations)(s->h, rows, H, s->xq, s->xd, s->xs);
    linear(&L->gate, s, rows, s->g, threads);
    linear(&L->up, s, rows, s->u, threads);
    const int64_t I = L->inter;
    if (L->gelu)
        gelu_mul(s->g, s->u, rows, I);
    else
        silu_mul(s->g, s->u, rows, I);
    SD(quantize_activations)(s->g, rows, I, s->xq, s->xd, s->xs);
    linear(&L->down, s, rows, s->out, threads);
    if (L->norm_mlp_out) rms_norm(s->out, L->norm_mlp_out, L->eps, rows, H, s->out);
    for (int64_t i = 0; i < rows * H; i++) x[i] += s->out[i];
}

/* native.h: all of a pass's layers in one call from Python rather than one call a layer. */
void SD(decoder_layers)(const decoder_layer_t *const *L, int64_t n, float *x, int64_t rows, int64_t batch,
                        const int64_t *starts, const float *const *cos, const float *const *sin,
                        void *const *pointers, const int64_t *slot, const uint8_t *const *mask, int64_t kv_len,
                        const scratch_t *s, int64_t threads) {
    for (int64_t i = 0; i < n; i++) {
        void *const *at = pointers + 3 * i * batch;
        const int64_t kind = L[i]->kind;
        decoder_layer(L[i], x, rows, batch, starts, cos[kind], sin[kind], at, at + batch,
                      (const int64_t *)(at + 2 * batch), slot, mask[kind], kv_len, s, threads);
    }
}
