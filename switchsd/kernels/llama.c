/* A Llama decoder stack in the q4q8 format, one call per forward: every row computed alone (batch-invariant).

Per layer, per row (x the residual stream, float32):
  h = rms(x) * norm1        rms: r = 1 / sqrtf(sum(x_i^2) / d + eps), h_i = norm1_i * (x_i * r), sums in order
  q|k|v = q4q8(h)           (q4q8.c); q and k rotated: y_i = x_i cos_i + x_{i+-hd/2} sin_i (sin signed, per row)
  k, v -> the cache at the row's position
  attention, per head, over the keys the row sees (ascending positions): s_j = (q . k_j) * scale (the dot
      product as 8 lane sums and a fixed tree, `dot8`);
      m = max s; p_j = expf(s_j - m); o = (sum_j p_j v_j) / (sum_j p_j), sums in order
  x = x + q4q8(o)           [capture "attn"]
  g|u = q4q8(rms(x) * norm2); x = x + q4q8(g / (1 + expf(-g)) * u)     [capture "mlp"]
A row's result depends only on its own inputs and the keys it sees, never on how many rows share the call, so a
verify forward's rows equal, bit for bit, the one-row steps vanilla decoding makes. Threads split each product's
output columns and the attention's heads; every sum runs on one thread in a fixed order.
*/
#include "q4q8.c"

typedef struct {
    int64_t d, heads, kv_heads, head_dim, inter;
    float eps, scale;
    int path;                       /* q4q8 path: 0 best, 1 portable */
} Dims;

typedef struct {                    /* scratch for one forward of T rows */
    int8_t *q8;
    float *dx, *sx, *h, *qkv, *att, *gu, *act, *tmp;
} Work;

static void rms(const float *x, const float *w, int64_t d, float eps, float *out) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++) s = s + x[i] * x[i];
    float r = 1.0f / sqrtf(s / (float)d + eps);
    for (int64_t i = 0; i < d; i++) out[i] = w[i] * (x[i] * r);
}

static void product(const uint8_t *w, const float *x, int64_t rows, int64_t n, int64_t k, float *y, Work *wk, int path) {
    q4q8_quantize(x, rows, k, wk->q8, wk->dx, wk->sx);
    q4q8_matmul_quantized(w, wk->q8, wk->dx, wk->sx, rows, n, k, y, path);
}

static void rotate(float *x, const float *cos, const float *sin, int64_t hd) {
    int64_t half = hd / 2;
    float tmp[512];
    for (int64_t i = 0; i < hd; i++) tmp[i] = x[i];
    for (int64_t i = 0; i < hd; i++) {
        float other = i < half ? tmp[i + half] : tmp[i - half];
        x[i] = tmp[i] * cos[i] + other * sin[i];
    }
}

/* q . k over hd (a multiple of 8) as 8 lane sums, then a fixed tree: the same order on every path (the compiler
   turns the lane loop into vector code where it can; no contraction into fused multiply-adds). */
static inline float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] = acc[j] + a[i + j] * b[i + j];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* One row's attention for one head over `n` keys at cache positions `pos`. kc, vc: [cap, hd] of its kv head. */
static void attend(const float *q, const float *kc, const float *vc, const int32_t *pos, int64_t n, int64_t hd,
                   float scale, float *scores, float *out) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float s = dot8(q, kc + (int64_t)pos[j] * hd, hd) * scale;
        scores[j] = s;
        m = s > m ? s : m;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float p = expf(scores[j] - m);
        sum = sum + p;
        const float *v = vc + (int64_t)pos[j] * hd;
        for (int64_t i = 0; i < hd; i++) out[i] = out[i] + p * v[i];
    }
    for (int64_t i = 0; i < hd; i++) out[i] = out[i] / sum;
}

/* x [T, d] in/out (the embeddings in, the last layer's output out). w: per layer 4 packed matrices (q|k|v [H+2KV
   heads x hd, d], o [d, H hd], gate|up [2I, d], down [d, I]); norms: per layer 2 vectors [d]. kc, vc: [L, KV, cap,
   hd]; rows are written at positions start + t. cos, sin: [T, hd]. Row t sees the cache positions
   keys[key_off[t] .. key_off[t + 1]) (ascending, its own included). capture: [2 L] flags (attn, mlp of each layer);
   captured: the flagged sites' outputs [n_flagged, T, d] in layer order. Returns 0, or -1 when out of memory. */
int llama_forward(const Dims *dm, int64_t n_layers, const uint8_t *const *w, const float *const *norms, float *x,
                  int64_t T, float *kc, float *vc, int64_t cap, int64_t start, const float *cos, const float *sin,
                  const int32_t *key_off, const int32_t *keys, const int32_t *capture, float *captured) {
    const int64_t d = dm->d, H = dm->heads, KV = dm->kv_heads, hd = dm->head_dim, I = dm->inter;
    const int64_t nq = (H + 2 * KV) * hd, kmax = d > I ? (d > H * hd ? d : H * hd) : (I > H * hd ? I : H * hd);
    int64_t most_keys = 0;
    for (int64_t t = 0; t < T; t++) most_keys = key_off[t + 1] - key_off[t] > most_keys ? key_off[t + 1] - key_off[t] : most_keys;
    Work wk;
    wk.q8 = malloc((size_t)(T * kmax));
    wk.dx = malloc(sizeof(float) * (size_t)(T * kmax / 32));
    wk.sx = malloc(sizeof(float) * (size_t)(T * kmax / 32));
    wk.h = malloc(sizeof(float) * (size_t)(T * d));
    wk.qkv = malloc(sizeof(float) * (size_t)(T * nq));
    wk.att = malloc(sizeof(float) * (size_t)(T * H * hd));
    wk.gu = malloc(sizeof(float) * (size_t)(T * 2 * I));
    wk.act = malloc(sizeof(float) * (size_t)(T * I));
    wk.tmp = malloc(sizeof(float) * (size_t)(T * d));
    float *scores = malloc(sizeof(float) * (size_t)(H * T * (most_keys + 1)));
    int ok = wk.q8 && wk.dx && wk.sx && wk.h && wk.qkv && wk.att && wk.gu && wk.act && wk.tmp && scores;
    int64_t n_cap = 0;
    for (int64_t l = 0; ok && l < n_layers; l++) {
        float *K = kc + l * KV * cap * hd, *V = vc + l * KV * cap * hd;
        for (int64_t t = 0; t < T; t++) rms(x + t * d, norms[2 * l], d, dm->eps, wk.h + t * d);
        product(w[4 * l], wk.h, T, nq, d, wk.qkv, &wk, dm->path);
        for (int64_t t = 0; t < T; t++) {
            float *row = wk.qkv + t * nq;
            for (int64_t h = 0; h < H + KV; h++) rotate(row + h * hd, cos + t * hd, sin + t * hd, hd);
            for (int64_t h = 0; h < KV; h++) {
                memcpy(K + (h * cap + start + t) * hd, row + (H + h) * hd, sizeof(float) * (size_t)hd);
                memcpy(V + (h * cap + start + t) * hd, row + (H + KV + h) * hd, sizeof(float) * (size_t)hd);
            }
        }
#pragma omp parallel for schedule(static) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t g = h / (H / KV);
                attend(wk.qkv + t * nq + h * hd, K + g * cap * hd, V + g * cap * hd, keys + key_off[t],
                       key_off[t + 1] - key_off[t], hd, dm->scale, scores + (t * H + h) * (most_keys + 1),
                       wk.att + t * H * hd + h * hd);
            }
        product(w[4 * l + 1], wk.att, T, d, H * hd, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) x[i] = x[i] + wk.tmp[i];
        if (capture[2 * l]) memcpy(captured + (n_cap++) * T * d, x, sizeof(float) * (size_t)(T * d));
        for (int64_t t = 0; t < T; t++) rms(x + t * d, norms[2 * l + 1], d, dm->eps, wk.h + t * d);
        product(w[4 * l + 2], wk.h, T, 2 * I, d, wk.gu, &wk, dm->path);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < I; i++) {
                float g = wk.gu[t * 2 * I + i], u = wk.gu[t * 2 * I + I + i];
                wk.act[t * I + i] = g / (1.0f + expf(-g)) * u;
            }
        product(w[4 * l + 3], wk.act, T, d, I, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) x[i] = x[i] + wk.tmp[i];
        if (capture[2 * l + 1]) memcpy(captured + (n_cap++) * T * d, x, sizeof(float) * (size_t)(T * d));
    }
    free(wk.q8); free(wk.dx); free(wk.sx); free(wk.h); free(wk.qkv); free(wk.att); free(wk.gu); free(wk.act);
    free(wk.tmp); free(scores);
    return ok ? 0 : -1;
}

/* The final norm and the head: logits [R, V] = head(rms(x[r]) * norm) for the R rows asked for; the head a Q8_0
   matrix (`q8`: the GGUF's tied embedding) or a Q4 one. */
int llama_head(const Dims *dm, const float *x, int64_t R, const float *norm, const uint8_t *head, int q8,
               int64_t vocab, float *logits) {
    const int64_t d = dm->d;
    Work wk;
    wk.q8 = malloc((size_t)(R * d));
    wk.dx = malloc(sizeof(float) * (size_t)(R * d / 32));
    wk.sx = malloc(sizeof(float) * (size_t)(R * d / 32));
    wk.h = malloc(sizeof(float) * (size_t)(R * d));
    int ok = wk.q8 && wk.dx && wk.sx && wk.h;
    if (ok) {
        for (int64_t r = 0; r < R; r++) rms(x + r * d, norm, d, dm->eps, wk.h + r * d);
        q4q8_quantize(wk.h, R, d, wk.q8, wk.dx, wk.sx);
        if (q8) q8_matmul_quantized(head, wk.q8, wk.dx, R, vocab, d, logits, dm->path);
        else q4q8_matmul_quantized(head, wk.q8, wk.dx, wk.sx, R, vocab, d, logits, dm->path);
    }
    free(wk.q8); free(wk.dx); free(wk.sx); free(wk.h);
    return ok ? 0 : -1;
}
