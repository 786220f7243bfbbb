/* Not a test (run by hand): time layers.c's attention alone on 2 threads, over 30 (or `layers`) layers' worth of
distinct caches, so keys and values come from memory as in a real pass. Prints the best of `reps` and a checksum,
which is the same for every build of the same arithmetic. The last `rows` slots are the pass's own rows, each
seeing the earlier ones (a causal chain). To compare two versions of layers.c (docs/design-notes.md, "Native
decoder layers"):

    git show REV:specdecode/backends/cpu/layers.c > /tmp/old_layers.c  # specdecode/quant/layers.c before 6ff7d24;
                                      # REV from the ragged-rows commit on: before it, attend took (rows, q_len) for
                                      # (batch, starts)
    for v in /tmp/old_layers.c specdecode/backends/cpu/layers.c; do
      gcc -O3 -mavx2 -mfma -mf16c -fopenmp -DLAYERS="\"$(realpath $v)\"" scripts/bench_attention.c \
          specdecode/backends/cpu/kernels.c -o /tmp/attn -lm && /tmp/attn 9 3 64 6 600 200  # heads kv_heads head_dim rows slots reps [layers]
    done */
#include LAYERS
#include <omp.h>
#include <stdio.h>

static float *filled(size_t n, float scale) { /* a fixed pattern in [-0.5, 0.5) * scale */
    float *a = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) a[i] = ((float)((i * 104729) % 997) / 997.0f - 0.5f) * scale;
    return a;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s heads kv_heads head_dim rows slots reps [layers]\n", argv[0]);
        return 2;
    }
    const int heads = atoi(argv[1]), kvh = atoi(argv[2]), d = atoi(argv[3]), rows = atoi(argv[4]);
    const int kv = atoi(argv[5]), reps = atoi(argv[6]), layers = argc > 7 ? atoi(argv[7]) : 30;
    const size_t per_layer = (size_t)kvh * (kv + 64) * d; /* [kv_heads, capacity, head_dim] */
    decoder_layer_t L = {0};
    L.heads = heads, L.kv_heads = kvh, L.head_dim = d;
    scratch_t s = {0};
    s.q = filled((size_t)rows * heads * d, 1.0f);
    s.att = malloc(sizeof(float) * rows * heads * d);
    int64_t cap[1] = {kv + 64}, starts[2] = {0, rows};
    uint8_t *mask = malloc((size_t)rows * kv); /* the cache before the pass, then a causal chain of the pass's rows */
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < kv; j++) mask[r * kv + j] = j < kv - rows || j - (kv - rows) <= r;
    float **keys = malloc(sizeof(float *) * layers), **values = malloc(sizeof(float *) * layers);
    for (int l = 0; l < layers; l++) keys[l] = filled(per_layer, 1.0f), values[l] = filled(per_layer, 0.5f);
    double best = 1e9;
    for (int rep = 0; rep < reps; rep++) {
        const double start = omp_get_wtime();
        for (int l = 0; l < layers; l++) attend(&L, &s, 1, starts, (void *const *)&keys[l], (void *const *)&values[l], cap, mask, kv, 2);
        const double took = omp_get_wtime() - start;
        if (took < best) best = took;
    }
    double sum = 0;
    for (int i = 0; i < rows * heads * d; i++) sum += s.att[i];
    printf("rows %d slots %d: %.3f ms per %d layers (check %.6f)\n", rows, kv, best * 1e3, layers, sum);
    return 0;
}
