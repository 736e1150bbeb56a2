/* The attention of one row and one head on x86 vectors (included by llama.c): attend_avx2 (8 lanes) and
   attend_group_512 (16 lanes, several queries of one kv head at once), each the very operations of attend_portable
   in the same order, lane by lane (its fmaf as fmadd), so the same bits. */

/* Four keys' scores from their 8 lane sums each: the fixed tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)),
   the four trees at once through a 4x4 transpose, times scale. */
__attribute__((target("avx2"), always_inline))
static inline void score4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float scale, float *out) {
    __m128 x0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));    /* l_c + l_{c+4} */
    __m128 x1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
    __m128 x2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
    __m128 x3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
    _MM_TRANSPOSE4_PS(x0, x1, x2, x3);           /* x_c: lane c of the four keys */
    __m128 r = _mm_add_ps(_mm_add_ps(x0, x2), _mm_add_ps(x1, x3));
    _mm_storeu_ps(out, _mm_mul_ps(r, _mm_set1_ps(scale)));
}

/* Keys from..n-1 scored one at a time (attend_avx2's tail). */
__attribute__((target("avx2,fma")))
static void scores_rest_avx2(const float *q, const float *kc, const int32_t *pos, int64_t from, int64_t n, int64_t hd,
                             float scale, float *sc) {
    for (int64_t j = from; j < n; j++) {
        const float *k = kc + (int64_t)pos[j] * hd;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
        __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        __m128 s2 = _mm_add_ps(s1, _mm_movehl_ps(s1, s1));
        sc[j] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1))) * scale;
    }
}

/* sc_j <- exp(sc_j - max sc). */
__attribute__((target("avx2")))
static void softmax_weights_avx2(float *sc, int64_t n) {
    /* the max 8 lanes at a time (the same value in any order: max_ps keeps m past a NaN, as `>` does) */
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t j;
    for (j = 0; j + 8 <= n; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(sc + j), mv);
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, mv);
    for (int u = 0; u < 8; u++) m = lanes[u] > m ? lanes[u] : m;
    for (; j < n; j++) m = sc[j] > m ? sc[j] : m;
    mv = _mm256_set1_ps(m);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(sc + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv)));
    for (; j < n; j++) sc[j] = exp_poly(sc[j] - m);
}

/* o[c0 ..] = sum_j sc_j v_j, keys in order, 64 outputs at a time in registers; with `sum`, also *sum = sum_j sc_j
   in order, in the first pass's loop (its chain runs beside the products' instead of after them). */
__attribute__((target("avx2,fma")))
static void values_avx2(const float *vc, const int32_t *pos, int64_t n, int64_t hd, int64_t c0, const float *sc,
                        float *o, float *sum) {
    float s = 0.0f;
    for (int64_t c = c0; c < hd; c += 64, sum = NULL) {
        const int w = hd - c >= 64 ? 8 : (int)((hd - c) / 8);
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        if (w == 8) {                   /* the common head size: a constant trip count keeps a[] in registers */
            for (int64_t j = 0; j < n; j++) {
                const float *v = vc + (int64_t)pos[j] * hd + c;
                const __m256 pv = _mm256_set1_ps(sc[j]);
                if (sum) s = s + sc[j];
                for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * u), a[u]);
            }
        } else {
            for (int64_t j = 0; j < n; j++) {
                const float *v = vc + (int64_t)pos[j] * hd + c;
                const __m256 pv = _mm256_set1_ps(sc[j]);
                if (sum) s = s + sc[j];
                for (int u = 0; u < w; u++) a[u] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * u), a[u]);
            }
        }
        for (int u = 0; u < w; u++) _mm256_storeu_ps(o + c + 8 * u, a[u]);
        if (sum) *sum = s;
    }
}

static void normalise(float sum, int64_t hd, float *o) {
    for (int64_t i = 0; i < hd; i++) o[i] = o[i] / sum;
}

/* One row's attention for one head over `n` keys at cache positions `pos` (ascending; kc, vc: [cap, hd] of its kv
   head). Scores four keys at a time, each as 8 lane sums reduced by a fixed tree, ((l0 + l4) + (l2 + l6)) +
   ((l1 + l5) + (l3 + l7)) (four keys' trees at once through a 4x4 transpose), times scale; m = max; p_j =
   exp(s_j - m); o = (sum_j p_j v_j) / (sum_j p_j), sums in key order, 64 outputs at a time in registers. The same
   operations in the same order as attend_portable, so the same bits. */
__attribute__((target("avx2,fma")))
static void attend_avx2(const float *q, const float *kc, const float *vc, const int32_t *pos, int64_t n, int64_t hd,
                        float scale, float *sc, float *o) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = kc + (int64_t)pos[j] * hd, *k1 = kc + (int64_t)pos[j + 1] * hd;
        const float *k2 = kc + (int64_t)pos[j + 2] * hd, *k3 = kc + (int64_t)pos[j + 3] * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < hd; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
        }
        score4(a0, a1, a2, a3, scale, sc + j);
    }
    scores_rest_avx2(q, kc, pos, j, n, hd, scale, sc);
    softmax_weights_avx2(sc, n);
    float sum;
    values_avx2(vc, pos, n, hd, 0, sc, o, &sum);
    normalise(sum, hd, o);
}


/* Keys j.. (four at a time, while four remain) scored on 512-bit vectors: two keys to a vector (the first in lanes 0-7,
   the second in 8-15, q in both halves), each half accumulating exactly as attend_avx2's 8 lanes do. Returns the
   first key not scored. */
__attribute__((target(V512), always_inline))
static inline int64_t scores4_512(const float *q, const float *kc, const int32_t *pos, int64_t j, int64_t n, int64_t hd,
                                  float scale, float *sc) {
    for (; j + 4 <= n; j += 4) {
        const float *k0 = kc + (int64_t)pos[j] * hd, *k1 = kc + (int64_t)pos[j + 1] * hd;
        const float *k2 = kc + (int64_t)pos[j + 2] * hd, *k3 = kc + (int64_t)pos[j + 3] * hd;
        __m512 a01 = _mm512_setzero_ps(), a23 = a01;
        for (int64_t i = 0; i < hd; i += 8) {
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + i));
            const __m512 k01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k0 + i)),
                                                  _mm256_loadu_ps(k1 + i), 1);
            const __m512 k23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k2 + i)),
                                                  _mm256_loadu_ps(k3 + i), 1);
            a01 = _mm512_fmadd_ps(qv, k01, a01);
            a23 = _mm512_fmadd_ps(qv, k23, a23);
        }
        score4(_mm512_castps512_ps256(a01), _mm512_extractf32x8_ps(a01, 1), _mm512_castps512_ps256(a23),
               _mm512_extractf32x8_ps(a23, 1), scale, sc + j);
    }
    return j;
}

/* o[c] += sum_{t in [from, n)} sc_t v_t[c] for the 64-wide chunks c of the head (o holds the sums so far), keys in
   order; with `sum`, *sum += sc_t in the first chunk's loop. Returns the first output not covered (hd rounded down
   to 64). */
__attribute__((target(V512), always_inline))
static inline int64_t values64_512(const float *vc, const int32_t *pos, int64_t from, int64_t n, int64_t hd,
                                   const float *sc, float *o, float *sum) {
    int64_t c = 0;
    for (; c + 64 <= hd; c += 64) {
        __m512 a[4];
        for (int u = 0; u < 4; u++) a[u] = _mm512_loadu_ps(o + c + 16 * u);
        float s = sum ? *sum : 0.0f;
        for (int64_t t = from; t < n; t++) {
            const float *v = vc + (int64_t)pos[t] * hd + c;
            const __m512 pv = _mm512_set1_ps(sc[t]);
            if (c == 0) s = s + sc[t];
            for (int u = 0; u < 4; u++) a[u] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + 16 * u), a[u]);
        }
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(o + c + 16 * u, a[u]);
        if (c == 0 && sum) *sum = s;
    }
    return c;
}

/* attend_avx2 on 512-bit vectors, for up to GROUP queries of one kv head at once (a GQA group's heads, and rows of
   one sequence; one query is a group of one): each key and value loaded once for all of them, their sums in
   independent registers. Scores four keys at a time, two keys to a vector (`scores4_512`); weighted values 16 outputs
   to a vector, keys in order. The keys the queries share (their key lists' common prefix) are scored and summed
   together, each query's own keys after them alone: every query gets attend_avx2's operations in its order, lane by
   lane, so its bits. */
#define GROUP 4
__attribute__((target(V512), always_inline))
static inline void attend_group_body(const int M, const float *const *q, const float *kc, const float *vc,
                                     const int32_t *const *pos, const int64_t *n, int64_t hd, float scale,
                                     float *const *sc, float *const *o) {
    int64_t common = n[0];
    for (int m = 1; m < M; m++) {
        int64_t k = 0, lim = n[m] < common ? n[m] : common;
        if (pos[m] == pos[0]) k = lim;
        else while (k < lim && pos[m][k] == pos[0][k]) k++;
        common = k;
    }
    const int32_t *p0 = pos[0];
    int64_t j = 0;
    for (; j + 4 <= common; j += 4) {               /* the shared keys' scores, four keys at a time */
        const float *k0 = kc + (int64_t)p0[j] * hd, *k1 = kc + (int64_t)p0[j + 1] * hd;
        const float *k2 = kc + (int64_t)p0[j + 2] * hd, *k3 = kc + (int64_t)p0[j + 3] * hd;
        __m512 a01[GROUP], a23[GROUP];
        for (int m = 0; m < M; m++) a01[m] = a23[m] = _mm512_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8) {
            const __m512 k01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k0 + i)),
                                                  _mm256_loadu_ps(k1 + i), 1);
            const __m512 k23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k2 + i)),
                                                  _mm256_loadu_ps(k3 + i), 1);
            for (int m = 0; m < M; m++) {
                const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[m] + i));
                a01[m] = _mm512_fmadd_ps(qv, k01, a01[m]);
                a23[m] = _mm512_fmadd_ps(qv, k23, a23[m]);
            }
        }
        for (int m = 0; m < M; m++)
            score4(_mm512_castps512_ps256(a01[m]), _mm512_extractf32x8_ps(a01[m], 1), _mm512_castps512_ps256(a23[m]),
                   _mm512_extractf32x8_ps(a23[m], 1), scale, sc[m] + j);
    }
    float sum[GROUP];
    for (int m = 0; m < M; m++) {                   /* each query's own keys; its weights */
        int64_t jm = scores4_512(q[m], kc, pos[m], j, n[m], hd, scale, sc[m]);
        scores_rest_avx2(q[m], kc, pos[m], jm, n[m], hd, scale, sc[m]);
        softmax_weights_avx2(sc[m], n[m]);
        sum[m] = 0.0f;
    }
    int64_t c = 0;
    for (; c + 64 <= hd; c += 64) {                 /* the shared keys' weighted values, keys in order */
        __m512 a[GROUP][4];
        float s[GROUP];
        for (int m = 0; m < M; m++) {
            s[m] = 0.0f;
            for (int u = 0; u < 4; u++) a[m][u] = _mm512_setzero_ps();
        }
        for (int64_t t = 0; t < common; t++) {
            const float *v = vc + (int64_t)p0[t] * hd + c;
            const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            const __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
            for (int m = 0; m < M; m++) {
                const __m512 pv = _mm512_set1_ps(sc[m][t]);
                if (c == 0) s[m] = s[m] + sc[m][t];
                a[m][0] = _mm512_fmadd_ps(pv, v0, a[m][0]);
                a[m][1] = _mm512_fmadd_ps(pv, v1, a[m][1]);
                a[m][2] = _mm512_fmadd_ps(pv, v2, a[m][2]);
                a[m][3] = _mm512_fmadd_ps(pv, v3, a[m][3]);
            }
        }
        for (int m = 0; m < M; m++) {
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(o[m] + c + 16 * u, a[m][u]);
            if (c == 0) sum[m] = s[m];
        }
    }
    for (int m = 0; m < M; m++) {                   /* each query's own keys after them; the rest of the head */
        values64_512(vc, pos[m], common, n[m], hd, sc[m], o[m], &sum[m]);
        values_avx2(vc, pos[m], n[m], hd, c, sc[m], o[m], c == 0 ? &sum[m] : NULL);
        normalise(sum[m], hd, o[m]);
    }
}

__attribute__((target(V512)))
static void attend_group_512(int M, const float *const *q, const float *kc, const float *vc, const int32_t *const *pos,
                             const int64_t *n, int64_t hd, float scale, float *const *sc, float *const *o) {
    switch (M) {                        /* a constant count: the group's sums stay in registers */
    case 1: attend_group_body(1, q, kc, vc, pos, n, hd, scale, sc, o); break;
    case 2: attend_group_body(2, q, kc, vc, pos, n, hd, scale, sc, o); break;
    case 3: attend_group_body(3, q, kc, vc, pos, n, hd, scale, sc, o); break;
    default: attend_group_body(4, q, kc, vc, pos, n, hd, scale, sc, o); break;
    }
}
