/* The forward's row-wise steps (included by llama.c): RMS norms, the rotation, exp and SwiGLU. Each vector (a row, or
   a head of one) is computed alone by the same operations in the same order on every path, so a row's bits never
   depend on the path or on the rows beside it. */

/* out = w * (x * r), r = 1 / sqrtf(sum(x_i^2) / d + eps), the sum in index order. */
__attribute__((target_clones("avx2", "default")))
static void rms(const float *x, const float *w, int64_t d, float eps, float *out) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++) s = s + x[i] * x[i];
    float r = 1.0f / sqrtf(s / (float)d + eps);
    for (int64_t i = 0; i < d; i++) out[i] = w[i] * (x[i] * r);
}

/* M vectors x + v * stride (out + v * stride) at once, each exactly `rms`: its own sum in index order, the M sums'
   chains side by side (one sum's adds wait on each other; M sums keep the adder busy). */
__attribute__((always_inline))
static inline void rms_m(const int M, const float *x, int64_t stride, const float *w, int64_t d, float eps, float *out) {
    float s[8];
    for (int v = 0; v < M; v++) s[v] = 0.0f;
    for (int64_t i = 0; i < d; i++)
        for (int v = 0; v < M; v++) s[v] = s[v] + x[v * stride + i] * x[v * stride + i];
    for (int v = 0; v < M; v++) {
        float r = 1.0f / sqrtf(s[v] / (float)d + eps);
        for (int64_t i = 0; i < d; i++) out[v * stride + i] = w[i] * (x[v * stride + i] * r);
    }
}

__attribute__((target("avx2")))
static void rms_many_avx2(const float *x, int64_t count, int64_t stride, const float *w, int64_t d, float eps, float *out) {
    int64_t v = 0;
    for (; v + 8 <= count; v += 8) rms_m(8, x + v * stride, stride, w, d, eps, out + v * stride);
    for (; v + 4 <= count; v += 4) rms_m(4, x + v * stride, stride, w, d, eps, out + v * stride);
    for (; v + 2 <= count; v += 2) rms_m(2, x + v * stride, stride, w, d, eps, out + v * stride);
    for (; v < count; v++) rms(x + v * stride, w, d, eps, out + v * stride);
}

/* `count` vectors stride apart (in place when out == x): the portable path one at a time, the vector paths several
   at once; the same bits either way. */
static void rms_many(const float *x, int64_t count, int64_t stride, const float *w, int64_t d, float eps, float *out,
                     int path) {
#ifdef __x86_64__
    if (path >= 2) { rms_many_avx2(x, count, stride, w, d, eps, out); return; }
#endif
    for (int64_t v = 0; v < count; v++) rms(x + v * stride, w, d, eps, out + v * stride);
}

/* y_i = x_i cos_i + x_{i +- hd/2} sin_i (sin signed), in place. */
__attribute__((target_clones("avx2", "default")))
static void rotate(float *x, const float *cos, const float *sin, int64_t hd) {
    int64_t half = hd / 2;
    float tmp[512];
    for (int64_t i = 0; i < hd; i++) tmp[i] = x[i];
    for (int64_t i = 0; i < half; i++) x[i] = tmp[i] * cos[i] + tmp[i + half] * sin[i];
    for (int64_t i = half; i < hd; i++) x[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
}

/* exp(x) for float32 x, the same bits on every path: n = round(x log2 e) (by adding and subtracting 1.5 * 2^23), r = x - n ln2 (two-part ln2), 2^n times a
   degree-6 polynomial in r (Cephes' expf coefficients); x clamped to [-87.3, 88] (below: ~1e-38, not 0). Written
   without branches, so the loops that call it become vector code; relative error ~2e-7. */
static inline float exp_poly(float x) {
    x = x < -87.3f ? -87.3f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;     /* round to nearest even (|n| < 2^22) */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r;
    p = p + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

/* SwiGLU of one row: act = g / (1 + exp(-g)) * u. */
static void swiglu_portable(const float *g, const float *u, int64_t n, float *act) {
    for (int64_t i = 0; i < n; i++) act[i] = g[i] / (1.0f + exp_poly(-g[i])) * u[i];
}

#ifdef __x86_64__
/* The vector versions: the very operations above, 8 or 16 lanes at a time, so they return the portable versions'
   bits. */
#define EXP_LANES(V, P, I, CAST)                                                                                       \
    x = P##_max_ps(P##_min_ps(x, P##_set1_ps(88.0f)), P##_set1_ps(-87.3f));                                            \
    const V magic = P##_set1_ps(12582912.0f);                                                                          \
    V n = P##_sub_ps(P##_add_ps(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)), magic), magic);                     \
    V r = P##_sub_ps(x, P##_mul_ps(n, P##_set1_ps(0.693359375f)));                                                     \
    r = P##_sub_ps(r, P##_mul_ps(n, P##_set1_ps(-2.12194440e-4f)));                                                    \
    V p = P##_set1_ps(1.9875691500e-4f);                                                                               \
    p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.3981999507e-3f));                                                  \
    p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(8.3334519073e-3f));                                                  \
    p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(4.1665795894e-2f));                                                  \
    p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.6666665459e-1f));                                                  \
    p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(5.0000001201e-1f));                                                  \
    p = P##_add_ps(P##_mul_ps(p, P##_mul_ps(r, r)), r);                                                               \
    p = P##_add_ps(p, P##_set1_ps(1.0f));                                                                              \
    I e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);                                 \
    return P##_mul_ps(p, CAST(e))

__attribute__((target("avx2")))
static inline __m256 exp8(__m256 x) {
    EXP_LANES(__m256, _mm256, __m256i, _mm256_castsi256_ps);
}

/* act[i..] = g / (1 + exp(-g)) * u, L lanes at a time while L remain (EXP: the lanes' exp); i: where to go on. */
#define SWIGLU_LANES(V, P, L, EXP)                                                                                     \
    do {                                                                                                               \
        const V one = P##_set1_ps(1.0f), neg = P##_set1_ps(-0.0f);                                                    \
        for (; i + L <= n; i += L) {                                                                                   \
            V gv = P##_loadu_ps(g + i);                                                                                \
            V e = EXP(P##_xor_ps(gv, neg));                                                                            \
            P##_storeu_ps(act + i, P##_mul_ps(P##_div_ps(gv, P##_add_ps(one, e)), P##_loadu_ps(u + i)));              \
        }                                                                                                              \
    } while (0)

__attribute__((target("avx2")))
static void swiglu_avx2(const float *g, const float *u, int64_t n, float *act) {
    int64_t i = 0;
    SWIGLU_LANES(__m256, _mm256, 8, exp8);
    swiglu_portable(g + i, u + i, n - i, act + i);
}

__attribute__((target(V512)))
static inline __m512 exp16(__m512 x) {
    EXP_LANES(__m512, _mm512, __m512i, _mm512_castsi512_ps);
}

__attribute__((target(V512)))
static void swiglu_512(const float *g, const float *u, int64_t n, float *act) {
    int64_t i = 0;
    SWIGLU_LANES(__m512, _mm512, 16, exp16);
    swiglu_avx2(g + i, u + i, n - i, act + i);
}
#endif

/* path: vector_path's (3: 512-bit, 2: AVX2, 1: portable). */
static void swiglu(const float *g, const float *u, int64_t n, float *act, int path) {
#ifdef __x86_64__
    if (path == 3) { swiglu_512(g, u, n, act); return; }
    if (path >= 2) { swiglu_avx2(g, u, n, act); return; }
#endif
    swiglu_portable(g, u, n, act);
}
