/* Q4_1 weights x Q8 activations: y[r, n] = sum_k w[n, k] x[r, k], every row computed alone (batch-invariant).

Arithmetic ("q4q8", llama.cpp's for Q4_1 x Q8_1, with float32 scales):
  weights, per block of 32 along k:   w = dw * q + mw           q in 0..15, dw and mw float16 (the GGUF's own)
  activations, per row and block:     dx = max|x| / 127, q8 = rint(x / dx) in -127..127 (x * (1 / dx)),
                                      sx = dx * sum(q8)          (float32)
  per output, blocks b = 0, 1, ... in order:
      acc = acc + (dw * dx) * float(sum_k q * q8)                (integer sum exact)
      acc = acc + mw * sx
  every product and sum rounded to float32 (compiled without contraction into fused multiply-adds).

Each output's sum runs over its blocks in the same order whatever the number of rows in the call, on one thread:
a k-row call returns, bit for bit, what k one-row calls would. Threads split the output columns.

Weight layout (`q4q8_pack`): column groups of 8 outputs; per group and block, 128 bytes of codes then 8 dw and 8 mw
(float16). Codes: 4 vectors of 32 bytes; byte 4c + j of vector h holds, in its low nibble, the code of output c at
k = 8h + j and, in its high nibble, the code at k = 8h + 4 + j (c = 0..7, j = 0..3): unpacked, each 32-bit lane of a
vector is 4 consecutive codes of one output, which vpmaddubsw multiplies by 4 broadcast activation bytes.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __x86_64__
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define QK 32
#define GROUP_COLS 8
#define BLOCK_BYTES (QK * GROUP_COLS / 2 + 2 * GROUP_COLS * 2)   /* 128 codes + 16 dw + 16 mw = 160 */
#ifndef PREFETCH
#define PREFETCH 16384              /* bytes ahead of the block being read: more misses in flight than the streamer */
#endif

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else {                                  /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7F800000 | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* codes: uint8 [N, K] (0..15), dw, mw: uint16 (float16 bits) [N, K/32]; out: N/8 * K/32 * 160 bytes. */
void q4q8_pack(const uint8_t *codes, const uint16_t *dw, const uint16_t *mw, int64_t n, int64_t k, uint8_t *out) {
    int64_t nb = k / QK;
    for (int64_t g = 0; g < n / GROUP_COLS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = out + (g * nb + b) * BLOCK_BYTES;
            for (int h = 0; h < 4; h++)
                for (int c = 0; c < GROUP_COLS; c++)
                    for (int j = 0; j < 4; j++) {
                        const uint8_t *row = codes + (g * GROUP_COLS + c) * k + b * QK;
                        blk[h * 32 + 4 * c + j] = (uint8_t)((row[8 * h + j] & 0x0F) | ((row[8 * h + 4 + j] & 0x0F) << 4));
                    }
            uint16_t *s = (uint16_t *)(blk + 128);
            for (int c = 0; c < GROUP_COLS; c++) {
                s[c] = dw[(g * GROUP_COLS + c) * nb + b];
                s[GROUP_COLS + c] = mw[(g * GROUP_COLS + c) * nb + b];
            }
        }
}

/* One row's activations -> int8 blocks q8 [K], dx [K/32], sx [K/32]: per block of 32, amax = max |x| (a running
   max: amax = a > amax ? a : amax, from 0), d = amax / 127, q = rint(x / d) clamped to +-127, sx = d * sum q. */
static void quantize_row(const float *x, int64_t k, int8_t *q8, float *dx, float *sx) {
    for (int64_t b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) {
            float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            int q = (int)rintf(xb[i] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            q8[b * QK + i] = (int8_t)q;
            sum += q;
        }
        dx[b] = d;
        sx[b] = d * (float)sum;
    }
}

#ifdef __x86_64__
/* The same on 8 lanes: the running max as 8 lane maxima (max_ps(a, m) is a > m ? a : m), then across the lanes in
   order: the same value, as the maxima never hold a NaN; rint as round-to-nearest-even, the clamp and the integer sum
   exact. So quantize_row's bits, without its chain of 32 dependent maxima a block. */
__attribute__((target("avx2")))
static void quantize_row_avx2(const float *x, int64_t k, int8_t *q8, float *dx, float *sx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
        }
        float lane[8], amax = 0.0f;
        _mm256_storeu_ps(lane, m);
        for (int j = 0; j < 8; j++) amax = lane[j] > amax ? lane[j] : amax;
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(r), lo), hi);
            sum = _mm256_add_epi32(sum, q[i]);
        }
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(q8 + b * QK), _mm256_permutevar8x32_epi32(bytes, order));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
        dx[b] = d;
        sx[b] = d * (float)_mm_cvtsi128_si32(s);
    }
}
#endif

static int have_avx2(void);

void q4q8_quantize(const float *x, int64_t rows, int64_t k, int8_t *q8, float *dx, float *sx) {
    const int avx2 = have_avx2();
    for (int64_t r = 0; r < rows; r++) {
#ifdef __x86_64__
        if (avx2) { quantize_row_avx2(x + r * k, k, q8 + r * k, dx + r * (k / QK), sx + r * (k / QK)); continue; }
#endif
        quantize_row(x + r * k, k, q8 + r * k, dx + r * (k / QK), sx + r * (k / QK));
    }
}

/* The portable path: the same arithmetic, output by output. */
static void group_scalar(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, const float *sx,
                         int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < GROUP_COLS; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + b * BLOCK_BYTES;
                const int8_t *xq = q8 + r * k + b * QK;
                int isum = 0;
                for (int h = 0; h < 4; h++)
                    for (int j = 0; j < 4; j++) {
                        uint8_t byte = blk[h * 32 + 4 * c + j];
                        isum += (byte & 0x0F) * xq[8 * h + j] + (byte >> 4) * xq[8 * h + 4 + j];
                    }
                const uint16_t *s = (const uint16_t *)(blk + 128);
                float dd = half_to_float(s[c]) * dx[r * nb + b];
                float t = dd * (float)isum;
                acc = acc + t;
                float m = half_to_float(s[GROUP_COLS + c]) * sx[r * nb + b];
                acc = acc + m;
            }
            y[r * n + g * GROUP_COLS + c] = acc;
        }
}

#ifdef __x86_64__
#define ROWS 4
/* AVX2: 8 outputs x up to ROWS rows per pass over the group's blocks; codes unpacked once per pass. */
__attribute__((target("avx2,fma,f16c")))
static void group_avx2(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, const float *sx,
                       int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        __m256 acc[ROWS];
        for (int i = 0; i < ROWS; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * BLOCK_BYTES;
            __m256i s16[ROWS];
            for (int i = 0; i < ROWS; i++) s16[i] = _mm256_setzero_si256();
            for (int h = 0; h < 4; h++) {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
                __m256i lo = _mm256_and_si256(packed, low);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                for (int i = 0; i < nr; i++) {
                    const int8_t *xq = q8 + (r0 + i) * k + b * QK + 8 * h;
                    int32_t a, c;
                    memcpy(&a, xq, 4);
                    memcpy(&c, xq + 4, 4);
                    /* int16 sums of 16 products of |q8| <= 127 by q <= 15 stay below 32767 over a block */
                    s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)));
                    s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(c)));
                }
            }
            const uint16_t *s = (const uint16_t *)(blk + 128);
            __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
            __m256 mwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + GROUP_COLS)));
            for (int i = 0; i < nr; i++) {
                int64_t at = (r0 + i) * nb + b;
                __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[i], ones));
                __m256 t = _mm256_mul_ps(_mm256_mul_ps(dwv, _mm256_set1_ps(dx[at])), isum);
                acc[i] = _mm256_add_ps(acc[i], t);
                acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(mwv, _mm256_set1_ps(sx[at])));
            }
        }
        for (int i = 0; i < nr; i++) _mm256_storeu_ps(y + (r0 + i) * n + g * GROUP_COLS, acc[i]);
    }
}

#define VROWS 8
/* AVX-512 VNNI: vpdpbusd sums 4 code x activation products straight into int32 (no int16 stage); the larger
   register file holds 8 rows' sums, so each block's codes are unpacked once per 8 rows. R rows at a time, R a
   compile-time constant (a fixed trip count keeps every sum in a register): sets of 8, then 4, then 2, a last
   odd row through the AVX2 kernel (the same bits on every path). */
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"), always_inline))
static inline void vnni_rows(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, const float *sx,
                             int64_t k, float *y, int64_t n, int64_t g, const int R) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[VROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BLOCK_BYTES;
        __m256i s32[VROWS];
        for (int i = 0; i < R; i++) s32[i] = _mm256_setzero_si256();
        for (int h = 0; h < 4; h++) {
            __m256i packed = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
            __m256i lo = _mm256_and_si256(packed, low);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            for (int i = 0; i < R; i++) {
                const int8_t *xq = q8 + i * k + b * QK + 8 * h;
                int32_t a, c;
                memcpy(&a, xq, 4);
                memcpy(&c, xq + 4, 4);
                s32[i] = _mm256_dpbusd_epi32(s32[i], lo, _mm256_set1_epi32(a));
                s32[i] = _mm256_dpbusd_epi32(s32[i], hi, _mm256_set1_epi32(c));
            }
        }
        const uint16_t *s = (const uint16_t *)(blk + 128);
        __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
        __m256 mwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + GROUP_COLS)));
        for (int i = 0; i < R; i++) {
            int64_t at = i * nb + b;
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dwv, _mm256_set1_ps(dx[at])), _mm256_cvtepi32_ps(s32[i]));
            acc[i] = _mm256_add_ps(acc[i], t);
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(mwv, _mm256_set1_ps(sx[at])));
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + i * n + g * GROUP_COLS, acc[i]);
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
static void group_vnni(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, const float *sx,
                       int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) vnni_rows(w, nb, q8 + r * k, dx + r * nb, sx + r * nb, k, y + r * n, n, g, 8);
    for (; r + 4 <= rows; r += 4) vnni_rows(w, nb, q8 + r * k, dx + r * nb, sx + r * nb, k, y + r * n, n, g, 4);
    for (; r + 2 <= rows; r += 2) vnni_rows(w, nb, q8 + r * k, dx + r * nb, sx + r * nb, k, y + r * n, n, g, 2);
    if (r < rows) group_avx2(w, nb, q8 + r * k, dx + r * nb, sx + r * nb, rows - r, k, y + r * n, n, g);
}

static int have_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
static int have_vnni(void) {
    __builtin_cpu_init();
    return have_avx2() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
static int have_vnni512(void) {
    __builtin_cpu_init();
    return have_vnni() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}

/* AMX-INT8 (qx_amx.c's tile products): the CPU has it and the kernel lets this process use the tiles (asked once). */
static int have_amx_unit(void) {
    static int state = -1;
    if (state < 0) {
        unsigned a, b, c, d;
        state = 0;
        if (have_vnni512() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1))
            state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    }
    return state;
}
#else
static int have_avx2(void) { return 0; }
static int have_vnni(void) { return 0; }
static int have_vnni512(void) { return 0; }
static int have_amx_unit(void) { return 0; }
#endif
/* Path 5 runs only once Python's self-test allowed it (kernels_amx_allow), and takes the tiles from amx_rows rows up
   (the self-test measured where the tiles overtake the vectors: the store of each block's sums out of the tiles has a
   fixed cost that only several rows pay back). */
static int amx_rows = 0;
static int have_amx(void) { return amx_rows > 0 && have_amx_unit(); }

/* 1 if the tile unit can run here (before any self-test); rows > 0 enables path 5 in this library, tiles from that
   many rows up, 0 disables it. */
int kernels_amx_unit(void) { return have_amx_unit(); }
void kernels_amx_allow(int rows) { amx_rows = have_amx_unit() && rows > 0 ? rows : 0; }

/* Paths: 1 portable, 2 AVX2, 3 AVX-512 VNNI (256-bit vpdpbusd), 4 the same on 512-bit vectors where qx.c has them
   (two column groups at once; q4q8's and q8's kernels take path 3 there), 5 path 4 with qx.c's multi-row products on
   AMX tiles (qx_amx.c; every other product as path 4). The integer block sums are exact on every path and the float
   steps are the same, so all paths return the same bits. */
static int best_path(void) { return have_amx() ? 5 : have_vnni512() ? 4 : have_vnni() ? 3 : have_avx2() ? 2 : 1; }

static int choose(int path) {
    if (path == 0) return best_path();
    if (path == 5 && !have_amx()) return -2;
    if (path == 4 && !have_vnni512()) return -2;
    if (path == 3 && !have_vnni()) return -2;
    if (path == 2 && !have_avx2()) return -2;
    return path;
}

/* path: 0 = the best this CPU has, else the path named above. Returns the path used, -2 if this CPU lacks it. */
int q4q8_matmul_quantized(const uint8_t *w, const int8_t *q8, const float *dx, const float *sx, int64_t rows,
                          int64_t n, int64_t k, float *y, int path) {
    int64_t nb = k / QK, groups = n / GROUP_COLS;
    int use = choose(path);
    if (use < 0) return use;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * nb * BLOCK_BYTES;
#ifdef __x86_64__
        if (use >= 3) { group_vnni(wg, nb, q8, dx, sx, rows, k, y, n, g); continue; }
        if (use == 2) { group_avx2(wg, nb, q8, dx, sx, rows, k, y, n, g); continue; }
#endif
        group_scalar(wg, nb, q8, dx, sx, rows, k, y, n, g);
    }
    return use;
}

/* ---- Q8_0 weights (w = dw * q, q int8) x Q8 activations: a head stored as the GGUF's 8-bit blocks ------------
   per output, blocks in order: acc = acc + (dw * dx) * float(sum_k q * q8). Layout: column groups of 8 outputs; per
   group and block, 8 vectors of 32 bytes (vector t: output c's codes at k = 4t .. 4t + 3 in bytes 4c .. 4c + 3), then
   8 dw (float16). */
#define Q8_BLOCK_BYTES (QK * GROUP_COLS + 2 * GROUP_COLS)      /* 256 codes + 16 = 272 */

void q8_pack(const int8_t *codes, const uint16_t *dw, int64_t n, int64_t k, uint8_t *out) {
    int64_t nb = k / QK;
    for (int64_t g = 0; g < n / GROUP_COLS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = out + (g * nb + b) * Q8_BLOCK_BYTES;
            for (int t = 0; t < 8; t++)
                for (int c = 0; c < GROUP_COLS; c++)
                    for (int j = 0; j < 4; j++)
                        blk[t * 32 + 4 * c + j] = (uint8_t)codes[(g * GROUP_COLS + c) * k + b * QK + 4 * t + j];
            uint16_t *s = (uint16_t *)(blk + 256);
            for (int c = 0; c < GROUP_COLS; c++) s[c] = dw[(g * GROUP_COLS + c) * nb + b];
        }
}

static void q8_group_scalar(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, int64_t rows,
                            int64_t k, float *y, int64_t n, int64_t g) {
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < GROUP_COLS; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const int8_t *blk = (const int8_t *)(w + b * Q8_BLOCK_BYTES);
                const int8_t *xq = q8 + r * k + b * QK;
                int isum = 0;
                for (int t = 0; t < 8; t++)
                    for (int j = 0; j < 4; j++) isum += blk[t * 32 + 4 * c + j] * xq[4 * t + j];
                float dd = half_to_float(((const uint16_t *)(w + b * Q8_BLOCK_BYTES + 256))[c]) * dx[r * nb + b];
                acc = acc + dd * (float)isum;
            }
            y[r * n + g * GROUP_COLS + c] = acc;
        }
}

#ifdef __x86_64__
/* AVX2: R rows (a compile-time constant, 1 to 4) a pass; per block the 8 code vectors loaded and made |w| once,
   then row by row (few registers a row: nothing spilled). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q8_avx2_rows(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, int64_t k, float *y,
                                int64_t n, const int R) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q8_BLOCK_BYTES;
        for (int p = 0; p < Q8_BLOCK_BYTES; p += 64) _mm_prefetch((const char *)(blk + PREFETCH + p), _MM_HINT_T0);
        __m256i wv[8], aw[8];
        for (int t = 0; t < 8; t++) {
            wv[t] = _mm256_loadu_si256((const __m256i *)(blk + 32 * t));
            aw[t] = _mm256_sign_epi8(wv[t], wv[t]);                           /* |w| (w >= -127 in Q8_0) */
        }
        __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256)));
        for (int i = 0; i < R; i++) {
            __m256i s32 = _mm256_setzero_si256();
            for (int t = 0; t < 8; t++) {
                int32_t a;
                memcpy(&a, q8 + i * k + b * QK + 4 * t, 4);
                __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(a), wv[t]);    /* x with w's sign */
                s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[t], sx), ones));
            }
            __m256 dd = _mm256_mul_ps(dwv, _mm256_set1_ps(dx[i * nb + b]));
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s32)));
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + i * n, acc[i]);
}

__attribute__((target("avx2,fma,f16c")))
static void q8_group_avx2(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, int64_t rows,
                          int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    float *yg = y + g * GROUP_COLS;
    for (; r + 4 <= rows; r += 4) q8_avx2_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 4);
    switch (rows - r) {
        case 3: q8_avx2_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 3); break;
        case 2: q8_avx2_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 2); break;
        case 1: q8_avx2_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 1); break;
    }
}
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"), always_inline))
static inline void q8_vnni_rows(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, int64_t k, float *y,
                                int64_t n, const int R) {
    __m256 acc[VROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q8_BLOCK_BYTES;
        __m256i s32[VROWS];
        for (int i = 0; i < R; i++) s32[i] = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 32 * t));
            __m256i aw = _mm256_sign_epi8(wv, wv);                         /* |w| as unsigned bytes */
            for (int i = 0; i < R; i++) {
                int32_t a;
                memcpy(&a, q8 + i * k + b * QK + 4 * t, 4);
                s32[i] = _mm256_dpbusd_epi32(s32[i], aw, _mm256_sign_epi8(_mm256_set1_epi32(a), wv));
            }
        }
        __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256)));
        for (int i = 0; i < R; i++) {
            __m256 dd = _mm256_mul_ps(dwv, _mm256_set1_ps(dx[i * nb + b]));
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s32[i])));
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + i * n, acc[i]);
}

__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
static void q8_group_vnni(const uint8_t *w, int64_t nb, const int8_t *q8, const float *dx, int64_t rows,
                          int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    float *yg = y + g * GROUP_COLS;
    for (; r + 8 <= rows; r += 8) q8_vnni_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 8);
    for (; r + 4 <= rows; r += 4) q8_vnni_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 4);
    for (; r + 2 <= rows; r += 2) q8_vnni_rows(w, nb, q8 + r * k, dx + r * nb, k, yg + r * n, n, 2);
    if (r < rows) q8_group_avx2(w, nb, q8 + r * k, dx + r * nb, rows - r, k, y + r * n, n, g);
}
#endif

int q8_matmul_quantized(const uint8_t *w, const int8_t *q8, const float *dx, int64_t rows, int64_t n, int64_t k,
                        float *y, int path) {
    int64_t nb = k / QK, groups = n / GROUP_COLS;
    int use = choose(path);
    if (use < 0) return use;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * nb * Q8_BLOCK_BYTES;
#ifdef __x86_64__
        if (use >= 3) { q8_group_vnni(wg, nb, q8, dx, rows, k, y, n, g); continue; }
        if (use == 2) { q8_group_avx2(wg, nb, q8, dx, rows, k, y, n, g); continue; }
#endif
        q8_group_scalar(wg, nb, q8, dx, rows, k, y, n, g);
    }
    return use;
}

/* Quantize x and multiply by Q4 (`q8w` 0) or Q8_0 (`q8w` 1) weights. Returns the path used, -1 if out of memory. */
static int quantize_and_multiply(const uint8_t *w, const float *x, int64_t rows, int64_t n, int64_t k, float *y,
                                 int path, int q8w) {
    int8_t *q8 = malloc((size_t)(rows * k));
    float *dx = malloc(sizeof(float) * (size_t)(rows * (k / QK))), *sx = malloc(sizeof(float) * (size_t)(rows * (k / QK)));
    int used = -1;
    if (q8 && dx && sx) {
        q4q8_quantize(x, rows, k, q8, dx, sx);
        used = q8w ? q8_matmul_quantized(w, q8, dx, rows, n, k, y, path)
                   : q4q8_matmul_quantized(w, q8, dx, sx, rows, n, k, y, path);
    }
    free(q8);
    free(dx);
    free(sx);
    return used;
}

int q4q8_matmul(const uint8_t *w, const float *x, int64_t rows, int64_t n, int64_t k, float *y, int path) {
    return quantize_and_multiply(w, x, rows, n, k, y, path, 0);
}

int q8_matmul(const uint8_t *w, const float *x, int64_t rows, int64_t n, int64_t k, float *y, int path) {
    return quantize_and_multiply(w, x, rows, n, k, y, path, 1);
}

int q4q8_best_path(void) { return best_path(); }

int q4q8_path_ok(int path) { return path > 0 && choose(path) > 0; }
