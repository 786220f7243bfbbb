/* One decoder layer of a Llama-family model (Llama, Qwen2) over packed weights, in one call.

transformers' eager layer is ~50 small torch operations and seven linear layers, each a Python call that
quantizes its own input: at a one-token pass that dispatch is most of the time for a small model (SmolLM2 135M:
~40 ms a pass, of which the packed weights take ~6). Here a layer is one call: the input is quantized once
per use (q/k/v share it, gate/up share it), and norms, rotary embedding, attention and the gated MLP are plain
loops over the rows.

Every row's arithmetic is its own, in a fixed order: the linear layers' rows are independent (kernels.c) and
a row attends over exactly the cache slots its mask shows, in slot order, with one softmax per head. So a
verify pass of k tokens gives each token the bits a one-token pass gives it, and speculative output equals
plain decoding of the same model.

Layout: x [R, hidden] is the residual stream (updated in place); rows r = b * q + t for batch row b. Keys and
values of batch row b live in its own buffers [kv_heads, cap[b], head_dim] (kv_cache.py); row r writes slot
slot[r] and reads the slots j < kv_len with mask[r * kv_len + j] != 0. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void quantize_activations(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scale, float *sums);
void gemm_q4_on(const uint8_t *w, const uint16_t *wd, const uint16_t *wm, int64_t n, int64_t k, const int8_t *xq,
                const float *xd, const float *xs, int64_t rows, float *out, int64_t out_stride, int64_t threads);
void gemm_q8_on(const int8_t *w, const uint16_t *wd, int64_t n, int64_t k, const int8_t *xq, const float *xd,
                int64_t rows, float *out, int64_t out_stride, int64_t threads);

typedef struct {
    int64_t q4; /* 1: q4 codes with d and m; 0: q8 codes with d */
    int64_t n, k;
    const void *codes;
    const uint16_t *d, *m;
    const float *bias; /* [n] or NULL */
} qlinear;

typedef struct {
    qlinear q, k, v, o, gate, up, down;
    const float *norm_in, *norm_post; /* [hidden] */
    float eps;
    int64_t heads, kv_heads, head_dim, hidden, inter;
} decoder_layer_t;

typedef struct { /* per-pass scratch, sized by the caller for R rows */
    int8_t *xq;     /* [R, max(hidden, inter)] */
    float *xd, *xs; /* [R, max(hidden, inter) / 32] */
    float *h;       /* [R, hidden] normed input */
    float *q, *k, *v; /* [R, heads * head_dim], [R, kv_heads * head_dim] x 2 */
    float *att;     /* [R, heads * head_dim] */
    float *g, *u;   /* [R, inter] */
    float *out;     /* [R, hidden] */
} scratch_t;

/* y[r, :] = (x[r, :] quantized) @ W^T (+ bias), given x already quantized into s->xq/xd/xs with k columns. */
static void linear(const qlinear *w, const scratch_t *s, int64_t rows, float *y, int64_t threads) {
    if (w->q4)
        gemm_q4_on((const uint8_t *)w->codes, w->d, w->m, w->n, w->k, s->xq, s->xd, s->xs, rows, y, w->n, threads);
    else
        gemm_q8_on((const int8_t *)w->codes, w->d, w->n, w->k, s->xq, s->xd, rows, y, w->n, threads);
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
void rms_norm_rows(const float *x, const float *weight, float eps, int64_t rows, int64_t n, float *h) {
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

static inline float dot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float total = _mm_cvtss_f32(s);
    for (; i < n; i++) total += a[i] * b[i];
    return total;
}

/* dot(q, k0..k3) into out[0..3], each summed exactly as dot() sums it (for d a multiple of 8) */
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3, int64_t d,
                        float *out) {
    if (d % 8) {
        out[0] = dot(q, k0, d), out[1] = dot(q, k1, d), out[2] = dot(q, k2, d), out[3] = dot(q, k3, d);
        return;
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + i), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + i), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + i), a3);
    }
    const __m256 acc[4] = {a0, a1, a2, a3};
    for (int j = 0; j < 4; j++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[j] = _mm_cvtss_f32(s);
    }
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

/* out[:d] = sum_i p[i] * values[seen[i], :d], accumulated in registers 32 columns at a time, i in order */
static void weighted_sum(const float *p, const int32_t *seen, int64_t n, const float *values, int64_t d, float *out) {
    int64_t e = 0;
    for (; e + 32 <= d; e += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            const __m256 w = _mm256_set1_ps(p[i]);
            const float *v = values + (int64_t)seen[i] * d + e;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a3);
        }
        _mm256_storeu_ps(out + e, a0);
        _mm256_storeu_ps(out + e + 8, a1);
        _mm256_storeu_ps(out + e + 16, a2);
        _mm256_storeu_ps(out + e + 24, a3);
    }
    for (; e < d; e++) {
        float a = 0.0f;
        for (int64_t i = 0; i < n; i++) a = fmaf(p[i], values[(int64_t)seen[i] * d + e], a);
        out[e] = a;
    }
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

/* att[r, h, :] = softmax(q[r, h] . K_j * scale over visible j) @ V_j, for every row and head */
static void attend(const decoder_layer_t *L, const scratch_t *s, int64_t rows, int64_t q_len, float *const *kbase,
                   float *const *vbase, const int64_t *cap, const uint8_t *mask, int64_t kv_len, int64_t threads) {
    const int64_t heads = L->heads, d = L->head_dim, groups = L->heads / L->kv_heads;
    const float scale = 1.0f / sqrtf((float)d);
#pragma omp parallel num_threads((int)threads)
    {
        float *scores = malloc(sizeof(float) * (kv_len > 0 ? kv_len : 1));
        int32_t *seen = malloc(sizeof(int32_t) * (kv_len > 0 ? kv_len : 1));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t hh = 0; hh < heads; hh++) {
                const int64_t b = r / q_len, kvh = hh / groups;
                const float *keys = kbase[b] + kvh * cap[b] * d, *values = vbase[b] + kvh * cap[b] * d;
                const uint8_t *visible = mask + r * kv_len;
                const float *query = s->q + (r * heads + hh) * d;
                int64_t n = 0;
                for (int64_t j = 0; j < kv_len; j++)
                    if (visible[j]) seen[n++] = (int32_t)j;
                int64_t i = 0;
                for (; i + 4 <= n; i += 4) /* four independent dot products at a time; each sums in dot()'s order */
                    dot4(query, keys + (int64_t)seen[i] * d, keys + (int64_t)seen[i + 1] * d,
                         keys + (int64_t)seen[i + 2] * d, keys + (int64_t)seen[i + 3] * d, d, scores + i);
                for (; i < n; i++) scores[i] = dot(query, keys + (int64_t)seen[i] * d, d);
                float best = -INFINITY;
                for (i = 0; i < n; i++) {
                    scores[i] *= scale;
                    if (scores[i] > best) best = scores[i];
                }
                const float total = exp_shifted(scores, n, best);
                const float inv = total > 0.0f ? 1.0f / total : 0.0f;
                for (i = 0; i < n; i++) scores[i] *= inv;
                weighted_sum(scores, seen, n, values, d, s->att + (r * heads + hh) * d);
            }
        free(scores);
        free(seen);
    }
}

/* One layer over R = b * q_len rows on `threads` threads (>= 1); x [R, hidden] updated in place; cos/sin
[R, head_dim]. */
void decoder_layer(const decoder_layer_t *L, float *x, int64_t rows, int64_t q_len, const float *cos,
                   const float *sin, float *const *kbase, float *const *vbase, const int64_t *cap,
                   const int64_t *slot, const uint8_t *mask, int64_t kv_len, const scratch_t *s, int64_t threads) {
    const int64_t H = L->hidden, d = L->head_dim, kvd = L->kv_heads * d;
    /* attention */
    rms_norm(x, L->norm_in, L->eps, rows, H, s->h);
    quantize_activations(s->h, rows, H, s->xq, s->xd, s->xs);
    linear(&L->q, s, rows, s->q, threads);
    linear(&L->k, s, rows, s->k, threads);
    linear(&L->v, s, rows, s->v, threads);
    rotary(s->q, cos, sin, rows, L->heads, d);
    rotary(s->k, cos, sin, rows, L->kv_heads, d);
    for (int64_t r = 0; r < rows; r++) { /* write this pass's keys and values before anyone reads them */
        const int64_t b = r / q_len;
        for (int64_t kvh = 0; kvh < L->kv_heads; kvh++) {
            memcpy(kbase[b] + (kvh * cap[b] + slot[r]) * d, s->k + r * kvd + kvh * d, sizeof(float) * d);
            memcpy(vbase[b] + (kvh * cap[b] + slot[r]) * d, s->v + r * kvd + kvh * d, sizeof(float) * d);
        }
    }
    attend(L, s, rows, q_len, kbase, vbase, cap, mask, kv_len, threads);
    quantize_activations(s->att, rows, L->heads * d, s->xq, s->xd, s->xs);
    linear(&L->o, s, rows, s->out, threads);
    for (int64_t i = 0; i < rows * H; i++) x[i] += s->out[i];
    /* gated MLP */
    rms_norm(x, L->norm_post, L->eps, rows, H, s->h);
    quantize_activations(s->h, rows, H, s->xq, s->xd, s->xs);
    linear(&L->gate, s, rows, s->g, threads);
    linear(&L->up, s, rows, s->u, threads);
    const int64_t I = L->inter;
    silu_mul(s->g, s->u, rows, I);
    quantize_activations(s->g, rows, I, s->xq, s->xd, s->xs);
    linear(&L->down, s, rows, s->out, threads);
    for (int64_t i = 0; i < rows * H; i++) x[i] += s->out[i];
}
