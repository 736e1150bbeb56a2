/* An EAGLE-3 head's decoder layer in one call, its matrices as Q8_0 blocks (drafts only: the head proposes, the
target's verification decides what is kept).

Per row t (emb: the target's embedding of the row's token; h: the fused target features after `fc`, or the head's
own previous output):
  a = [rms(emb) * n_in, rms(h) * n_hidden]            [2d], embedding first
  q|k|v = q8(a); q and k rotated (llama.c's `rotate`); k, v -> the head's cache at entry wpos[t]
  attention, per head, over the cache entries keys[key_off[t] .. key_off[t + 1]) (llama.c's `attend`)
  h1 = h + q8(o);  out = h1 + q8(swiglu(q8(rms(h1) * n_post)))
The draft logits are llama.c's `llama_head` over `out` (the head's final norm and its Q8_0 LM head). Each row is
computed alone, as in llama.c: a tree level's rows are the rows a chain would compute one by one.
*/
#include "llama.c"

static void product8(const uint8_t *w, const float *x, int64_t rows, int64_t n, int64_t k, float *y, Work *wk,
                     int path) {
    q4q8_quantize(x, rows, k, wk->q8, wk->dx, wk->sx);
    if (wide512(n, path)) {                       /* qx.c's pair kernel, as llama.c's products (the same bits) */
        qx_sums(wk->q8, rows, k, wk->qs);
        qx_matmul_quantized(w, QX_Q8, wk->q8, wk->dx, wk->sx, wk->qs, rows, n, k, y, 4);
    } else {
        q8_matmul_quantized(w, wk->q8, wk->dx, rows, n, k, y, path);
    }
}

/* emb, h, out [T, d]. w: q|k|v [(H + 2 KV) hd, 2d], o [d, H hd], gate|up [2I, d], down [d, I], each packed by
   q8_pack. norms: n_in, n_hidden, n_post [d]. kc, vc: the head's cache [KV, cap, hd]. cos, sin: [T, hd] at each
   row's rotary position. Returns 0, or -1 when out of memory. */
int eagle3_step(const Dims *dm, const uint8_t *const *w, const float *const *norms, const float *emb, const float *h,
                int64_t T, float *kc, float *vc, int64_t cap, const int32_t *wpos, const float *cos, const float *sin,
                const int32_t *key_off, const int32_t *keys, float *out) {
    const int64_t d = dm->d, H = dm->heads, KV = dm->kv_heads, hd = dm->head_dim, I = dm->inter;
    const int64_t nq = (H + 2 * KV) * hd, kmax = 2 * d > I ? (2 * d > H * hd ? 2 * d : H * hd) : (I > H * hd ? I : H * hd);
    int64_t most_keys = 0;
    for (int64_t t = 0; t < T; t++) most_keys = key_off[t + 1] - key_off[t] > most_keys ? key_off[t + 1] - key_off[t] : most_keys;
    Work wk;
    int ok = work_alloc(&wk, T, kmax, 2 * d, nq, H * hd, I, d);
    float *scores = malloc(sizeof(float) * (size_t)(H * T * (most_keys + 1)));
    ok = ok && scores;
    const int vec = vector_path(dm->path);
    if (ok) {
        for (int64_t t = 0; t < T; t++) {
            rms(emb + t * d, norms[0], d, dm->eps, wk.h + t * 2 * d);
            rms(h + t * d, norms[1], d, dm->eps, wk.h + t * 2 * d + d);
        }
        product8(w[0], wk.h, T, nq, 2 * d, wk.qkv, &wk, dm->path);
        for (int64_t t = 0; t < T; t++) {
            float *row = wk.qkv + t * nq;
            for (int64_t j = 0; j < H + KV; j++) rotate(row + j * hd, cos + t * hd, sin + t * hd, hd);
            for (int64_t j = 0; j < KV; j++) {
                memcpy(kc + (j * cap + wpos[t]) * hd, row + (H + j) * hd, sizeof(float) * (size_t)hd);
                memcpy(vc + (j * cap + wpos[t]) * hd, row + (H + KV + j) * hd, sizeof(float) * (size_t)hd);
            }
        }
        AttendPlan plan;
        ok = attend_plan(dm, T, NULL, vec, &plan) == 0;
        if (ok) attend_all(dm, &plan, wk.qkv, nq, T, kc, vc, cap, NULL, key_off, keys, scores, most_keys + 1, wk.att, vec);
        attend_plan_free(&plan);
        product8(w[1], wk.att, T, d, H * hd, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) out[i] = h[i] + wk.tmp[i];
        rms_many(out, T, d, norms[2], d, dm->eps, wk.h, vec);
        product8(w[2], wk.h, T, 2 * I, d, wk.gu, &wk, dm->path);
        for (int64_t t = 0; t < T; t++) swiglu(wk.gu + t * 2 * I, wk.gu + t * 2 * I + I, I, wk.act + t * I, vec);
        product8(w[3], wk.act, T, d, I, wk.tmp, &wk, dm->path);
        for (int64_t i = 0; i < T * d; i++) out[i] = out[i] + wk.tmp[i];
    }
    work_free(&wk);
    free(scores);
    return ok ? 0 : -1;
}
