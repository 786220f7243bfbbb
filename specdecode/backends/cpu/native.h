/* The native kernels' one interface: the packed layouts and decoder-layer descriptions kernels.c, layers.c and
the torch binding (ops.cpp) share, and the functions each CPU variant exports.

Every variant (AVX2, VNNI, AVX-512 VNNI, AMX, portable: setup.py builds them side by side from the same sources)
is compiled with SD_VARIANT set to its name, which prefixes its exported symbols (SD(gemm_q4) is avx2_gemm_q4 in
the AVX2 build); ops.cpp includes this header once per variant to declare them all and picks one at run time
by the CPU's features. */
#ifndef SPECDECODE_NATIVE_TYPES
#define SPECDECODE_NATIVE_TYPES
#include <stdint.h>

#define SD_QK 32 /* weights and activations are quantized in blocks of 32 inputs */

typedef struct {
    int64_t q4; /* 1: q4 codes with d and m; 0: q8 codes with d */
    int64_t n, k;
    const void *codes; /* q4: uint8 [n/8, k/32, 128]; q8: int8 [n/8, k/32, 256] (linear.py's _interleave) */
    const uint16_t *d, *m; /* fp16 [n/8, k/32, 8]; m only for q4 */
    const float *bias; /* [n] or NULL */
} qlinear_t;

typedef struct {
    qlinear_t q, k, v, o, gate, up, down;
    const float *norm_in, *norm_post; /* [hidden] */
    float eps;
    int64_t heads, kv_heads, head_dim, hidden, inter;
    int64_t kv_half; /* 1: the cache holds keys and values as fp16 (written rounded to nearest), else fp32 */
    const float *q_norm, *k_norm; /* [head_dim] or NULL: RMS norm of each head's query / key before the rotary */
    const float *norm_attn_out, *norm_mlp_out; /* [hidden] or NULL: norms of the blocks' outputs (Gemma 3) */
    float scale;  /* attention scores' scale (head_dim^-0.5 for most models) */
    int64_t gelu; /* 1: the MLP's gate is GELU (tanh approximation), else SiLU */
    int64_t kind; /* which of decoder_layers' masks and rotary tables: 0 full attention, 1 sliding window */
} decoder_layer_t;

typedef struct { /* per-pass scratch, sized by the caller for R rows */
    int8_t *xq;     /* [R, max(hidden, inter, heads * head_dim)] */
    float *xd, *xs; /* [R, max(hidden, inter, heads * head_dim) / 32] */
    float *h;       /* [R, hidden] normed input */
    float *q, *k, *v; /* [R, heads * head_dim], [R, kv_heads * head_dim] x 2 */
    float *att;     /* [R, heads * head_dim] */
    float *g, *u;   /* [R, inter] */
    float *out;     /* [R, hidden] */
} scratch_t;

#define SD_CAT_(a, b) a##_##b
#define SD_CAT(a, b) SD_CAT_(a, b)
#endif

/* Declared anew for each SD_VARIANT this header is included with (no include guard below). */
#ifdef SD_VARIANT
#undef SD
#define SD(name) SD_CAT(SD_VARIANT, name)
#ifdef __cplusplus
extern "C" {
#endif

/* x [R, K] fp32 -> codes [R, K] int8, scale [R, K/32], scaled sums [R, K/32] (scale * sum of codes). */
void SD(quantize_activations)(const float *x, int64_t rows, int64_t k, int8_t *codes, float *scale, float *sums);

/* out[r, col] (row stride out_stride) = x[r] . W[col] for packed q4 weights of n output columns (n a multiple of
8), activations quantized by quantize_activations, on `threads` threads (<= 0: OpenMP's default). */
void SD(gemm_q4)(const uint8_t *w, const uint16_t *wd, const uint16_t *wm, int64_t n, int64_t k, const int8_t *xq,
                 const float *xd, const float *xs, int64_t rows, float *out, int64_t out_stride, int64_t threads);

/* The same for packed q8 weights. */
void SD(gemm_q8)(const int8_t *w, const uint16_t *wd, int64_t n, int64_t k, const int8_t *xq, const float *xd,
                 int64_t rows, float *out, int64_t out_stride, int64_t threads);

/* h = x / sqrt(mean(x^2) + eps) * weight per row of x [rows, n] (the layers' norms). */
void SD(rms_norm_rows)(const float *x, const float *weight, float eps, int64_t rows, int64_t n, float *h);

/* Layers L[0..n) in turn over x [rows, hidden] (updated in place); pointers: [n, 3, batch] per layer its rows'
key buffers, value buffers and capacities (kv_cache.py's row_pointers); cos, sin, mask: per layer kind
(decoder_layer_t.kind) its rotary table [rows, head_dim] and mask [rows, kv_len]. */
void SD(decoder_layers)(const decoder_layer_t *const *L, int64_t n, float *x, int64_t rows, int64_t batch,
                        const int64_t *starts, const float *const *cos, const float *const *sin,
                        void *const *pointers, const int64_t *slot, const uint8_t *const *mask, int64_t kv_len,
                        const scratch_t *s, int64_t threads);

#ifdef __cplusplus
}
#endif
#endif
