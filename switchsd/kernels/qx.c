/* The GGUF block types past Q4_0 / Q4_1 (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) x Q8 activations, every row computed alone.

Each type is read, exactly, as unsigned codes of 4 to 6 bits per weight with float32 scales (switchsd/kernels/qx.py
decodes the GGUF blocks):
  w = dw_j * (code - off)            [+ mw_b]          j: a sub-block of 16 or 32 along k, b: a block of 32
  Q5_0: off 16; Q5_1: mins; Q4_K, Q5_K: dw = d * sc, mw = -dmin * m (exact in float32), mins; Q6_K: sub-blocks of 16,
  dw = d * sc, off 32.
Kind (an int): QX_HIGH (codes above 4 bits), QX_SUB16 (a scale per 16 along k), QX_MINS (a min per block; then off
is 0), QX_SUPER (the K types' scales), QX_BYTES (codes as whole bytes), off << 8.
Activations: q4q8.c's Q8 blocks (q8, dx, sx) and qs16, the integer sum of q8 over each 16.
Per output, blocks b in order, sub-blocks j in order:
  isum_j = sum_k code q8 - off * qs_j             (integers, exact)
  acc = acc + (dw_j * dx_b) * float(isum_j)
  acc = acc + mw_b * sx_b                         (mins only)
The same bits on every path and for any number of rows in a call (`reference` in qx.py spells it in numpy).

Layout (`qx_pack`): column groups of 8 outputs; per group, blocks in order, each: the 128 nibble bytes of q4q8.c
(byte 4c + j of vector h: code of output c at k = 8h + j in the low nibble, k = 8h + 4 + j in the high one); with
QX_HIGH and QX_SUPER (Q5_K, Q6_K), 2 vectors of 32 bytes holding bits 4-5 of those codes (vector p, byte 4c + j: nibble h - 2p for vector
h = 2p, 2p + 1; in a nibble, bits 0-1 for the low code, 2-3 for the high one); with QX_BYTES (Q5_0 / Q5_1 always, the K types with SWITCHSD_QX_BYTES=1) the
codes instead stay whole bytes, 8 vectors of 32 (vector v, byte 4c + j: the code at k = 4v + j: no unpacking, 8 bits a weight); then the scales, as the GGUF holds
them: Q5_0 / Q5_1 dw (and mw) as 8 float16; the K types (QX_SUPER) 8 (or 16: the first 16 k, then the second)
integer scales sc and, with mins, 8 integer mins m, each super-block of 8 blocks headed by 8 float16 d (and 8 dmin):
dw = d * sc and mw = -dmin * m, computed in float32 where used (exact: the same bits as the float32 scales). */
#include "q4q8.c"

#define QX_HIGH 1
#define QX_SUB16 2
#define QX_MINS 4
#define QX_SUPER 8                  /* scales as K types hold them: float16 d per 256, integer sc per 16 or 32 */
#define QX_BYTES 16                 /* codes as whole bytes (no unpacking): Q5_0 / Q5_1 always, K types by choice */
#define QX_SIGNED 32                /* bytes as signed codes, read as code + 128 (off 128): Q8_0's blocks, 512-bit only */
#define QX_Q8 (QX_BYTES | QX_SIGNED | 128 << 8)    /* q4q8.c's Q8_0 layout, its arithmetic */
#define SUPER_BLOCKS 8

/* bytes of one block's codes and scales; the K types' super-block header is apart (qx_header_bytes) */
static inline int64_t qx_code_bytes(int kind) {
    return (kind & QX_BYTES) ? 256 : (kind & QX_HIGH) ? 192 : 128;
}
static inline int64_t qx_block_bytes(int kind) {
    int64_t subs = (kind & QX_SUB16) ? 2 : 1, codes = qx_code_bytes(kind);
    if (kind & QX_SUPER) return codes + GROUP_COLS * subs + ((kind & QX_MINS) ? GROUP_COLS : 0);
    return codes + 2 * GROUP_COLS * subs + ((kind & QX_MINS) ? 2 * GROUP_COLS : 0);
}
static inline int64_t qx_header_bytes(int kind) {
    return (kind & QX_SUPER) ? 2 * GROUP_COLS * ((kind & QX_MINS) ? 2 : 1) : 0;
}
/* where block b of a group starts, from the group's start */
static inline int64_t qx_block_at(int kind, int64_t b) {
    if (!(kind & QX_SUPER)) return b * qx_block_bytes(kind);
    int64_t sb = qx_header_bytes(kind) + SUPER_BLOCKS * qx_block_bytes(kind);
    return (b / SUPER_BLOCKS) * sb + qx_header_bytes(kind) + (b % SUPER_BLOCKS) * qx_block_bytes(kind);
}
static inline int64_t qx_group_bytes(int kind, int64_t nb) {
    return (kind & QX_SUPER) ? nb / SUPER_BLOCKS * (qx_header_bytes(kind) + SUPER_BLOCKS * qx_block_bytes(kind))
                             : nb * qx_block_bytes(kind);
}

int64_t qx_packed_bytes(int64_t n, int64_t k, int kind) { return n / GROUP_COLS * qx_group_bytes(kind, k / QK); }

/* The scales of output c in block b (blk: the block; hdr: its super-block's header): dw[j] for its sub-blocks and
   mw, in float32. */
static inline void qx_scales(int kind, const uint8_t *blk, const uint8_t *hdr, int c, float dw[2], float *mw) {
    const int64_t subs = (kind & QX_SUB16) ? 2 : 1, at = qx_code_bytes(kind);
    if (kind & QX_SUPER) {
        float d = half_to_float(((const uint16_t *)hdr)[c]);
        for (int j = 0; j < subs; j++) {
            int sc = (kind & QX_SUB16) ? (int)((const int8_t *)(blk + at))[j * GROUP_COLS + c] : blk[at + c];
            dw[j] = d * (float)sc;
        }
        if (kind & QX_MINS)
            *mw = -half_to_float(((const uint16_t *)hdr)[GROUP_COLS + c]) * (float)blk[at + subs * GROUP_COLS + c];
    } else {
        const uint16_t *s = (const uint16_t *)(blk + at);
        for (int j = 0; j < subs; j++) dw[j] = half_to_float(s[j * GROUP_COLS + c]);
        if (kind & QX_MINS) *mw = half_to_float(s[subs * GROUP_COLS + c]);
    }
}

/* codes uint8 [N, K] (0..63). Q5_0 / Q5_1: dw, mw float16 bits [N, K/32] (mw NULL without mins). K types: d, dmin
   float16 bits [N, K/256], sc int8 [N, K/16 or K/32] (unsigned for Q4_K / Q5_K), m uint8 [N, K/32]. */
void qx_pack(const uint8_t *codes, const uint16_t *dw, const uint16_t *mw, const uint16_t *d, const uint8_t *sc,
             const uint16_t *dmin, const uint8_t *m, int64_t n, int64_t k, int kind, uint8_t *out) {
    const int64_t nb = k / QK, bb = qx_block_bytes(kind), subs = (kind & QX_SUB16) ? 2 : 1;
    const int64_t at = qx_code_bytes(kind);
    const int bytes = kind & QX_BYTES;
    memset(out, 0, (size_t)qx_packed_bytes(n, k, kind));
    for (int64_t g = 0; g < n / GROUP_COLS; g++) {
        uint8_t *grp = out + g * qx_group_bytes(kind, nb);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = grp + qx_block_at(kind, b);
            for (int h = 0; h < 4; h++)
                for (int c = 0; c < GROUP_COLS; c++)
                    for (int j = 0; j < 4; j++) {
                        const uint8_t *row = codes + (g * GROUP_COLS + c) * k + b * QK;
                        uint8_t a = row[8 * h + j], e = row[8 * h + 4 + j];
                        if (bytes) {
                            blk[(2 * h) * 32 + 4 * c + j] = a;
                            blk[(2 * h + 1) * 32 + 4 * c + j] = e;
                            continue;
                        }
                        blk[h * 32 + 4 * c + j] = (uint8_t)((a & 0x0F) | ((e & 0x0F) << 4));
                        if (kind & QX_HIGH)
                            blk[128 + (h >> 1) * 32 + 4 * c + j] |=
                                (uint8_t)((((a >> 4) & 3) | (((e >> 4) & 3) << 2)) << (4 * (h & 1)));
                    }
            for (int c = 0; c < GROUP_COLS; c++) {
                const int64_t o = g * GROUP_COLS + c;
                if (kind & QX_SUPER) {
                    if (b % SUPER_BLOCKS == 0) {
                        uint16_t *hdr = (uint16_t *)(blk - (b % SUPER_BLOCKS) * bb - qx_header_bytes(kind));
                        hdr[c] = d[o * (nb / SUPER_BLOCKS) + b / SUPER_BLOCKS];
                        if (kind & QX_MINS) hdr[GROUP_COLS + c] = dmin[o * (nb / SUPER_BLOCKS) + b / SUPER_BLOCKS];
                    }
                    for (int64_t j = 0; j < subs; j++) blk[at + j * GROUP_COLS + c] = sc[o * nb * subs + b * subs + j];
                    if (kind & QX_MINS) blk[at + subs * GROUP_COLS + c] = m[o * nb + b];
                } else {
                    uint16_t *s = (uint16_t *)(blk + at);
                    for (int64_t j = 0; j < subs; j++) s[j * GROUP_COLS + c] = dw[o * nb * subs + b * subs + j];
                    if (kind & QX_MINS) s[subs * GROUP_COLS + c] = mw[o * nb + b];
                }
            }
        }
    }
}

/* qs16 [rows, K/16]: the integer sum of each 16 activation codes. */
void qx_sums(const int8_t *q8, int64_t rows, int64_t k, int32_t *qs16) {
    for (int64_t i = 0; i < rows * (k / 16); i++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += q8[i * 16 + j];
        qs16[i] = s;
    }
}

static void qx_group_scalar(const uint8_t *w, int64_t nb, int kind, const int8_t *q8, const float *dx, const float *sx,
                            const int32_t *qs16, int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    const int64_t off = kind >> 8, subs = (kind & QX_SUB16) ? 2 : 1;
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < GROUP_COLS; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + qx_block_at(kind, b);
                const uint8_t *hdr = w + qx_block_at(kind, b - b % SUPER_BLOCKS) - qx_header_bytes(kind);
                const int8_t *xq = q8 + r * k + b * QK;
                int isum[2] = {0, 0};
                for (int h = 0; h < 4; h++)
                    for (int j = 0; j < 4; j++) {
                        uint8_t byte = blk[h * 32 + 4 * c + j];
                        int lo = byte & 0x0F, hi = byte >> 4;
                        if (kind & QX_BYTES) {
                            lo = blk[(2 * h) * 32 + 4 * c + j];
                            hi = blk[(2 * h + 1) * 32 + 4 * c + j];
                        } else if (kind & QX_HIGH) {
                            int hb = (blk[128 + (h >> 1) * 32 + 4 * c + j] >> (4 * (h & 1))) & 0x0F;
                            lo |= (hb & 3) << 4;
                            hi |= (hb >> 2) << 4;
                        }
                        isum[subs == 2 && h >= 2] += lo * xq[8 * h + j] + hi * xq[8 * h + 4 + j];
                    }
                float dw[2], mw = 0.0f;
                qx_scales(kind, blk, hdr, c, dw, &mw);
                const int32_t *qs = qs16 + r * (k / 16) + 2 * b;
                if (subs == 2) {
                    for (int j = 0; j < 2; j++) {
                        float t = (dw[j] * dx[r * nb + b]) * (float)(isum[j] - (int)off * qs[j]);
                        acc = acc + t;
                    }
                } else {
                    float t = (dw[0] * dx[r * nb + b]) * (float)(isum[0] - (int)off * (qs[0] + qs[1]));
                    acc = acc + t;
                }
                if (kind & QX_MINS) {
                    float mm = mw * sx[r * nb + b];
                    acc = acc + mm;
                }
            }
            y[r * n + g * GROUP_COLS + c] = acc;
        }
}

#ifdef __x86_64__
/* A block's scales for the 8 outputs as float32 vectors, exactly qx_scales': dw[j] per sub-block, mw (d, nd: the K
   types' super-block d and -dmin, as qx_scale_vectors reads them; unused otherwise). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void qx_block_scales256(const uint8_t *blk, __m256 d, __m256 nd, const int HIGH, const int SUB16,
                                      const int MINS, const int SUPER, const int BYTES, __m256 dw[2], __m256 *mw) {
    const int64_t subs = SUB16 ? 2 : 1, at = BYTES ? 256 : HIGH ? 192 : 128;
    if (SUPER) {
        for (int j = 0; j < subs; j++) {
            __m128i raw = _mm_loadl_epi64((const __m128i *)(blk + at + 8 * j));
            __m256i sc = SUB16 ? _mm256_cvtepi8_epi32(raw) : _mm256_cvtepu8_epi32(raw);
            dw[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
        }
        if (MINS) {
            __m128i raw = _mm_loadl_epi64((const __m128i *)(blk + at + 8 * subs));
            *mw = _mm256_mul_ps(nd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(raw)));
        }
    } else {
        for (int j = 0; j < subs; j++) dw[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + at + 16 * j)));
        if (MINS) *mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + at + 16 * subs)));
    }
}

/* The same from the block's super-block header (hdr), for a block read on its own. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void qx_scale_vectors(const uint8_t *blk, const uint8_t *hdr, const int HIGH, const int SUB16,
                                    const int MINS, const int SUPER, const int BYTES, __m256 dw[2], __m256 *mw) {
    __m256 d = _mm256_setzero_ps(), nd = _mm256_setzero_ps();
    if (SUPER) {
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hdr));
        if (MINS) nd = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hdr + 16))), _mm256_set1_ps(-0.0f));
    }
    qx_block_scales256(blk, d, nd, HIGH, SUB16, MINS, SUPER, BYTES, dw, mw);
}

/* A block's codes, vector h (0..3): lo, hi the codes at k = 8h + j and 8h + 4 + j (j = 0..3) of the 8 outputs. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void qx_codes(const uint8_t *blk, int h, const int HIGH, const int BYTES, __m256i *lo, __m256i *hi) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    if (BYTES) {                                       /* whole bytes */
        *lo = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        *hi = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        return;
    }
    __m256i packed = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
    *lo = _mm256_and_si256(packed, low);
    *hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    if (HIGH) {
        __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * (h >> 1)));
        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(p, 4 * (h & 1)), low);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(hb, three), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), three), 4));
    }
}

/* acc += a block's contribution for one row (s32: its integer sums, one per sub-block). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline __m256 qx_accumulate(__m256 acc, const __m256i s32[2], const __m256 dw[2], __m256 mw, float dx, float sx,
                                   const int32_t *qs, int64_t off, const int SUB16, const int MINS) {
    const __m256 dxv = _mm256_set1_ps(dx);
    if (SUB16) {
        for (int j = 0; j < 2; j++) {
            __m256i is = _mm256_sub_epi32(s32[j], _mm256_set1_epi32((int)off * qs[j]));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw[j], dxv), _mm256_cvtepi32_ps(is)));
        }
    } else {
        __m256i is = _mm256_sub_epi32(s32[0], _mm256_set1_epi32((int)off * (qs[0] + qs[1])));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw[0], dxv), _mm256_cvtepi32_ps(is)));
    }
    if (MINS) acc = _mm256_add_ps(acc, _mm256_mul_ps(mw, _mm256_set1_ps(sx)));
    return acc;
}

/* AVX-512 VNNI: R rows (a compile-time constant) per pass; vpdpbusd sums 4 products straight into int32. */
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"), always_inline))
static inline void qx_vnni_rows(const uint8_t *w, int64_t nb, int kind, const int8_t *q8, const float *dx,
                                const float *sx, const int32_t *qs16, int64_t k, float *y, int64_t n, const int R,
                                const int HIGH, const int SUB16, const int MINS, const int SUPER, const int BYTES) {
    const int64_t off = kind >> 8;
    __m256 acc[VROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + qx_block_at(kind, b);
        const uint8_t *hdr = w + qx_block_at(kind, b - b % SUPER_BLOCKS) - qx_header_bytes(kind);
        for (int64_t p = 0; p < 320; p += 64) _mm_prefetch((const char *)(blk + PREFETCH + p), _MM_HINT_T0);
        __m256i s32[VROWS][2];
        for (int i = 0; i < R; i++) s32[i][0] = s32[i][1] = _mm256_setzero_si256();
        for (int h = 0; h < 4; h++) {
            __m256i lo, hi;
            qx_codes(blk, h, HIGH, BYTES, &lo, &hi);
            const int half = SUB16 && h >= 2;
            for (int i = 0; i < R; i++) {
                const int8_t *xq = q8 + i * k + b * QK + 8 * h;
                int32_t a, c;
                memcpy(&a, xq, 4);
                memcpy(&c, xq + 4, 4);
                s32[i][half] = _mm256_dpbusd_epi32(s32[i][half], lo, _mm256_set1_epi32(a));
                s32[i][half] = _mm256_dpbusd_epi32(s32[i][half], hi, _mm256_set1_epi32(c));
            }
        }
        __m256 dw[2], mw = _mm256_setzero_ps();
        qx_scale_vectors(blk, hdr, HIGH, SUB16, MINS, SUPER, BYTES, dw, &mw);
        for (int i = 0; i < R; i++)
            acc[i] = qx_accumulate(acc[i], s32[i], dw, mw, dx[i * nb + b], sx[i * nb + b], qs16 + i * (k / 16) + 2 * b,
                                   off, SUB16, MINS);
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + i * n, acc[i]);
}

/* the kinds in use, each as a case of a switch on kind & 31: Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, the K types as bytes */
#define QX_KINDS(SETS) case 17: SETS(17) case 21: SETS(21) case 12: SETS(12) case 13: SETS(13) case 11: SETS(11) \
                       case 28: SETS(28) case 29: SETS(29) case 27: SETS(27)
#define QX_ARGS(r) w, nb, kind, q8 + (r) * k, dx + (r) * nb, sx + (r) * nb, qs16 + (r) * (k / 16)
#define QX_SETS(F)                                                                                               \
    for (; r + 8 <= rows; r += 8) qx_vnni_rows(QX_ARGS(r), k, yg + r * n, n, 8, F & 1, F & 2, F & 4, F & 8, F & 16);     \
    for (; r + 4 <= rows; r += 4) qx_vnni_rows(QX_ARGS(r), k, yg + r * n, n, 4, F & 1, F & 2, F & 4, F & 8, F & 16);     \
    for (; r + 2 <= rows; r += 2) qx_vnni_rows(QX_ARGS(r), k, yg + r * n, n, 2, F & 1, F & 2, F & 4, F & 8, F & 16);     \
    for (; r < rows; r++) qx_vnni_rows(QX_ARGS(r), k, yg + r * n, n, 1, F & 1, F & 2, F & 4, F & 8, F & 16);              \
    break;

__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
static void qx_group_vnni(const uint8_t *w, int64_t nb, int kind, const int8_t *q8, const float *dx, const float *sx,
                          const int32_t *qs16, int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    float *yg = y + g * GROUP_COLS;
    switch (kind & 31) {
        QX_KINDS(QX_SETS)
        default: qx_group_scalar(w, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g);
    }
}

/* 512-bit vectors: two column groups (g, g + 1; B = the second's offset) per pass, lanes 0-7 the first group's outputs,
   8-15 the second's; every lane's operations are the 256-bit kernel's, so the same bits. */
#define V512 "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw,avx512dq"
__attribute__((target(V512), always_inline))
static inline __m512i join256(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

/* Vector h (0..3) of a block of groups g and g + 1 (blk, blk2): lo, hi the codes at k = 8h + j and 8h + 4 + j (j = 0..3),
   lanes 0-7 the first group's outputs, 8-15 the second's (qx_codes on both halves). */
__attribute__((target(V512), always_inline))
static inline void qx_codes512(const uint8_t *blk, const uint8_t *blk2, int h, const int HIGH, const int BYTES,
                               const int SIGNED, __m512i *lo, __m512i *hi) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    if (BYTES) {                                       /* whole bytes */
        *lo = join256(_mm256_loadu_si256((const __m256i *)(blk + 64 * h)),
                      _mm256_loadu_si256((const __m256i *)(blk2 + 64 * h)));
        *hi = join256(_mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32)),
                      _mm256_loadu_si256((const __m256i *)(blk2 + 64 * h + 32)));
        if (SIGNED) {                                  /* int8 c as the unsigned byte c + 128 */
            *lo = _mm512_xor_si512(*lo, _mm512_set1_epi8((char)0x80));
            *hi = _mm512_xor_si512(*hi, _mm512_set1_epi8((char)0x80));
        }
        return;
    }
    __m512i packed = join256(_mm256_loadu_si256((const __m256i *)(blk + 32 * h)),
                             _mm256_loadu_si256((const __m256i *)(blk2 + 32 * h)));
    *lo = _mm512_and_si512(packed, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    if (HIGH) {         /* the high bits of the codes: bits 2b, 2b + 1 of the byte (b = 2 (h & 1) for lo, + 1 for hi)
                           moved to bits 4-5 (a 16-bit shift's bits from the next byte land outside 4-5), then
                           lo | (t & 0x30) as one ternary-logic op (0xF8: A | (B & C)) */
        const __m512i m30 = _mm512_set1_epi8(0x30);
        __m512i p = join256(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * (h >> 1))),
                            _mm256_loadu_si256((const __m256i *)(blk2 + 128 + 32 * (h >> 1))));
        const __m512i tl = (h & 1) ? p : _mm512_slli_epi16(p, 4);
        const __m512i th = (h & 1) ? _mm512_srli_epi16(p, 2) : _mm512_slli_epi16(p, 2);
        *lo = _mm512_ternarylogic_epi32(*lo, tl, m30, 0xF8);
        *hi = _mm512_ternarylogic_epi32(*hi, th, m30, 0xF8);
    }
}

/* Eight float16 of group g (at p) and eight of group g + 1 (at p + B) as 16 float32 lanes. */
__attribute__((target(V512), always_inline))
static inline __m512 qx_halves512(const uint8_t *p, int64_t B) {
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                        _mm_loadu_si128((const __m128i *)(p + B)), 1);
    return _mm512_cvtph_ps(h);
}

/* A K type's super-block header for groups g and g + 1: d and -dmin on 16 lanes. */
__attribute__((target(V512), always_inline))
static inline void qx_super512(const uint8_t *hdr, int64_t B, const int MINS, __m512 *d, __m512 *nd) {
    *d = qx_halves512(hdr, B);
    if (MINS) *nd = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(qx_halves512(hdr + 16, B)),
                                                         _mm512_set1_epi32((int)0x80000000u)));
}

/* The scales of a block of groups g and g + 1 as 16-lane vectors, lane by lane qx_scale_vectors' operations (d, nd:
   qx_super512's, K types only). */
__attribute__((target(V512), always_inline))
static inline void qx_block_scales512(const uint8_t *blk, int64_t B, __m512 d, __m512 nd, const int HIGH,
                                      const int SUB16, const int MINS, const int SUPER, const int BYTES, __m512 dw[2],
                                      __m512 *mw) {
    const int64_t subs = SUB16 ? 2 : 1, at = BYTES ? 256 : HIGH ? 192 : 128;
    if (SUPER) {
        for (int j = 0; j < subs; j++) {
            __m128i raw = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(blk + at + 8 * j)),
                                             _mm_loadl_epi64((const __m128i *)(blk + B + at + 8 * j)));
            __m512i sc = SUB16 ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw);
            dw[j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
        }
        if (MINS) {
            __m128i raw = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(blk + at + 8 * subs)),
                                             _mm_loadl_epi64((const __m128i *)(blk + B + at + 8 * subs)));
            *mw = _mm512_mul_ps(nd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(raw)));
        }
    } else {
        for (int j = 0; j < subs; j++) dw[j] = qx_halves512(blk + at + 16 * j, B);
        if (MINS) *mw = qx_halves512(blk + at + 16 * subs, B);
    }
}

/* acc += a block's contribution for one row on 16 lanes (qx_accumulate's operations, lane by lane). */
__attribute__((target(V512), always_inline))
static inline __m512 qx_accumulate512(__m512 acc, const __m512i s32[2], const __m512 dw[2], __m512 mw, float dx,
                                      float sx, const int32_t *qs, int64_t off, const int SUB16, const int MINS) {
    const __m512 dxv = _mm512_set1_ps(dx);
    if (SUB16) {
        for (int j = 0; j < 2; j++) {
            __m512i is = MINS ? s32[j] : _mm512_sub_epi32(s32[j], _mm512_set1_epi32((int)off * qs[j]));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(dw[j], dxv), _mm512_cvtepi32_ps(is)));
        }
    } else {
        __m512i is = MINS ? s32[0] : _mm512_sub_epi32(s32[0], _mm512_set1_epi32((int)off * (qs[0] + qs[1])));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(dw[0], dxv), _mm512_cvtepi32_ps(is)));
    }
    if (MINS) acc = _mm512_add_ps(acc, _mm512_mul_ps(mw, _mm512_set1_ps(sx)));
    return acc;
}

/* Integer sums started at QX_MAGIC (the bits of 1.5 * 2^23) hold, as float32, 1.5 * 2^23 + the sum exactly while
   |sum| < 2^22 (a block's: under 2^17); less 1.5 * 2^23 that is float(sum) exactly: cvtepi32_ps's result, off the
   port the dot products need. */
#define QX_MAGIC 0x4B400000
__attribute__((target(V512), always_inline))
static inline __m512 qx_magic_ps(__m512i s) {
    return _mm512_sub_ps(_mm512_castsi512_ps(s), _mm512_set1_ps(12582912.0f));
}

/* Rows r .. r + R - 1 of groups g and g + 1. Per block: the scales, then each sub-block's integer sums for every row
   (started at QX_MAGIC - off * qs: the offset folded in, exact) and at once its float step, sub-blocks in order, then the mins:
   qx_accumulate512's operations in its order, lane by lane. */
__attribute__((target(V512), always_inline))
static inline void qx_vnni512_rows(const uint8_t *w, int64_t B, int64_t nb, int kind, const int8_t *q8, const float *dx,
                                   const float *sx, const int32_t *qs16, int64_t k, float *y, int64_t n, const int R,
                                   const int HIGH, const int SUB16, const int MINS, const int SUPER, const int BYTES,
                                   const int SIGNED) {
    const int flags = HIGH | SUB16 | MINS | SUPER | BYTES;       /* the flag bits themselves: sizes fold to constants */
    const int64_t off = kind >> 8, BB = qx_block_bytes(flags), HB = qx_header_bytes(flags);
    const int subs = SUB16 ? 2 : 1;
    __m512 acc[VROWS], d = _mm512_setzero_ps(), nd = _mm512_setzero_ps();
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    const uint8_t *blk = w + HB;
    for (int64_t b = 0; b < nb; b++, blk += BB) {
        if (SUPER && b % SUPER_BLOCKS == 0) {
            if (b) blk += HB;
            qx_super512(blk - HB, B, MINS, &d, &nd);
        }
        const uint8_t *blk2 = blk + B;
        for (int64_t p = 0; p < BB; p += 64) {
            _mm_prefetch((const char *)(blk + PREFETCH + p), _MM_HINT_T0);
            _mm_prefetch((const char *)(blk2 + PREFETCH + p), _MM_HINT_T0);
        }
        __m512 dw[2], mw = _mm512_setzero_ps();
        qx_block_scales512(blk, B, d, nd, HIGH, SUB16, MINS, SUPER, BYTES, dw, &mw);
        for (int j = 0; j < subs; j++) {
            __m512i s32[VROWS];
            for (int i = 0; i < R; i++) {
                const int32_t *qs = qs16 + i * (k / 16) + 2 * b;
                s32[i] = _mm512_set1_epi32((MINS || !off) ? QX_MAGIC
                                                          : QX_MAGIC - (int)off * (SUB16 ? qs[j] : qs[0] + qs[1]));
            }
            for (int h = 2 * j; h < (SUB16 ? 2 * j + 2 : 4); h++) {
                __m512i lo, hi;
                qx_codes512(blk, blk2, h, HIGH, BYTES, SIGNED, &lo, &hi);
                for (int i = 0; i < R; i++) {
                    const int8_t *xq = q8 + i * k + b * QK + 8 * h;
                    int32_t a, c;
                    memcpy(&a, xq, 4);
                    memcpy(&c, xq + 4, 4);
                    s32[i] = _mm512_dpbusd_epi32(s32[i], lo, _mm512_set1_epi32(a));
                    s32[i] = _mm512_dpbusd_epi32(s32[i], hi, _mm512_set1_epi32(c));
                }
            }
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(_mm512_mul_ps(dw[j], _mm512_set1_ps(dx[i * nb + b])),
                                                             qx_magic_ps(s32[i])));
        }
        if (MINS)
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(mw, _mm512_set1_ps(sx[i * nb + b])));
    }
    for (int i = 0; i < R; i++) {
        _mm256_storeu_ps(y + i * n, _mm512_castps512_ps256(acc[i]));
        _mm256_storeu_ps(y + i * n + GROUP_COLS, _mm512_extractf32x8_ps(acc[i], 1));
    }
}

#define QX_ARGS512(r) nb, kind, q8 + (r) * k, dx + (r) * nb, sx + (r) * nb, qs16 + (r) * (k / 16)
#define QX_CALL512(F, RR) \
    qx_vnni512_rows(w, B, QX_ARGS512(r), k, yg + r * n, n, RR, F & 1, F & 2, F & 4, F & 8, F & 16, F & 32)
/* rows in passes of 8, then one pass for the rest (each pass unpacks the codes once) */
#define QX_SETS512(F)                                                                                            \
    for (; r + 8 <= rows; r += 8) QX_CALL512(F, 8);                                                              \
    switch (rows - r) {                                                                                          \
        case 7: QX_CALL512(F, 7); break;                                                                         \
        case 6: QX_CALL512(F, 6); break;                                                                         \
        case 5: QX_CALL512(F, 5); break;                                                                         \
        case 4: QX_CALL512(F, 4); break;                                                                         \
        case 3: QX_CALL512(F, 3); break;                                                                         \
        case 2: QX_CALL512(F, 2); break;                                                                         \
        case 1: QX_CALL512(F, 1); break;                                                                         \
    }                                                                                                            \
    return 1;

/* Groups g and g + 1 (B bytes apart) on 512-bit vectors; 0 for a kind without a kernel here (the caller runs them
   one by one). */
__attribute__((target(V512)))
static int qx_pair_vnni512(const uint8_t *w, int64_t B, int64_t nb, int kind, const int8_t *q8, const float *dx,
                           const float *sx, const int32_t *qs16, int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    int64_t r = 0;
    float *yg = y + g * GROUP_COLS;
    switch (kind & 63) {          /* also q4q8.c's layouts: Q4_0 / Q4_1 (4: mins, nibbles), Q8_0 (48) */
        case 4: QX_SETS512(4)
        case 48: QX_SETS512(48)
        QX_KINDS(QX_SETS512)
        default: return 0;
    }
}

#include "qx_amx.c"                 /* path 5: the pair kernel's integer sums on AMX tiles */

#include "qx_avx2.c"                /* path 2: AVX2 without VNNI */
#endif

/* Activations already quantised (q8, dx, sx from q4q8_quantize; qs16 from qx_sums). Returns the path used. */
int qx_matmul_quantized(const uint8_t *w, int kind, const int8_t *q8, const float *dx, const float *sx,
                        const int32_t *qs16, int64_t rows, int64_t n, int64_t k, float *y, int path) {
    int64_t nb = k / QK, groups = n / GROUP_COLS, gb = qx_group_bytes(kind, nb);
    int use = choose(path);
    if (use < 0) return use;
#ifdef __x86_64__
    if (use == 5 && rows >= amx_rows) {   /* pairs of groups through the tile unit, a last odd group on 256-bit ones */
#pragma omp parallel
        {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < groups; g += 2) {
                if (g + 1 < groups && qx_pair_amx(w + g * gb, gb, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g)) continue;
                for (int64_t h = g; h < g + 2 && h < groups; h++)
                    qx_group_vnni(w + h * gb, nb, kind, q8, dx, sx, qs16, rows, k, y, n, h);
            }
            amx_release();
        }
        return use;
    }
    if (use >= 4) {                    /* pairs of groups on 512-bit vectors, a last odd group on 256-bit ones */
#pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < groups; g += 2) {
            if (g + 1 < groups && qx_pair_vnni512(w + g * gb, gb, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g)) continue;
            for (int64_t h = g; h < g + 2 && h < groups; h++)
                qx_group_vnni(w + h * gb, nb, kind, q8, dx, sx, qs16, rows, k, y, n, h);
        }
        return use;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + g * gb;
#ifdef __x86_64__
        if (use == 3) { qx_group_vnni(wg, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g); continue; }
        if (use == 2) { qx_group_avx2(wg, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g); continue; }
#endif
        qx_group_scalar(wg, nb, kind, q8, dx, sx, qs16, rows, k, y, n, g);
    }
    return use;
}

/* x float32 [rows, K] -> y [rows, N]. Returns the path used, -1 if out of memory. */
int qx_matmul(const uint8_t *w, int kind, const float *x, int64_t rows, int64_t n, int64_t k, float *y, int path) {
    int8_t *q8 = malloc((size_t)(rows * k));
    float *dx = malloc(sizeof(float) * (size_t)(rows * (k / QK))), *sx = malloc(sizeof(float) * (size_t)(rows * (k / QK)));
    int32_t *qs = malloc(sizeof(int32_t) * (size_t)(rows * (k / 16)));
    int used = -1;
    if (q8 && dx && sx && qs) {
        q4q8_quantize(x, rows, k, q8, dx, sx);
        qx_sums(q8, rows, k, qs);
        used = qx_matmul_quantized(w, kind, q8, dx, sx, qs, rows, n, k, y, path);
    }
    free(q8); free(dx); free(sx); free(qs);
    return used;
}

/* ---- F16 / BF16 weights (an f16 GGUF's matrices as the file holds them) x float32 activations ------------------
   y[r, n] = sum_k w[n, k] x[r, k], per output k = 0, 1, ... in order: acc = acc + float(w) * x (two roundings, no
   fused multiply-add), whatever the number of rows: batch-invariant like the quantised kernels. Layout
   (`f16_pack`): column groups of 16 outputs, k-major: per group, for each k, the 16 outputs' 16-bit weights. */
#define F16_COLS 16

void f16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *out) {
    for (int64_t g = 0; g < n / F16_COLS; g++)
        for (int64_t j = 0; j < k; j++)
            for (int c = 0; c < F16_COLS; c++) out[(g * k + j) * F16_COLS + c] = w[(g * F16_COLS + c) * k + j];
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void f16_group_scalar(const uint16_t *w, int bf16, const float *x, int64_t rows, int64_t k, float *y, int64_t n,
                             int64_t g) {
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < F16_COLS; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                uint16_t h = w[j * F16_COLS + c];
                float p = (bf16 ? bf16_to_float(h) : half_to_float(h)) * x[r * k + j];
                acc = acc + p;
            }
            y[r * n + g * F16_COLS + c] = acc;
        }
}

#ifdef __x86_64__
/* 16 outputs in one 512-bit vector, G groups (independent sums: the adds' latency overlaps) and R rows a pass, the
   weights converted once per k for all rows. */
__attribute__((target(V512), always_inline))
static inline void f16_rows512(const uint16_t *w, int64_t gstride, const int bf16, const float *x, int64_t k, float *y,
                               int64_t n, const int R, const int G) {
    __m512 acc[4][VROWS];
    for (int q = 0; q < G; q++)
        for (int i = 0; i < R; i++) acc[q][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j++) {
        for (int q = 0; q < G; q++) {
            const uint16_t *wq = w + q * gstride + j * F16_COLS;
            if ((j & 1) == 0) _mm_prefetch((const char *)(wq + 128 * F16_COLS), _MM_HINT_T0);
            __m256i h = _mm256_loadu_si256((const __m256i *)wq);
            __m512 wv = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
            for (int i = 0; i < R; i++) acc[q][i] = _mm512_add_ps(acc[q][i], _mm512_mul_ps(wv, _mm512_set1_ps(x[i * k + j])));
        }
    }
    for (int q = 0; q < G; q++)
        for (int i = 0; i < R; i++) _mm512_storeu_ps(y + i * n + q * F16_COLS, acc[q][i]);
}

/* groups g .. g + G - 1 */
__attribute__((target(V512)))
static void f16_groups512(const uint16_t *w, int bf16, const float *x, int64_t rows, int64_t k, float *y, int64_t n,
                          int64_t g, int G) {
    int64_t r = 0, gs = k * F16_COLS;
    float *yg = y + g * F16_COLS;
    if (G == 4) {
        for (; r + 4 <= rows; r += 4) f16_rows512(w, gs, bf16, x + r * k, k, yg + r * n, n, 4, 4);
        for (; r + 2 <= rows; r += 2) f16_rows512(w, gs, bf16, x + r * k, k, yg + r * n, n, 2, 4);
        for (; r < rows; r++) f16_rows512(w, gs, bf16, x + r * k, k, yg + r * n, n, 1, 4);
        return;
    }
    for (int q = 0; q < G; q++) {
        for (r = 0; r + 8 <= rows; r += 8) f16_rows512(w + q * gs, gs, bf16, x + r * k, k, yg + q * F16_COLS + r * n, n, 8, 1);
        for (; r + 4 <= rows; r += 4) f16_rows512(w + q * gs, gs, bf16, x + r * k, k, yg + q * F16_COLS + r * n, n, 4, 1);
        for (; r < rows; r++) f16_rows512(w + q * gs, gs, bf16, x + r * k, k, yg + q * F16_COLS + r * n, n, 1, 1);
    }
}

/* AVX2: the same, the 16 outputs as two 256-bit halves, up to ROWS rows a pass. */
__attribute__((target("avx2,fma,f16c")))
static void f16_group_avx2(const uint16_t *w, int bf16, const float *x, int64_t rows, int64_t k, float *y, int64_t n,
                           int64_t g) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        __m256 lo[ROWS], hi[ROWS];
        for (int i = 0; i < ROWS; i++) lo[i] = hi[i] = _mm256_setzero_ps();
        for (int64_t j = 0; j < k; j++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(w + j * F16_COLS));
            __m128i b = _mm_loadu_si128((const __m128i *)(w + j * F16_COLS + 8));
            __m256 wa, wb;
            if (bf16) {
                wa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16));
                wb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
            } else {
                wa = _mm256_cvtph_ps(a);
                wb = _mm256_cvtph_ps(b);
            }
            for (int i = 0; i < nr; i++) {
                __m256 xv = _mm256_set1_ps(x[(r0 + i) * k + j]);
                lo[i] = _mm256_add_ps(lo[i], _mm256_mul_ps(wa, xv));
                hi[i] = _mm256_add_ps(hi[i], _mm256_mul_ps(wb, xv));
            }
        }
        for (int i = 0; i < nr; i++) {
            _mm256_storeu_ps(y + (r0 + i) * n + g * F16_COLS, lo[i]);
            _mm256_storeu_ps(y + (r0 + i) * n + g * F16_COLS + 8, hi[i]);
        }
    }
}
#endif

/* x float32 [rows, K] -> y [rows, N]; N a multiple of 16. Returns the path used (the same bits on every path). */
int f16_matmul(const uint16_t *w, int bf16, const float *x, int64_t rows, int64_t n, int64_t k, float *y, int path) {
    int use = choose(path);
    if (use < 0) return use;
#ifdef __x86_64__
    if (use >= 4) {                    /* four groups a pass (a last partial set one by one) */
        const int64_t groups = n / F16_COLS;
#pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < groups; g += 4)
            f16_groups512(w + g * k * F16_COLS, bf16, x, rows, k, y, n, g, groups - g >= 4 ? 4 : (int)(groups - g));
        return use;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n / F16_COLS; g++) {
        const uint16_t *wg = w + g * k * F16_COLS;
#ifdef __x86_64__
        if (use >= 2) { f16_group_avx2(wg, bf16, x, rows, k, y, n, g); continue; }
#endif
        f16_group_scalar(wg, bf16, x, rows, k, y, n, g);
    }
    return use;
}
