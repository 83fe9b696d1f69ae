/* The integer products (kv_linear_i8): int8ref.c's definition computed on tiles of outputs over simd.h's integer
   primitives. A weight row's block is prepared once (prep_*: its values as bytes, its scales as int16 lanes) and
   multiplied with the quantised rows of x beside it (dot_*): the integer sums in any order (exact), the float
   operations in the definition's. Which outputs share a tile and how rows are split over threads change no byte. */

/* The quantised rows of x: q (K bytes a row), d (K / qb scales), bs (K / 32 sums of q). */
typedef struct {
    const int8_t *q;
    const float *d;
    const int16_t *bs;
    int64_t K;
} i8rows;

/* One row: its blocks quantised (int8ref.c), the sums of each 32 taken, and for Q4_K (perm) each block's 32-value
   pieces put in the order its 4-bit values pair them in (0, 2, 1, 3, 4, 6, 5, 7: the low nibbles of bytes 0-63 hold
   pieces 0 and 2), so that 64 bytes of values and of q are read alike. The order changes no integer sum. */
static void q8_row(const float *x, int64_t K, int qb, int perm, int8_t *q, float *d, int16_t *bs) {
    for (int64_t b = 0; b < K / qb; b++) {
        float id;
        d[b] = q8_scale(q8_amax_bits(x + b * qb, qb), &id);
        q8_round(x + b * qb, qb, id, q + b * qb);
    }
    for (int64_t j = 0; j < K / 32; j++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += q[32 * j + i];
        bs[j] = (int16_t)s;
    }
    if (perm)
        for (int64_t b = 0; b < K / 256; b++) {
            int8_t t[64];
            for (int c = 0; c < 256; c += 128) {
                memcpy(t, q + 256 * b + c + 32, 32);
                memcpy(q + 256 * b + c + 32, q + 256 * b + c + 64, 32);
                memcpy(q + 256 * b + c + 64, t, 32);
            }
        }
}

static const int8_t ZEROS32[32];
#ifndef I8_PF
#define I8_PF 8 /* weight rows ahead a block is prefetched from (tiles of several weight rows) */
#endif

/* ---- per format: a prepared weight block (prep_*), a quantised row's block (load_*), their product (dot_*) ---- */
typedef struct {
    vb w[4];
    vs s[4];
    vm mn;
    float d, dmin;
} pk_q4_k;
static inline void prep_q4_k(const uint8_t *blk, pk_q4_k *p) {
    for (int c = 0; c < 2; c++) {
        const vb v = vb_load(blk + 16 + 64 * c);
        p->w[2 * c] = vb_nib(v, 0), p->w[2 * c + 1] = vb_nib(v, 1);
    }
    k4_prep(blk + 4, p->s, &p->mn);
    p->d = h2f(blk), p->dmin = h2f(blk + 2);
}
static inline void dot_q4_k(const pk_q4_k *p, const int8_t *q, float d, const int16_t *bs, v16 *acc, v4 *am) {
    const vi s = vi_add(vi_add(vi_dot(p->w[0], vb_load(q), p->s[0]), vi_dot(p->w[1], vb_load(q + 64), p->s[1])),
                        vi_add(vi_dot(p->w[2], vb_load(q + 128), p->s[2]), vi_dot(p->w[3], vb_load(q + 192), p->s[3])));
    *acc = v_fmadd(v_from_vi(s), v_set1(p->d * d), *acc);
    *am = v4_mins(*am, p->mn, bs, p->dmin * d);
}

typedef struct {
    vb w[4];
    vsg sg[4];
    vs s[4];
    float d;
} pk_q6_k;
static inline void prep_q6_k(const uint8_t *blk, pk_q6_k *p) {
    _Alignas(64) int8_t v[256];
    q_q6x128(blk, blk + 128, v);
    q_q6x128(blk + 64, blk + 160, v + 128);
    KV_FROM_MEMORY();
    for (int c = 0; c < 4; c++) {
        const vb w = vb_load(v + 64 * c);
        p->w[c] = vb_abs(w), p->sg[c] = vb_sign(w);
    }
    q6_scales((const int8_t *)(blk + 192), p->s);
    p->d = h2f(blk + 208);
}
static inline void dot_q6_k(const pk_q6_k *p, const int8_t *q, float d, const int16_t *bs, v16 *acc, v4 *am) {
    (void)bs, (void)am;
    const vi s = vi_add(vi_add(vi_dot_sg(p->w[0], p->sg[0], vb_load(q), p->s[0]), vi_dot_sg(p->w[1], p->sg[1], vb_load(q + 64), p->s[1])),
                        vi_add(vi_dot_sg(p->w[2], p->sg[2], vb_load(q + 128), p->s[2]), vi_dot_sg(p->w[3], p->sg[3], vb_load(q + 192), p->s[3])));
    *acc = v_fmadd(v_from_vi(s), v_set1(p->d * d), *acc);
}

/* MB quantised rows (from m0) against RB weight rows: each weight row's block prepared once, then multiplied with
   the MB rows' blocks. */
#define I8K_TILE(NAME, BYTES, MB, RB)                                                                          \
    static void i8t_##NAME##_##MB##_##RB(const i8rows *xr, int64_t m0, const uint8_t *w, int64_t rb, float *y,  \
                                         int64_t ldy) {                                                        \
        v16 acc[MB][RB];                                                                                       \
        v4 am[MB][RB];                                                                                         \
        const int64_t nb = xr->K / 256;                                                                        \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero(), am[m][r] = v4_zero();                           \
        for (int64_t b = 0; b < nb; b++) {                                                                     \
            for (int r = 0; r < RB; r++) {                                                                     \
                pk_##NAME pk;                                                                                  \
                if (RB > 1) /* one row at a time is one sequential stream: the hardware's prefetch does better */ \
                    for (int l = 0; l < (BYTES) + 64; l += 64) v_prefetch(w + (r + I8_PF) * rb + b * (BYTES) + l); \
                prep_##NAME(w + r * rb + b * (BYTES), &pk);                                                    \
                for (int m = 0; m < MB; m++)                                                                   \
                    dot_##NAME(&pk, xr->q + (m0 + m) * xr->K + 256 * b, xr->d[(m0 + m) * nb + b],              \
                               xr->bs + (m0 + m) * (xr->K / 32) + 8 * b, &acc[m][r], &am[m][r]);               \
            }                                                                                                  \
        }                                                                                                      \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]) - v4_sum(am[m][r]);              \
    }
/* The 32-value formats in pairs of blocks (64 values); a last odd block is paired with zeros, whose lanes get
   fmaf(0, 0, acc). w32_* puts a block's 32 signed values at v (Q8_0's bytes read in place) and returns where they
   are; q32_values (int8ref.c) is the definition's unpacking, the same integers in every build. */
static inline const int8_t *w32_q8_0(const uint8_t *blk, int8_t *v) {
    (void)v;
    return (const int8_t *)blk + 2;
}
static inline const int8_t *w32_q5_0(const uint8_t *blk, int8_t *v) {
    q32_values(FMT_Q5_0, blk, v);
    return v;
}
#define I8B32_TILE(NAME, BYTES, MB, RB)                                                                        \
    static void i8t_##NAME##_##MB##_##RB(const i8rows *xr, int64_t m0, const uint8_t *w, int64_t rb, float *y,  \
                                         int64_t ldy) {                                                        \
        v16 acc[MB][RB];                                                                                       \
        const int64_t nb = xr->K / 32;                                                                         \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero();                                                 \
        for (int64_t b = 0; b < nb; b += 2) {                                                                  \
            const int two = b + 1 < nb;                                                                        \
            for (int r = 0; r < RB; r++) {                                                                     \
                const uint8_t *blk = w + r * rb + b * (BYTES);                                                 \
                if (RB > 1) v_prefetch(blk + I8_PF * rb);                                                      \
                _Alignas(64) int8_t v[64];                                                                     \
                const int8_t *lo = w32_##NAME(blk, v), *hi = two ? w32_##NAME(blk + (BYTES), v + 32) : ZEROS32; \
                const vb wv = vb_load2(lo, hi);                                                                \
                const vb aw = vb_abs(wv);                                                                      \
                const vsg sg = vb_sign(wv);                                                                    \
                const float d0 = h2f(blk), d1 = two ? h2f(blk + (BYTES)) : 0.0f;                               \
                for (int m = 0; m < MB; m++) {                                                                 \
                    const int8_t *q = xr->q + (m0 + m) * xr->K + 32 * b;                                       \
                    const float *d = xr->d + (m0 + m) * nb + b;                                                \
                    const vi s = vi_dot_sg(aw, sg, vb_load2(q, two ? q + 32 : ZEROS32), vs_ones());            \
                    acc[m][r] = v_fmadd(v_from_vi(s), v_two(d0 * d[0], two ? d1 * d[1] : 0.0f), acc[m][r]);    \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]); /* - (+0): x */                 \
    }

/* Tile shapes: up to I8_TM rows of x (16, 8, 4, 2 or 1) against I8_TR weight rows (or 1, at the end of W) */
#ifndef I8_TM
#define I8_TM 16
#endif
#ifndef I8_TR
#define I8_TR 2
#endif
#if I8_TR == 1
#define I8_TILES_(T, TR, ...) T(__VA_ARGS__ 1, 1) T(__VA_ARGS__ 2, 1) T(__VA_ARGS__ 4, 1) T(__VA_ARGS__ 8, 1) T(__VA_ARGS__ 16, 1)
#else
#define I8_TILES_(T, TR, ...)                                                                                  \
    T(__VA_ARGS__ 1, 1) T(__VA_ARGS__ 2, 1) T(__VA_ARGS__ 4, 1) T(__VA_ARGS__ 8, 1) T(__VA_ARGS__ 16, 1)        \
    T(__VA_ARGS__ 1, TR) T(__VA_ARGS__ 2, TR) T(__VA_ARGS__ 4, TR) T(__VA_ARGS__ 8, TR) T(__VA_ARGS__ 16, TR)
#endif
#define I8_TILES(T, ...) I8_TILES_(T, I8_TR, __VA_ARGS__)
I8_TILES(I8K_TILE, q4_k, 144,) I8_TILES(I8K_TILE, q6_k, 210,) I8_TILES(I8B32_TILE, q8_0, 34,) I8_TILES(I8B32_TILE, q5_0, 22,)
typedef void (*i8t_fn)(const i8rows *, int64_t, const uint8_t *, int64_t, float *, int64_t);
#define I8_FN_(NAME, MB, RB) i8t_##NAME##_##MB##_##RB
#define I8_FN(NAME, MB, RB) I8_FN_(NAME, MB, RB)
#define I8_TABLE(NAME)                                                                                          \
    static const i8t_fn I8T_##NAME[2][5] = {                                                                    \
        {I8_FN(NAME, 1, 1), I8_FN(NAME, 2, 1), I8_FN(NAME, 4, 1), I8_FN(NAME, 8, 1), I8_FN(NAME, 16, 1)},       \
        {I8_FN(NAME, 1, I8_TR), I8_FN(NAME, 2, I8_TR), I8_FN(NAME, 4, I8_TR), I8_FN(NAME, 8, I8_TR), I8_FN(NAME, 16, I8_TR)}};
I8_TABLE(q4_k) I8_TABLE(q6_k) I8_TABLE(q8_0) I8_TABLE(q5_0)

/* y[M][N] = x @ W^T under the integer definition (int8ref.c), W in Q8_0, Q5_0, Q4_K or Q6_K. */
int kv_linear_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N, float *y,
                 int64_t ldy, int threads) {
    const int qb = kv_i8_block(fmt);
    const int64_t rb = kv_row_bytes(fmt, K);
    if (!qb || rb < 0 || K % qb || M < 0 || N < 0 || K <= 0) return -1;
    const i8t_fn(*tiles)[5] = fmt == FMT_Q4_K ? I8T_q4_k : fmt == FMT_Q6_K ? I8T_q6_k : fmt == FMT_Q5_0 ? I8T_q5_0 : I8T_q8_0;
    int8_t *q = aligned_alloc(64, (size_t)((M * K + 63) / 64 * 64));
    float *d = malloc((size_t)(M * (K / qb)) * 4 + 4);
    int16_t *bs = malloc((size_t)(M * (K / 32)) * 2 + 2);
    if (!q || !d || !bs) {
        free(q), free(d), free(bs);
        return -2;
    }
    const int nt = threads > 0 ? threads : 1;
#pragma omp parallel for num_threads(M * K >= SPLIT_MIN ? nt : 1) schedule(static)
    for (int64_t m = 0; m < M; m++) q8_row(x + m * ldx, K, qb, fmt == FMT_Q4_K, q + m * K, d + m * (K / qb), bs + m * (K / 32));
    const i8rows xr = {q, d, bs, K};
    /* Rows of x in blocks of MT (their bytes stay in cache while every weight row passes), the weight rows split
       over the threads in groups of 4 */
    /* One or two rows of x (a decode step): each weight row read whole before the next, one sequential stream per
       thread, which the hardware prefetches at near the memory's rate (rows side by side ran 1.5x slower) */
    const int seq = M <= 2;
    const int64_t MT = 64, groups = (N + I8_TR - 1) / I8_TR;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
        const int64_t m1 = M - m0 < MT ? M : m0 + MT;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t n = I8_TR * g, full = n + I8_TR <= N;
            for (int64_t m = m0; m < m1;) {
                int t = 4; /* the largest tile that fits: 16 rows (t 4), 8, 4, 2, 1 (t 0) */
                while ((1 << t) > I8_TM || m + (1 << t) > m1) t--;
                if (full && !seq) tiles[1][t](&xr, m, w + n * rb, rb, y + m * ldy + n, ldy);
                else
                    for (int64_t j = n; j < (full ? n + I8_TR : N); j++) tiles[0][t](&xr, m, w + j * rb, rb, y + m * ldy + j, ldy);
                m += 1 << t;
            }
        }
    }
    free(q), free(d), free(bs);
    return 0;
}
