/* This machine's memory read bandwidth: the floor under a decoding step that streams a model's weights.

mem_read_gbs(bytes, repeats): OpenMP threads (torch's pool: the threads the forwards run on) sum a buffer of `bytes`
(far past the last-level cache) as 64-bit words; the best of `repeats` passes in GB/s (1e9 bytes / s), or -1 if the
buffer cannot be allocated. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double mem_read_gbs(int64_t bytes, int repeats) {
    int64_t n = bytes / 8;
    uint64_t *a = aligned_alloc(64, (size_t)n * 8);
    if (!a) return -1.0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = (uint64_t)i;        /* touched by the threads that will read it */
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < repeats; r++) {
        uint64_t total = 0;
        double t = seconds();
#pragma omp parallel for schedule(static) reduction(+ : total)
        for (int64_t i = 0; i < n; i++) total += a[i];
        double gbs = (double)bytes / (seconds() - t) / 1e9;
        sink += total;
        best = gbs > best ? gbs : best;
    }
    free(a);
    return best;
}
