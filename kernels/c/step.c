/* ---- a decode step's layers in one call (graft_core/step.py) -----------------------------------------

   The layers of a Gemma 3 or Llama-family decoder for S sessions' new rows (one each for a decode step, a prompt's for a
   prefill), each operation the one the model's
   modules run one call at a time (graft_core.batch.Batcher._pass, itself checked against transformers'
   forward): kv_rmsnorm, kv_linear, the rotary embedding as ATen computes q * cos + rotate_half(q) * sin
   (rotate_half(q) = cat(-q2, q1); three float32 operations per element), kv_attention over the session's
   cached rows and the new one, act(gate) * up, and the residual adds. A layer's table says which of those it
   has: the Llama family (LlamaDecoderLayer's order) has no q/k norms and no norms after attention and MLP
   (those `norm` entries are NULL: its post_attention_layernorm is the pre-feedforward one, norm[4]), RMSNorm
   without Gemma's + 1 (`plus_one` 0), SiLU for the tanh GELU (`act` 1), and biases where its projections have
   them (`bias`, added after the product as nn.Linear adds it: one float32 add per element). Nothing is reordered or fused, so
   the rows are the same bytes; what goes is the Python between the calls. The caches are the caller's
   buffers (graft_core.layers._Rows): a session's new key/value rows are written from `end` on, and its new
   row r attends the buffer's rows from `start` (or, in a sliding layer, from the first less than `window`
   positions back) to end + r, without a mask: a contiguous range of keys gives the bytes of the same keys
   kept by a mask (kv_attention's definition: moving every key by the same number of lanes only swaps
   operands of additions). The caller made room and moves its bookkeeping after.
   A session's held rows may start with a restored artifact's, read in place and shared with every session
   that grafts it (graft_core.layers: never written): bn[c] rows from bk[c] / bv[c] (its kv head g at
   + g bcap[c] D), then the buffer's rows [start, end). The rows a new row attends are counted in that order;
   attention reads them in two segments (kv_rows), the same operations as over one copy. */

typedef struct {
    const uint8_t *w[7]; /* q, k, v, o, gate, up, down: rows in their formats */
    int32_t fmt[7];
    int64_t n[7], k[7];
    const float *norm[6]; /* input, q, k, post-attention, pre-feedforward, post-feedforward */
    float eps, scale;
    int64_t heads, kv_heads, head_dim, hidden, inter;
    const float *bias[7]; /* per product, NULL where it has none */
    int32_t plus_one;     /* RMSNorm's weight: 1 Gemma's (1 + w), 0 the Llama family's w */
    int32_t act;          /* 0 the tanh GELU, 1 SiLU */
} kv_layer;

/* The layer's norm `j` of `rows` rows of n into y (its kind: Gemma's or the Llama family's). */
static int layer_norm_rows(const kv_layer *y, int j, const float *x, int64_t rows, int64_t n, float *out, int threads) {
    return y->plus_one ? kv_rmsnorm(x, rows, n, y->norm[j], y->eps, out, threads)
                       : kv_rmsnorm_mul(x, rows, n, y->norm[j], y->eps, out, threads);
}

/* Product `j` of the layer over M rows of K into out [M][N], then its bias where it has one. */
static int layer_linear(const kv_layer *y, int j, const float *x, int64_t M, int64_t K, float *out, int threads) {
    const int64_t N = y->n[j];
    const int rc = kv_linear(x, M, K, K, y->w[j], y->fmt[j], N, out, N, threads);
    const float *b = y->bias[j];
    if (b)
        for (int64_t m = 0; m < M; m++)
            for (int64_t i = 0; i < N; i++) out[m * N + i] = out[m * N + i] + b[i];
    return rc;
}

int kv_layer_size(void) { return (int)sizeof(kv_layer); }

/* out[i] = a[i] * c[i] + rot(a)[i] * s[i] over one head row of D (D even), rot(a) = cat(-a[D/2:], a[:D/2]). */
static void rotate_row(const float *a, const float *c, const float *s, int64_t D, float *out) {
    const int64_t h = D / 2;
    for (int64_t d = 0; d < h; d++) out[d] = a[d] * c[d] + (-a[d + h]) * s[d];
    for (int64_t d = h; d < D; d++) out[d] = a[d] * c[d] + a[d - h] * s[d];
}

/* The rows from the `lo`-th one a session holds (its shared rows first, then its buffer's from `start`), kv head g. */
static kv_rows held_rows(const float *bk, const float *bv, int64_t bcap, int64_t bn, const float *kb, const float *vb,
                         int64_t cap, int64_t start, int64_t g, int64_t D, int64_t lo) {
    const float *k1 = kb + (g * cap + start) * D, *v1 = vb + (g * cap + start) * D;
    if (lo < bn) {
        const kv_rows r = {bk + (g * bcap + lo) * D, bv + (g * bcap + lo) * D, k1, v1, D, D, bn - lo};
        return r;
    }
    const kv_rows r = {k1 + (lo - bn) * D, v1 + (lo - bn) * D, k1, v1, D, D, INT64_MAX};
    return r;
}

int kv_decode_layers(const kv_layer *layers, int64_t L, int64_t S, const int64_t *rows, float *x, float *const *kbuf,
                     float *const *vbuf, const int64_t *cap, const int64_t *start, const int64_t *end,
                     const float *const *bk, const float *const *bv, const int64_t *bcap, const int64_t *bn,
                     const int64_t *window, const float *const *cos, const float *const *sin, int threads) {
    if (L <= 0 || S <= 0) return -1;
    int64_t most = 0, M = 0;
    for (int64_t s = 0; s < S; s++) {
        if (rows[s] <= 0) return -1;
        M += rows[s];
    }
    for (int64_t l = 0; l < L; l++) {
        const kv_layer *y = &layers[l];
        const int64_t sizes[4] = {y->hidden, y->heads * y->head_dim, y->kv_heads * y->head_dim, y->inter};
        for (int i = 0; i < 4; i++) most = sizes[i] > most ? sizes[i] : most;
        if (y->head_dim % 2 || y->kv_heads <= 0 || y->heads % y->kv_heads) return -1;
    }
    /* scratch: h, q, q', k, k', v, att, o (hidden or heads), gate, up */
    float *buf = malloc((size_t)M * (size_t)most * 10 * 4);
    if (!buf) return -2;
    float *h = buf, *q = h + M * most, *qr = q + M * most, *kk = qr + M * most, *kr = kk + M * most,
          *vv = kr + M * most, *att = vv + M * most, *o = att + M * most, *g = o + M * most, *u = g + M * most;
    int rc = 0;
    for (int64_t l = 0; l < L && !rc; l++) {
        const kv_layer *y = &layers[l];
        const int64_t E = y->hidden, D = y->head_dim, H = y->heads, G = y->kv_heads, QD = H * D, KD = G * D, I = y->inter;
        if (y->n[0] != QD || y->n[1] != KD || y->n[2] != KD || y->n[3] != E || y->n[4] != I || y->n[5] != I || y->n[6] != E) {
            rc = -1;
            break;
        }
        rc |= layer_norm_rows(y, 0, x, M, E, h, threads);
        rc |= layer_linear(y, 0, h, M, E, q, threads);
        rc |= layer_linear(y, 1, h, M, E, kk, threads);
        rc |= layer_linear(y, 2, h, M, E, vv, threads);
        /* the rows rotated: q/k normed where the layer has those norms (into qr, kr; q is rotated back into q),
           else q and k as they came (q rotated into qr) */
        float *qin = q, *qout = qr;
        const float *kin = kk;
        if (y->norm[1]) {
            rc |= layer_norm_rows(y, 1, q, M * H, D, qr, threads);
            rc |= layer_norm_rows(y, 2, kk, M * G, D, kr, threads);
            qin = qr, qout = q, kin = kr;
        }
        const int64_t group = H / G;
        for (int64_t s = 0, m0 = 0; s < S && !rc; m0 += rows[s], s++) {
            const int64_t c = l * S + s, T = rows[s];
            if (end[c] + T > cap[c]) { rc = -3; break; }
            for (int64_t r = 0; r < T; r++) { /* every new key/value row first: row r attends rows up to end + r */
                const float *cs = cos[c] + r * D, *sn = sin[c] + r * D;
                for (int64_t hh = 0; hh < H; hh++)
                    rotate_row(qin + (m0 + r) * QD + hh * D, cs, sn, D, qout + (m0 + r) * QD + hh * D);
                for (int64_t gg = 0; gg < G; gg++) {
                    const int64_t at = (gg * cap[c] + end[c] + r) * D;
                    rotate_row(kin + (m0 + r) * KD + gg * D, cs, sn, D, kbuf[c] + at);
                    memcpy(vbuf[c] + at, vv + (m0 + r) * KD + gg * D, (size_t)D * 4);
                }
            }
            /* the rows row r sees, counted from the first one held (shared rows, then the buffer's from `start`):
               every held one and the new ones up to it, or within a sliding window those less than `window`
               positions back */
            const int64_t w = window[l], held = bn[c] + end[c] - start[c];
#define ROW_LO(r) (w > 0 && held + (r) - w + 1 > 0 ? held + (r) - w + 1 : 0)
#define ROWS_FROM(lo, gg) held_rows(bk[c], bv[c], bcap[c], bn[c], kbuf[c], vbuf[c], cap[c], start[c], gg, D, lo)
            if (T == 1 && D % 16 == 0 && G <= 64) { /* every kv head's attention in one parallel region */
                const int64_t lo = ROW_LO(0);
                kv_rows kv[64];
                for (int64_t gg = 0; gg < G; gg++) kv[gg] = ROWS_FROM(lo, gg);
                rc |= attend_step(qout + m0 * QD, G, group, D, kv, held - lo + 1, y->scale, att + m0 * QD, threads);
                continue;
            }
            if (T == 1) {
                const int64_t lo = ROW_LO(0);
                for (int64_t gg = 0; gg < G && !rc; gg++) {
                    const kv_rows kv = ROWS_FROM(lo, gg);
                    rc |= attention(qout + m0 * QD + gg * group * D, group, 1, D, D, QD, &kv, held - lo + 1, 0, 0, 0, y->scale,
                                    att + m0 * QD + gg * group * D, D, QD, threads, 0);
                }
                continue;
            }
            /* a prompt's rows in one call over the union of their ranges, each row's own range kept by a mask
               (the definition gives a row the same bytes from a masked union as from its contiguous range):
               the rows' dot products share the keys' loads */
            const int64_t lo0 = ROW_LO(0), n = held + T - lo0;
            uint8_t *keep = calloc((size_t)(T * n), 1);
            if (!keep) { rc = -2; break; }
            for (int64_t r = 0; r < T; r++) memset(keep + r * n + (ROW_LO(r) - lo0), 1, (size_t)(held + r - ROW_LO(r) + 1));
#undef ROW_LO
            for (int64_t gg = 0; gg < G && !rc; gg++) {
                const kv_rows kv = ROWS_FROM(lo0, gg);
                rc |= attention(qout + m0 * QD + gg * group * D, group, T, D, D, QD, &kv, n, keep, 0, n, y->scale,
                                att + m0 * QD + gg * group * D, D, QD, threads, 0);
            }
#undef ROWS_FROM
            free(keep);
        }
        rc |= layer_linear(y, 3, att, M, QD, o, threads);
        const float *add = o;
        if (y->norm[3]) {
            rc |= layer_norm_rows(y, 3, o, M, E, h, threads);
            add = h;
        }
        for (int64_t i = 0; i < M * E; i++) x[i] = x[i] + add[i];
        rc |= layer_norm_rows(y, 4, x, M, E, h, threads);
        rc |= layer_linear(y, 5, h, M, E, u, threads);
        rc |= layer_linear(y, 4, h, M, E, g, threads);
        rc |= y->act ? kv_silu(g, M * I, g, threads) : kv_gelu_tanh(g, M * I, g, threads);
        for (int64_t i = 0; i < M * I; i++) g[i] = g[i] * u[i];
        rc |= layer_linear(y, 6, g, M, I, o, threads);
        add = o;
        if (y->norm[5]) {
            rc |= layer_norm_rows(y, 5, o, M, E, h, threads);
            add = h;
        }
        for (int64_t i = 0; i < M * E; i++) x[i] = x[i] + add[i];
    }
    free(buf);
    return rc;
}
