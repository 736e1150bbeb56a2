/* A Llama decoder stack in the q4q8 format, one call per forward: every row computed alone (batch-invariant).

Per layer, per row (x the residual stream, float32):
  h = rms(x) * norm1        rms: r = 1 / sqrtf(sum(x_i^2) / d + eps), h_i = norm1_i * (x_i * r), sums in order
  q|k|v = q4q8(h)           (q4q8.c); q and k rotated: y_i = x_i cos_i + x_{i+-hd/2} sin_i (sin signed, per row)
  k, v -> the cache at the row's position
  attention, per head, over the keys the row sees (ascending positions): s_j = (q . k_j) * scale (the dot
      product as 8 lane sums of fused multiply-adds and a fixed tree, `dot8`);
      m = max s; p_j = exp(s_j - m); o = (sum_j p_j v_j) / (sum_j p_j), sums in order, p_j v_j fused into its sum
      (exp: `exp_poly`)
  x = x + q4q8(o)           [capture "attn"]
  g|u = q4q8(rms(x) * norm2); x = x + q4q8(g / (1 + exp(-g)) * u)     [capture "mlp"]
A row's result depends only on its own inputs and the keys it sees, never on how many rows share the call, so a
verify forward's rows equal, bit for bit, the one-row steps vanilla decoding makes. Threads split each product's
output columns and the attention's heads; every sum runs on one thread in a fixed order.
*/
#include "qx.c"
#include <omp.h>
#include <time.h>

/* Where a forward's time goes: seconds per phase, summed over calls until `llama_profile` reads and clears them. */
enum { P_NORM, P_QKV, P_ROPE, P_ATTN, P_O, P_MLP_IN, P_SWIGLU, P_DOWN, P_HEAD, P_N };
static double prof[P_N];

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void llama_profile(double *out) {
    for (int i = 0; i < P_N; i++) { out[i] = prof[i]; prof[i] = 0.0; }
}

typedef struct {
    int64_t d, heads, kv_heads, head_dim, inter;
    float eps, scale;
    int path;                       /* q4q8 path: 0 best, 1 portable */
} Dims;

/* A matrix as one or more parts of one block type each, outputs stacked (q|k|v of a Q4_K_M file: Q4_K, Q4_K, Q6_K),
   each part with an optional bias (Qwen2's q|k|v). kind: KIND_Q4Q8 (q4q8.c), KIND_Q8 (Q8_0), else a qx.c kind. */
#define KIND_Q4Q8 (-1)
#define KIND_Q8 (-2)
#define KIND_F16 (-3)
#define KIND_BF16 (-4)
#define MAX_PARTS 3
typedef struct {
    const uint8_t *w[MAX_PARTS];
    const float *bias[MAX_PARTS];
    int64_t n[MAX_PARTS];
    int32_t kind[MAX_PARTS];
    int32_t parts;
} Mat;

typedef struct {                    /* scratch for one forward of T rows */
    int8_t *q8;
    float *dx, *sx, *h, *qkv, *att, *gu, *act, *tmp, *part;
    int32_t *qs;
} Work;

/* Scratch for T rows: activation blocks up to kmax wide, h (hw floats a row), q|k|v (nq), attention (na), gate|up
   and their product (I), and a d-wide residual update. Returns 0 when out of memory (free it all the same). */
static int work_alloc(Work *wk, int64_t T, int64_t kmax, int64_t hw, int64_t nq, int64_t na, int64_t I, int64_t d) {
    wk->q8 = malloc((size_t)(T * kmax));
    wk->dx = malloc(sizeof(float) * (size_t)(T * kmax / 32));
    wk->sx = malloc(sizeof(float) * (size_t)(T * kmax / 32));
    wk->h = malloc(sizeof(float) * (size_t)(T * hw));
    wk->qkv = malloc(sizeof(float) * (size_t)(T * nq));
    wk->att = malloc(sizeof(float) * (size_t)(T * na));
    wk->gu = malloc(sizeof(float) * (size_t)(T * 2 * I));
    wk->act = malloc(sizeof(float) * (size_t)(T * I));
    wk->tmp = malloc(sizeof(float) * (size_t)(T * d));
    int64_t widest = nq > 2 * I ? nq : 2 * I;
    widest = widest > d ? widest : d;
    wk->part = malloc(sizeof(float) * (size_t)(T * widest));
    wk->qs = malloc(sizeof(int32_t) * (size_t)(T * kmax / 16));
    return wk->q8 && wk->dx && wk->sx && wk->h && wk->qkv && wk->att && wk->gu && wk->act && wk->tmp && wk->part && wk->qs;
}

static void work_free(Work *wk) {
    free(wk->q8); free(wk->dx); free(wk->sx); free(wk->h); free(wk->qkv); free(wk->att); free(wk->gu); free(wk->act);
    free(wk->tmp); free(wk->part); free(wk->qs);
}

#include "rowwise.c"           /* rms, rotate, exp_poly, swiglu: one row (or head) at a time */

/* q4q8.c's Q4 and Q8_0 layouts are qx.c's kinds QX_MINS and QX_Q8 with the same arithmetic: on 512-bit vectors they
   run through qx.c's pair kernel (an even number of column groups), Q4 on AVX2 through qx.c's AVX2 kernel. */
static int wide512(int64_t n, int path) {
    return (n / GROUP_COLS) % 2 == 0 && (path == 0 || path >= 4) && have_vnni512();
}
/* the qx.c path a part of q4q8.c's layouts runs on, 0 for its own kernel */
static int via_qx(const Mat *m, int p, int path) {
    if ((m->kind[p] == KIND_Q4Q8 || m->kind[p] == KIND_Q8) && wide512(m->n[p], path)) return 4;
    return m->kind[p] == KIND_Q4Q8 && choose(path) == 2 ? 2 : 0;
}

/* The attention and SwiGLU path for a product path: 3 = 512-bit attention (path 0 or a 512-bit product path, where
   the CPU has it), 2 = AVX2, 1 = portable. */
static int vector_path(int path) {
    return path == 1 ? 1 : ((path == 0 || path >= 4) && have_vnni512()) ? 3 : have_avx2() ? 2 : 1;
}

static void part_product(const Mat *m, int p, const float *x, int64_t rows, int64_t k, float *y, Work *wk, int path) {
    const int qxp = via_qx(m, p, path);
    if (qxp)
        qx_matmul_quantized(m->w[p], m->kind[p] == KIND_Q8 ? QX_Q8 : QX_MINS, wk->q8, wk->dx, wk->sx, wk->qs, rows,
                            m->n[p], k, y, qxp);
    else if (m->kind[p] <= KIND_F16) f16_matmul((const uint16_t *)m->w[p], m->kind[p] == KIND_BF16, x, rows, m->n[p], k, y, path);
    else if (m->kind[p] == KIND_Q4Q8) q4q8_matmul_quantized(m->w[p], wk->q8, wk->dx, wk->sx, rows, m->n[p], k, y, path);
    else if (m->kind[p] == KIND_Q8) q8_matmul_quantized(m->w[p], wk->q8, wk->dx, rows, m->n[p], k, y, path);
    else qx_matmul_quantized(m->w[p], m->kind[p], wk->q8, wk->dx, wk->sx, wk->qs, rows, m->n[p], k, y, path);
}

/* y [rows, sum of the parts' n] = x [rows, k] times the matrix: activations quantised once, each part's outputs in
   its columns (a lone part straight into y), its bias added after. */
static void product(const Mat *m, const float *x, int64_t rows, int64_t k, float *y, Work *wk, int path) {
    int quantised = 0, sums = 0;
    for (int p = 0; p < m->parts; p++) {
        quantised |= m->kind[p] > KIND_F16;
        sums |= m->kind[p] >= 0 || (m->kind[p] == KIND_Q8 && via_qx(m, p, path));   /* Q4 (QX_MINS) reads none */
    }
    if (quantised) q4q8_quantize(x, rows, k, wk->q8, wk->dx, wk->sx);
    if (sums) qx_sums(wk->q8, rows, k, wk->qs);
    int64_t n = 0;
    for (int p = 0; p < m->parts; p++) n += m->n[p];
    for (int p = 0, at = 0; p < m->parts; at += (int)m->n[p], p++) {
        const int64_t np = m->n[p];
        if (m->parts == 1) part_product(m, p, x, rows, k, y, wk, path);
        else {
            part_product(m, p, x, rows, k, wk->part, wk, path);
            for (int64_t r = 0; r < rows; r++) memcpy(y + r * n + at, wk->part + r * np, sizeof(float) * (size_t)np);
        }
        if (m->bias[p])
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < np; i++) y[r * n + at + i] = y[r * n + at + i] + m->bias[p][i];
    }
}

/* q . k over hd (a multiple of 8) as 8 lane sums of fused multiply-adds (fmaf: one rounding each, as the vector
   paths' fmadd), then a fixed tree: the same order on every path. */
static inline float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* One row's attention for one head over `n` keys at cache positions `pos`. kc, vc: [cap, hd] of its kv head. */
static void attend_portable(const float *q, const float *kc, const float *vc, const int32_t *pos, int64_t n, int64_t hd,
                   float scale, float *scores, float *out) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float s = dot8(q, kc + (int64_t)pos[j] * hd, hd) * scale;
        scores[j] = s;
        m = s > m ? s : m;
    }
    for (int64_t j = 0; j < n; j++) scores[j] = exp_poly(scores[j] - m);
    float sum = 0.0f;
    for (int64_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float p = scores[j];
        sum = sum + p;
        const float *v = vc + (int64_t)pos[j] * hd;
        for (int64_t i = 0; i < hd; i++) out[i] = fmaf(p, v[i], out[i]);
    }
    for (int64_t i = 0; i < hd; i++) out[i] = out[i] / sum;
}

#ifdef __x86_64__
#include "attend_x86.c"          /* attend_avx2, attend_group_512 */
#endif

static void attend(const float *q, const float *kc, const float *vc, const int32_t *pos, int64_t n, int64_t hd,
                   float scale, float *scores, float *out, int path) {
#ifdef __x86_64__
    if (path == 2) { attend_avx2(q, kc, vc, pos, n, hd, scale, scores, out); return; }
#endif
    attend_portable(q, kc, vc, pos, n, hd, scale, scores, out);
}

/* How a forward's queries go to the threads on 512-bit vectors (the same for every layer): groups of (kv head, run
   of rows in one slot, a share of those rows' heads), at most GROUP to a group and at least two groups a thread;
   query i is row qt[i]'s head qh[i], group u holds queries ustart[u] .. ustart[u + 1] - 1. Elsewhere (vec != 3) no
   groups: one query at a time. */
typedef struct {
    int32_t *qt, *qh, *ustart;
    int64_t nu;
} AttendPlan;

static void attend_plan_free(AttendPlan *p) { free(p->qt); free(p->qh); free(p->ustart); }

/* Returns 0, or -1 when out of memory. */
static int attend_plan(const Dims *dm, int64_t T, const int32_t *slot, int vec, AttendPlan *p) {
    memset(p, 0, sizeof *p);
    if (vec != 3) return 0;
    const int64_t H = dm->heads, KV = dm->kv_heads, G = H / KV;
    p->qt = malloc(sizeof(int32_t) * (size_t)(T * H));
    p->qh = malloc(sizeof(int32_t) * (size_t)(T * H));
    p->ustart = malloc(sizeof(int32_t) * (size_t)(T * H + 1));
    if (!p->qt || !p->qh || !p->ustart) { attend_plan_free(p); return -1; }
    int64_t runs = 0;
    for (int64_t t = 0; t < T; t++) runs += t == 0 || (slot && slot[t] != slot[t - 1]);
    const int64_t want = 2 * (int64_t)omp_get_max_threads();
    int64_t nqr = 0;
    for (int64_t g = 0; g < KV; g++)
        for (int64_t t = 0; t < T;) {
            int64_t t1 = t + 1;
            while (t1 < T && slot && slot[t1] == slot[t]) t1++;
            const int64_t Q = (t1 - t) * G;
            int64_t parts = (Q + GROUP - 1) / GROUP;
            while (parts < Q && KV * runs * parts < want) parts++;
            for (int64_t r = t; r < t1; r++)
                for (int64_t h = g * G; h < (g + 1) * G; h++) { p->qt[nqr] = (int32_t)r; p->qh[nqr] = (int32_t)h; nqr++; }
            for (int64_t q = 0; q < parts; q++) p->ustart[p->nu++] = (int32_t)(nqr - Q + q * Q / parts);
            t = t1;
        }
    p->ustart[p->nu] = (int32_t)nqr;
    return 0;
}

/* Every row's every head: row t's head h reads its query at qkv + t nq + h hd and the keys keys[key_off[t] ..
   key_off[t + 1]) of its slot (slot NULL: every row in slot 0) in K, V ([slots, KV, cap, hd] of one layer), and
   writes att + (t H + h) hd; scores: `stride` floats per (t, h). On 512-bit vectors a kv head's queries from one
   sequence go in the plan's groups (attend_group_512; a row's heads together, rows in order); elsewhere one query
   at a time. Either way each query's bits are attend's. */
static void attend_all(const Dims *dm, const AttendPlan *plan, const float *qkv, int64_t nq, int64_t T, const float *K,
                       const float *V, int64_t cap, const int32_t *slot, const int32_t *key_off, const int32_t *keys,
                       float *scores, int64_t stride, float *att, int vec) {
    const int64_t H = dm->heads, KV = dm->kv_heads, hd = dm->head_dim, G = H / KV;
#ifdef __x86_64__
    if (vec == 3) {
        const int32_t *qt = plan->qt, *qh = plan->qh, *ustart = plan->ustart;
#pragma omp parallel for schedule(static)
        for (int64_t u = 0; u < plan->nu; u++) {
            const float *q[GROUP];
            const int32_t *pos[GROUP];
            int64_t n[GROUP];
            float *sc[GROUP], *o[GROUP];
            const int M = ustart[u + 1] - ustart[u];
            for (int m = 0; m < M; m++) {
                const int64_t t = qt[ustart[u] + m], h = qh[ustart[u] + m];
                q[m] = qkv + t * nq + h * hd;
                pos[m] = keys + key_off[t];
                n[m] = key_off[t + 1] - key_off[t];
                sc[m] = scores + (t * H + h) * stride;
                o[m] = att + t * H * hd + h * hd;
            }
            const int64_t t0 = qt[ustart[u]], g = ((slot ? slot[t0] : 0) * KV + qh[ustart[u]] / G) * cap * hd;
            attend_group_512(M, q, K + g, V + g, pos, n, hd, dm->scale, sc, o);
        }
        return;
    }
#endif
    /* a head's rows in a row on one thread, so the keys they share stay in cache */
#pragma omp parallel for schedule(static) collapse(2)
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) {
            int64_t g = ((slot ? slot[t] : 0) * KV + h / G) * cap * hd;
            attend(qkv + t * nq + h * hd, K + g, V + g, keys + key_off[t], key_off[t + 1] - key_off[t], hd,
                   dm->scale, scores + (t * H + h) * stride, att + t * H * hd + h * hd, vec);
        }
}

/* x [T, d] in/out (the embeddings in, the last layer's output out). w: per layer 4 packed matrices (q|k|v [H+2KV
   heads x hd, d], o [d, H hd], gate|up [2I, d], down [d, I]); norms: per layer 2 vectors [d]. kc, vc: [L, slots, KV,
   cap, hd] (one slot per sequence); row t belongs to slot slot[t] and is written at its position wpos[t]. cos, sin:
   [T, hd]. Row t sees the positions keys[key_off[t] .. key_off[t + 1]) of its slot (ascending, its own included).
   capture: [2 L] flags (attn, mlp of each layer); captured: the flagged sites' outputs [n_flagged, T, d] in layer
   order. Returns 0, or -1 when out of memory. */
int llama_forward(const Dims *dm, int64_t n_layers, const Mat *w, const float *const *norms, const float *const *qk_norms, float *x,
                  int64_t T, float *kc, float *vc, int64_t slots, int64_t cap, const int32_t *slot, const int32_t *wpos,
                  const float *cos, const float *sin, const int32_t *key_off, const int32_t *keys,
                  const int32_t *capture, float *captured) {
    const int64_t d = dm->d, H = dm->heads, KV = dm->kv_heads, hd = dm->head_dim, I = dm->inter;
    const int64_t nq = (H + 2 * KV) * hd, kmax = d > I ? (d > H * hd ? d : H * hd) : (I > H * hd ? I : H * hd);
    int64_t most_keys = 0;
    for (int64_t t = 0; t < T; t++) most_keys = key_off[t + 1] - key_off[t] > most_keys ? key_off[t + 1] - key_off[t] : most_keys;
    Work wk;
    int ok = work_alloc(&wk, T, kmax, d, nq, H * hd, I, d);
    float *scores = malloc(sizeof(float) * (size_t)(H * T * (most_keys + 1)));
    ok = ok && scores;
    int64_t n_cap = 0;
    const int vec = vector_path(dm->path);
    AttendPlan plan = {0};
    ok = ok && attend_plan(dm, T, slot, vec, &plan) == 0;
    for (int64_t l = 0; ok && l < n_layers; l++) {
        float *K = kc + l * slots * KV * cap * hd, *V = vc + l * slots * KV * cap * hd;   /* layer l, slot 0 */
        double t0 = now();
        rms_many(x, T, d, norms[2 * l], d, dm->eps, wk.h, vec);
        double t1 = now();
        product(&w[4 * l], wk.h, T, d, wk.qkv, &wk, dm->path);
        double t2 = now();
        for (int64_t t = 0; t < T; t++) {
            float *row = wk.qkv + t * nq;
            if (qk_norms[2 * l]) {                  /* Qwen3: each q and k head RMS-normed before the rotation */
                rms_many(row, H, hd, qk_norms[2 * l], hd, dm->eps, row, vec);
                rms_many(row + H * hd, KV, hd, qk_norms[2 * l + 1], hd, dm->eps, row + H * hd, vec);
            }
            for (int64_t h = 0; h < H + KV; h++) rotate(row + h * hd, cos + t * hd, sin + t * hd, hd);
            for (int64_t h = 0; h < KV; h++) {
                int64_t at = ((slot[t] * KV + h) * cap + wpos[t]) * hd;
                memcpy(K + at, row + (H + h) * hd, sizeof(float) * (size_t)hd);
                memcpy(V + at, row + (H + KV + h) * hd, sizeof(float) * (size_t)hd);
            }
        }
        double t3 = now();
        attend_all(dm, &plan, wk.qkv, nq, T, K, V, cap, slot, key_off, keys, scores, most_keys + 1, wk.att, vec);
        double t4 = now();
        product(&w[4 * l + 1], wk.att, T, H * hd, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) x[i] = x[i] + wk.tmp[i];
        if (capture[2 * l]) memcpy(captured + (n_cap++) * T * d, x, sizeof(float) * (size_t)(T * d));
        double t5 = now();
        rms_many(x, T, d, norms[2 * l + 1], d, dm->eps, wk.h, vec);
        product(&w[4 * l + 2], wk.h, T, d, wk.gu, &wk, dm->path);
        double t6 = now();
        for (int64_t t = 0; t < T; t++) swiglu(wk.gu + t * 2 * I, wk.gu + t * 2 * I + I, I, wk.act + t * I, vec);
        double t7 = now();
        product(&w[4 * l + 3], wk.act, T, I, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) x[i] = x[i] + wk.tmp[i];
        if (capture[2 * l + 1]) memcpy(captured + (n_cap++) * T * d, x, sizeof(float) * (size_t)(T * d));
        double t8 = now();
        prof[P_NORM] += t1 - t0; prof[P_QKV] += t2 - t1; prof[P_ROPE] += t3 - t2; prof[P_ATTN] += t4 - t3;
        prof[P_O] += t5 - t4; prof[P_MLP_IN] += t6 - t5; prof[P_SWIGLU] += t7 - t6; prof[P_DOWN] += t8 - t7;
    }
    attend_plan_free(&plan);
    work_free(&wk);
    free(scores);
    return ok ? 0 : -1;
}

/* The final norm and the head: logits [R, V] = head(rms(x[r]) * norm) for the R rows asked for (`head`: one
   matrix of any kind, e.g. the GGUF's Q8_0 tied embedding or its Q6_K output). */
int llama_head(const Dims *dm, const float *x, int64_t R, const float *norm, const Mat *head, float *logits) {
    const int64_t d = dm->d;
    Work wk;
    memset(&wk, 0, sizeof wk);
    wk.q8 = malloc((size_t)(R * d));
    wk.dx = malloc(sizeof(float) * (size_t)(R * d / 32));
    wk.sx = malloc(sizeof(float) * (size_t)(R * d / 32));
    wk.qs = malloc(sizeof(int32_t) * (size_t)(R * d / 16));
    wk.h = malloc(sizeof(float) * (size_t)(R * d));
    int64_t vocab = 0;
    for (int p = 0; p < head->parts; p++) vocab += head->n[p];
    wk.part = head->parts > 1 ? malloc(sizeof(float) * (size_t)(R * vocab)) : NULL;
    int ok = wk.q8 && wk.dx && wk.sx && wk.qs && wk.h && (head->parts == 1 || wk.part);
    double t0 = now();
    if (ok) {
        rms_many(x, R, d, norm, d, dm->eps, wk.h, vector_path(dm->path));
        product(head, wk.h, R, d, logits, &wk, dm->path);
    }
    prof[P_HEAD] += now() - t0;
    free(wk.q8); free(wk.dx); free(wk.sx); free(wk.qs); free(wk.h); free(wk.part);
    return ok ? 0 : -1;
}

/* One matrix product as the forward makes it (`product`): y [rows, sum of the parts' n]. For tests. */
int llama_product(const Mat *m, const float *x, int64_t rows, int64_t k, float *y, int path) {
    int64_t n = 0;
    for (int p = 0; p < m->parts; p++) n += m->n[p];
    Work wk;
    int ok = work_alloc(&wk, rows, k, k, n, 8, n, n);
    if (ok) product(m, x, rows, k, y, &wk, path);
    work_free(&wk);
    return ok ? 0 : -1;
}
