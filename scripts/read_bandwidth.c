/* Not a test (run by hand): the machine's read bandwidth as our kernels see it, a streaming read of 1 GiB by 2
threads with 32-byte loads, five times (GB/s each). Decoding one token is bound by it (docs/benchmarks.md), so
speed figures are labelled with it.

    gcc -O2 -mavx2 -fopenmp scripts/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const size_t n = (size_t)1 << 30;
    uint8_t *a = aligned_alloc(64, n);
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)i;
    for (int rep = 0; rep < 5; rep++) {
        const double t = omp_get_wtime();
        __m256i total = _mm256_setzero_si256();
#pragma omp parallel num_threads(2)
        {
            __m256i acc = _mm256_setzero_si256();
#pragma omp for schedule(static)
            for (size_t i = 0; i < n; i += 32) acc = _mm256_add_epi8(acc, _mm256_load_si256((const __m256i *)(a + i)));
#pragma omp critical
            total = _mm256_add_epi8(total, acc);
        }
        const double seconds = omp_get_wtime() - t;
        printf("%.1f GB/s (check %d)\n", n / seconds / 1e9, _mm256_extract_epi8(total, 3));
    }
    free(a);
    return 0;
}
