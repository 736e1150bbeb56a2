/* Path 2 (AVX2 without VNNI) of qx.c's products: the K types, Q5_0 / Q5_1 and q4q8.c's Q4_0 / Q4_1 layout (kind
   QX_MINS), 8 outputs x R rows a pass. Included by qx.c.

vpmaddubsw sums two code x activation products into int16 (saturating, never reached: |2 * 63 * 127| < 32767);
the int16 sums of a sub-block are added in int16 over as many code vectors as cannot overflow, then widened once by
vpmaddwd: a vector adds at most 4 * 127 * (largest code) to a lane, so 4-bit codes take the whole block (4 * 7620),
5-bit codes two vectors (2 * 15748), 6-bit ones one (32004). The integer sums are exact, then the float steps are
qx_accumulate's, in its order: the same bits as every other path. */

/* a sub-block's code vectors added in int16 before widening */
#define QX_SPAN(HIGH, SUB16) (!(HIGH) ? 4 : (SUB16) ? 1 : 2)

/* float(s - QX_MAGIC) for sums started at QX_MAGIC (qx.c: exact while |sum| < 2^22) */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline __m256 qx_magic256(__m256i s) {
    return _mm256_sub_ps(_mm256_castsi256_ps(s), _mm256_set1_ps(12582912.0f));
}

/* Rows 0 .. R - 1 (R a compile-time constant, 1 to 4) of one column group. Blocks in order, read front to back (the
   next ones prefetched); per block the codes unpacked once, then row by row: per sub-block the integer sums
   (started at QX_MAGIC - off * qs: the offset folded in, exact) and its float step, then the mins. A row's work
   needs few registers beside the 8 code vectors, so no sum is spilled. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void qx_avx2_pass(const uint8_t *w, int64_t nb, int kind, const int8_t *q8, const float *dx,
                                const float *sx, const int32_t *qs16, int64_t k, float *y, int64_t n, const int R,
                                const int HIGH, const int SUB16, const int MINS, const int SUPER, const int BYTES) {
    const int flags = HIGH | SUB16 | MINS | SUPER | BYTES;     /* the flag bits themselves: sizes fold to constants */
    const int64_t off = kind >> 8, BB = qx_block_bytes(flags), HB = qx_header_bytes(flags);
    const int subs = SUB16 ? 2 : 1, span = QX_SPAN(HIGH, SUB16), per = 4 / subs;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4], d = _mm256_setzero_ps(), nd = _mm256_setzero_ps();
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t *blk = w + HB;
    for (int64_t b = 0; b < nb; b++, blk += BB) {
        if (SUPER && b % SUPER_BLOCKS == 0) {
            if (b) blk += HB;
            d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk - HB)));
            if (MINS) nd = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk - HB + 16))),
                                     _mm256_set1_ps(-0.0f));
        }
        for (int64_t p = 0; p < BB; p += 64) _mm_prefetch((const char *)(blk + PREFETCH + p), _MM_HINT_T0);
        __m256 dw[2], mw = _mm256_setzero_ps();
        qx_block_scales256(blk, d, nd, HIGH, SUB16, MINS, SUPER, BYTES, dw, &mw);
        __m256i lo[4], hi[4];
        for (int h = 0; h < 4; h++) qx_codes(blk, h, HIGH, BYTES, &lo[h], &hi[h]);
        for (int i = 0; i < R; i++) {
            const int8_t *xq = q8 + i * k + b * QK;
            const int32_t *qs = qs16 + i * (k / 16) + 2 * b;
            for (int j = 0; j < subs; j++) {
                __m256i s32 = _mm256_set1_epi32((MINS || !off) ? QX_MAGIC
                                                               : QX_MAGIC - (int)off * (SUB16 ? qs[j] : qs[0] + qs[1]));
                for (int h0 = per * j; h0 < per * (j + 1); h0 += span) {
                    __m256i s16 = _mm256_setzero_si256();
                    for (int h = h0; h < h0 + span; h++) {
                        int32_t a, c;
                        memcpy(&a, xq + 8 * h, 4);
                        memcpy(&c, xq + 8 * h + 4, 4);
                        __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], _mm256_set1_epi32(a)),
                                                       _mm256_maddubs_epi16(hi[h], _mm256_set1_epi32(c)));
                        s16 = h == h0 ? p16 : _mm256_add_epi16(s16, p16);
                    }
                    s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
                }
                acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_mul_ps(dw[j], _mm256_set1_ps(dx[i * nb + b])),
                                                             qx_magic256(s32)));
            }
        }
        if (MINS)
            for (int i = 0; i < R; i++) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(mw, _mm256_set1_ps(sx[i * nb + b])));
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + i * n, acc[i]);
}

#define QX_ARGS256(r) w, nb, kind, q8 + (r) * k, dx + (r) * nb, sx + (r) * nb, qs16 + (r) * (k / 16), k, yg + (r) * n, n
#define QX_CALL256(F, RR) qx_avx2_pass(QX_ARGS256(r), RR, F & 1, F & 2, F & 4, F & 8, F & 16)
/* rows in passes of 4, then one pass for the rest */
#define QX_SETS256(F)                                                                                            \
    for (; r + 4 <= rows; r += 4) QX_CALL256(F, 4);                                                              \
    switch (rows - r) {                                                                                          \
        case 3: QX_CALL256(F, 3); break;                                                                         \
        case 2: QX_CALL256(F, 2); break;                                                                         \
        case 1: QX_CALL256(F, 1); break;                                                                         \
    }                                                                                                            \
    break;

__attribute__((target("avx2,fma,f16c")))
static void qx_group_avx2(const uint8_t *w, int64_t nb, int kind, const int8_t *q8, const float *dx, const float *sx,
                          const int32_t *qs16, int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    float *yg = y + g * GROUP_COLS;
    switch (kind & 31) {          /* q4q8.c's Q4_0 / Q4_1 (4), Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (and as bytes) */
        case 4: QX_SETS256(4)
        QX_KINDS(QX_SETS256)
        default: qx_group_scalar(w, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g);
    }
}
