/* AMX (Intel's tile unit) for the multi-row products of the GGUF K types and Q5_0 / Q5_1: path 5.

The integer sums of a block (isum_j of qx.c's header, before the offset) for up to 16 rows and a pair of column groups
come from one tile product, C[r, c] += sum_k A[r, k] B[k, c] (TDPBSUD: A signed, B unsigned), instead of R x 8
vpdpbusd: A is the rows' Q8 codes of the block, read in place (a tile row per activation row, stride K); B the
block's codes, unpacked as the pair path unpacks them: vector h's lo (k = 8h + j) and hi (k = 8h + 4 + j) halves are
B's rows 2h and 2h + 1 in the tile unit's 4-byte layout (byte 4c + j of a row: output c, k = 4 row + j), which is
how qx_pack lays them out. The sums are exact integers, then every lane takes the pair path's float steps
(qx_accumulate512) in the same order: the same bits as every other path, for any number of rows.

The tile unit needs the kernel's leave (arch_prctl ARCH_REQ_XCOMP_PERM) and a CPU that runs it; since llama.cpp's
AMX code faults on some CPUs and shapes, Python enables this path (kernels_amx_allow, q4q8.c) only after a self-test
in a child process matched the pair path bit for bit and timed both (switchsd/kernels/build.py, amx_rows): calls with
fewer rows than where the tiles won there stay on the pair path. Each block's sums leave the tiles through a store
(tilestored) with a fixed cost: a tile product pays off only when it replaces several rows' vpdpbusd. */
#ifdef __x86_64__
#define AMX_ROWS 16
#define AMX "amx-tile,amx-int8"

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Tiles: A = 0 and 1 (R rows x 32 bytes, or 16 with sub-blocks of 16), B = 2 and 3 (8 rows x 64 bytes, or 4),
   C = 4 to 7 (R rows of 16 int32). Consecutive blocks alternate between A 0, B 2 and A 1, B 3, and their sums go
   round C 4, 5, 6, 7 (with sub-blocks of 16: C 4 and 6, then 5 and 7), so several blocks' products are in flight
   while earlier ones' sums are stored and scaled. */
__attribute__((target(AMX)))
static void amx_configure(int R, const int SUB16) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int s = 0; s < 2; s++) {
        cfg.rows[s] = (uint8_t)R, cfg.colsb[s] = SUB16 ? 16 : 32;
        cfg.rows[2 + s] = SUB16 ? 4 : 8, cfg.colsb[2 + s] = 64;
        cfg.rows[4 + s] = cfg.rows[6 + s] = (uint8_t)R, cfg.colsb[4 + s] = cfg.colsb[6 + s] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Block b's sums as tile products: A tile S, B tile TB (from bt), C tiles C0, C1 (a set of the tiles above). */
#define AMX_PRODUCTS(S, TB, C0, C1)                                                                                    \
    do {                                                                                                               \
        _tile_zero(C0);                                                                                                \
        if (SUB16) {                                                                                                   \
            _tile_zero(C1);                                                                                            \
            _tile_loadd(S, a, k);                                                                                      \
            _tile_loadd(TB, bt, 64);                                                                                   \
            _tile_dpbsud(C0, S, TB);                                                                                   \
            _tile_loadd(S, a + 16, k);                                                                                 \
            _tile_loadd(TB, bt + 256, 64);                                                                             \
            _tile_dpbsud(C1, S, TB);                                                                                   \
        } else {                                                                                                       \
            _tile_loadd(S, a, k);                                                                                      \
            _tile_loadd(TB, bt, 64);                                                                                   \
            _tile_dpbsud(C0, S, TB);                                                                                   \
        }                                                                                                              \
    } while (0)
#define AMX_STORE(C0, C1, CT)                                                                                          \
    do {                                                                                                               \
        _tile_stored(C0, CT[0], 64);                                                                                   \
        if (SUB16) _tile_stored(C1, CT[1], 64);                                                                        \
    } while (0)

/* Groups g and g + 1 (B bytes apart), rows r0 .. r0 + R - 1 (R <= 16, tiles configured for R). */
__attribute__((target(V512 "," AMX), always_inline))
static inline void qx_amx_rows(const uint8_t *w, int64_t B, int64_t nb, int kind, const int8_t *q8, const float *dx,
                               const float *sx, const int32_t *qs16, int64_t k, float *y, int64_t n, int R,
                               const int HIGH, const int SUB16, const int MINS, const int SUPER, const int BYTES) {
    const int64_t off = kind >> 8;
    __attribute__((aligned(64))) uint8_t bts[2][8 * 64];          /* B: a block's codes, 8 rows of 64 bytes */
    __attribute__((aligned(64))) int32_t cts[2][2][AMX_ROWS * 16]; /* C: the sums, [sub-block][row, output], twice */
    __m512 acc[AMX_ROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    const int64_t D = SUB16 ? 2 : 4;                                /* blocks in flight */
    for (int64_t b = 0; b < nb + D; b++) {
        if (b < nb) {                                              /* block b's products */
            const uint8_t *blk = w + qx_block_at(kind, b), *blk2 = blk + B;
            for (int64_t p = 0; p < 320; p += 64) {
                _mm_prefetch((const char *)(blk + PREFETCH + p), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk2 + PREFETCH + p), _MM_HINT_T0);
            }
            uint8_t *bt = bts[b & 1];
            for (int h = 0; h < 4; h++) {
                __m512i lo, hi;
                qx_codes512(blk, blk2, h, HIGH, BYTES, 0, &lo, &hi);
                _mm512_store_si512((__m512i *)(bt + 128 * h), lo);
                _mm512_store_si512((__m512i *)(bt + 128 * h + 64), hi);
            }
            const int8_t *a = q8 + b * QK;
            if (SUB16) {
                if (b & 1) AMX_PRODUCTS(1, 3, 5, 7); else AMX_PRODUCTS(0, 2, 4, 6);
            } else switch (b & 3) {
                case 0: AMX_PRODUCTS(0, 2, 4, 4); break;
                case 1: AMX_PRODUCTS(1, 3, 5, 5); break;
                case 2: AMX_PRODUCTS(0, 2, 6, 6); break;
                default: AMX_PRODUCTS(1, 3, 7, 7);
            }
        }
        int64_t c = b - (D - 1);                                   /* block c's sums out of the tiles */
        if (c >= 0 && c < nb) {
            int32_t (*ct)[AMX_ROWS * 16] = cts[c & 1];
            if (SUB16) {
                if (c & 1) AMX_STORE(5, 7, ct); else AMX_STORE(4, 6, ct);
            } else switch (c & 3) {
                case 0: AMX_STORE(4, 4, ct); break;
                case 1: AMX_STORE(5, 5, ct); break;
                case 2: AMX_STORE(6, 6, ct); break;
                default: AMX_STORE(7, 7, ct);
            }
        }
        if (c < 1) continue;
        c = c - 1;                                                 /* and block c - 1's, stored a block ago, scaled */
        int32_t (*ct)[AMX_ROWS * 16] = cts[c & 1];
        const uint8_t *blk = w + qx_block_at(kind, c);
        __m512 dw[2], mw = _mm512_setzero_ps(), d = mw, nd = mw;
        if (SUPER) qx_super512(w + qx_block_at(kind, c - c % SUPER_BLOCKS) - qx_header_bytes(kind), B, MINS, &d, &nd);
        qx_block_scales512(blk, B, d, nd, HIGH, SUB16, MINS, SUPER, BYTES, dw, &mw);
        for (int i = 0; i < R; i++) {
            __m512i s32[2] = {_mm512_load_si512((const __m512i *)(ct[0] + 16 * i)),
                              _mm512_load_si512((const __m512i *)(ct[1] + 16 * i))};
            acc[i] = qx_accumulate512(acc[i], s32, dw, mw, dx[i * nb + c], sx[i * nb + c],
                                      qs16 + i * (k / 16) + 2 * c, off, SUB16, MINS);
        }
    }
    for (int i = 0; i < R; i++) {
        _mm256_storeu_ps(y + i * n, _mm512_castps512_ps256(acc[i]));
        _mm256_storeu_ps(y + i * n + GROUP_COLS, _mm512_extractf32x8_ps(acc[i], 1));
    }
}

#define QX_AMX(F)                                                                                                      \
    for (int64_t r = 0; r < rows; r += AMX_ROWS) {                                                                     \
        int R = rows - r < AMX_ROWS ? (int)(rows - r) : AMX_ROWS;                                                      \
        amx_configure(R, F & 2);                                                                                       \
        qx_amx_rows(w, B, nb, kind, q8 + r * k, dx + r * nb, sx + r * nb, qs16 + r * (k / 16), k,                      \
                    y + g * GROUP_COLS + r * n, n, R, F & 1, F & 2, F & 4, F & 8, F & 16);                             \
    }                                                                                                                  \
    return 1;

/* Groups g and g + 1 through the tile unit; 0 for a kind without a kernel here. */
__attribute__((target(V512 "," AMX)))
static int qx_pair_amx(const uint8_t *w, int64_t B, int64_t nb, int kind, const int8_t *q8, const float *dx,
                       const float *sx, const int32_t *qs16, int64_t rows, int64_t k, float *y, int64_t n, int64_t g) {
    switch (kind & 31) {
        case 17: QX_AMX(17)
        case 21: QX_AMX(21)
        case 12: QX_AMX(12)
        case 13: QX_AMX(13)
        case 11: QX_AMX(11)
        case 28: QX_AMX(28)
        case 29: QX_AMX(29)
        case 27: QX_AMX(27)
        default: return 0;
    }
}

__attribute__((target(AMX)))
static void amx_release(void) { _tile_release(); }
#endif
