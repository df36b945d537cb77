/* The int8 dot-product peak of one core at both vector widths: what a kernel 256 bits wide
 * (ilanes' registers, and every integer kernel of inferno's) leaves on a core whose AVX-512
 * datapath is 512 bits wide (Zen 5), where on one that splits a zmm instruction in two (Zen 4)
 * the two widths run alike. bench/int8_peak.py measures the 256-bit loop through Numba; this is
 * the same loop in C at both widths, since ilanes has no 512-bit integer vectors.
 *
 *     gcc -O2 -march=native bench/int8_peak.c -o /tmp/int8_peak && /tmp/int8_peak
 *
 * Eight independent accumulators, so the figure is the instruction's throughput, not its latency.
 * A multiply-add counts two operations (llama.cpp's "GFLOP/s" of a GEMM). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define PASSES 25000000L
/* One pass: eight independent accumulators a0..a7 += w . x */
#define EIGHT(dp) a0 = dp(a0, w, x); a1 = dp(a1, w, x); a2 = dp(a2, w, x); a3 = dp(a3, w, x); \
                  a4 = dp(a4, w, x); a5 = dp(a5, w, x); a6 = dp(a6, w, x); a7 = dp(a7, w, x);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avxvnni,avx2"))) static double ymm(void) {
    __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    double t = now();
    for (long p = 0; p < PASSES; p++) {
        __asm__ volatile("" : "+x"(w));  /* keeps the loop from being folded */
        EIGHT(_mm256_dpbusd_avx_epi32)
    }
    t = now() - t;
    volatile int sink = _mm256_extract_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)), 0)
                      + _mm256_extract_epi32(_mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)), 0);
    (void)sink;
    return PASSES * 8.0 * 32 * 2 / t / 1e9;
}

__attribute__((target("avx512f,avx512vnni"))) static double zmm(void) {
    __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    double t = now();
    for (long p = 0; p < PASSES; p++) {
        __asm__ volatile("" : "+v"(w));
        EIGHT(_mm512_dpbusd_epi32)
    }
    t = now() - t;
    volatile int sink = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)))
                      + _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    (void)sink;
    return PASSES * 8.0 * 64 * 2 / t / 1e9;
}

int main(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avxvnni"))
        printf("vpdpbusd ymm (AVX-VNNI): %.1f GOP/s\n", ymm());
    else
        printf("vpdpbusd ymm: no AVX-VNNI on this CPU\n");
    if (__builtin_cpu_supports("avx512vnni"))
        printf("vpdpbusd zmm (AVX512-VNNI): %.1f GOP/s\n", zmm());
    else
        printf("vpdpbusd zmm: no AVX512-VNNI on this CPU\n");
    return 0;
}
