/* Not a test (run by hand): time layers.c's attention alone, 2 threads, over 30 (or [layers]) layers' worth of distinct caches
(so keys and values come from memory as in a real pass); prints the best of `reps` and a checksum, which is the
same for every build of the same arithmetic. Compare two versions of layers.c (docs/design-notes.md,
"Native decoder layers"):

    git show REV:specdecode/quant/layers.c > /tmp/old_layers.c
    for v in /tmp/old_layers.c specdecode/quant/layers.c; do
      gcc -O3 -mavx2 -mfma -mf16c -fopenmp -DLAYERS="\"$PWD/$v\"" scripts/bench_attention.c specdecode/quant/kernels.c \
          -o /tmp/attn -lm && /tmp/attn 9 3 64 6 600 200   # heads kv_heads head_dim rows slots reps [layers]
    done
(a path under /tmp needs no $PWD/ prefix). The last `rows` slots are the pass's own rows, each seeing the
earlier ones (a causal chain). */
#include LAYERS
#include <stdio.h>
#include <omp.h>
int main(int argc, char **argv) {
    int heads = atoi(argv[1]), kvh = atoi(argv[2]), d = atoi(argv[3]), rows = atoi(argv[4]), kv = atoi(argv[5]), reps = atoi(argv[6]);
    int cap = kv + 64;
    decoder_layer_t L = {0}; L.heads = heads; L.kv_heads = kvh; L.head_dim = d;
    scratch_t s = {0};
    s.q = malloc(sizeof(float) * rows * heads * d); s.att = malloc(sizeof(float) * rows * heads * d);
    for (int i = 0; i < rows * heads * d; i++) s.q[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    float *K = malloc(sizeof(float) * kvh * cap * d), *V = malloc(sizeof(float) * kvh * cap * d);
    for (long i = 0; i < (long)kvh * cap * d; i++) K[i] = (float)((i * 104729) % 997) / 997.0f - 0.5f, V[i] = K[i] * 0.5f;
    int64_t capa[1] = {cap};
    float *kb[1] = {K}, *vb[1] = {V};
    uint8_t *mask = malloc(rows * kv);
    for (int r = 0; r < rows; r++) for (int j = 0; j < kv; j++) mask[r * kv + j] = j < kv - rows ? 1 : (j - (kv - rows) <= r);
    /* 30 layers' worth of distinct caches to defeat the caches like a real pass */
    int layers = argc > 7 ? atoi(argv[7]) : 30;
    float **Ks = malloc(sizeof(float*) * layers), **Vs = malloc(sizeof(float*) * layers);
    for (int l = 0; l < layers; l++) { Ks[l] = malloc(sizeof(float) * kvh * cap * d); Vs[l] = malloc(sizeof(float) * kvh * cap * d); memcpy(Ks[l], K, sizeof(float)*kvh*cap*d); memcpy(Vs[l], V, sizeof(float)*kvh*cap*d);}
    double best = 1e9;
    for (int rep = 0; rep < reps; rep++) {
        double t = omp_get_wtime();
        for (int l = 0; l < layers; l++) { kb[0] = Ks[l]; vb[0] = Vs[l]; attend(&L, &s, rows, rows, kb, vb, capa, mask, kv, 2); }
        t = omp_get_wtime() - t;
        if (t < best) best = t;
    }
    double sum = 0; for (int i = 0; i < rows * heads * d; i++) sum += s.att[i];
    printf("rows %d slots %d: %.3f ms per %d layers (check %.6f)\n", rows, kv, best * 1e3, layers, sum);
}
