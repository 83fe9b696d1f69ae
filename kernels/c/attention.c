/* Attention (kv_attention) written once over simd.h's primitives: reference.c's definition (attend_row_ref)
   computed on blocks of query positions whose heads share the keys' loads, or, for one position over many
   keys, split over threads by keys and values. The tests compare every build with the definition byte for
   byte (tests/test_numerics.py). */

#define ATT_PB 16 /* query positions per block: their heads' rows share the keys' loads */

/* Tiles of attention: QK_R query rows x QK_C keys of dot products, PV_H probability rows x PV_WIDE_C parts of
   values of P.V (QK_C and PV_WIDE_C from the arch file). They decide which outputs share the loads, never how
   one output is computed. */
#define QK_R 4
#define PV_H 4
#define PV_AHEAD 256 /* keys ahead in a lane (16 of its rows) that P.V asks the memory for */
#define QK_AHEAD 32  /* keys ahead that the dot products ask the memory for */

/* Ask for the D values of the rows a tile of dot products will read QK_AHEAD keys on (hints: no value changes). */
#define QK_PREFETCH(kv, j, j1, D)                                                                              \
    do {                                                                                                      \
        if ((j) + QK_AHEAD + QK_C <= (j1))                                                                    \
            for (int64_t pj = (j) + QK_AHEAD; pj < (j) + QK_AHEAD + QK_C; pj++)                               \
                for (int64_t pd = 0; pd < (D); pd += 16) v_prefetch(key_row(kv, pj) + pd);                   \
    } while (0)
#define PV_WIDE_VALUES (PV_WIDE_C * VP_LANES) /* values of a wide P.V call; a narrow one takes 16 (VP_PARTS parts) */

/* R query rows q[r] against the C keys from k (row stride lk), D a multiple of 16: t[r][j + c]. One part of
   the 16 lanes at a time (simd.h), as the products' tiles: each lane's fmaf chain over D is the one a v16
   accumulator holds, in the same order, and the parts meet in reduce16. */
#define QK_(R, C)                                                                                             \
    static void qk_##R##_##C(const float *const *q, const float *k, int64_t lk, int64_t D, float *const *t,   \
                             int64_t j) {                                                                     \
        vp part[VP_PARTS][R][C];                                                                              \
        for (int h = 0; h < VP_PARTS; h++) {                                                                  \
            vp acc[R][C];                                                                                     \
            for (int r = 0; r < R; r++)                                                                       \
                for (int c = 0; c < C; c++) acc[r][c] = vp_zero();                                            \
            for (int64_t d = VP_LANES * h; d < D; d += 16) {                                                  \
                vp kv[C];                                                                                     \
                for (int c = 0; c < C; c++) kv[c] = vp_load(k + c * lk + d);                                  \
                for (int r = 0; r < R; r++) {                                                                 \
                    const vp qv = vp_load(q[r] + d);                                                          \
                    for (int c = 0; c < C; c++) acc[r][c] = vp_fmadd(qv, kv[c], acc[r][c]);                   \
                }                                                                                             \
            }                                                                                                 \
            for (int r = 0; r < R; r++)                                                                       \
                for (int c = 0; c < C; c++) part[h][r][c] = acc[r][c];                                        \
        }                                                                                                     \
        for (int r = 0; r < R; r++)                                                                           \
            for (int c = 0; c < C; c++) t[r][j + c] = reduce16(v_join(part[0][r][c], part[VP_PARTS - 1][r][c])); \
    }

#ifdef KV_REDUCE16X16
/* R query rows q[r] against 16 keys from k (row stride lk), D a multiple of 16: t[r][j .. j + 15]. Each dot
   product is qk_*'s, one v16 accumulator over D in the same order and the same tree; the 16 trees of a row are
   taken at once (reduce16x16), the costliest part of a dot product of 64 values. */
static void qk16(const float *const *q, int64_t R, const float *k, int64_t lk, int64_t D, float *const *t, int64_t j) {
    for (int64_t r = 0; r < R; r++) {
        v16 acc[16];
        _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) { /* key by key: the rows read in order */
            acc[c] = v_zero();
            for (int64_t d = 0; d < D; d += 16) acc[c] = v_fmadd(v_load(q[r] + d), v_load(k + c * lk + d), acc[c]);
        }
        v_store(t[r] + j, reduce16x16(acc));
    }
}
#endif

/* H probability rows p[h] (indexed by key) against the values v over keys [j0, j1), the C parts of VP_LANES
   values from d0: y[h][d0 .. d0 + C VP_LANES). Lane L holds the keys j0 + L + 16i (j0 a multiple of 16: lane
   j mod 16), each lane's fmaf chain in increasing j, then the tree over lanes, value by value: a value's chains
   and tree do not depend on how many values a call holds beside it. pvl_H_C computes lanes [L0, L1) into
   `lanes` (so that threads can share one value's lanes), pv_tree the tree over all 16, pv_H_C both. */
/* Lanes [L0, L1) of P.V, E lanes a pass (E = 1, or 2 where the arch file's registers hold 2 H C accumulators,
   H <= PV_PAIR_H; L1 - L0 a multiple of E): lanes L .. L + E - 1 read adjacent rows, so a pass reads runs of E
   rows of every 16 (one lane alone reads rows 4 KB apart). Each lane's chain is the same in either shape. */
#define PVL_ROW(H, C, e) /* lane L + e's row j + e into acc[e] */                                               \
    do {                                                                                                      \
        vp vv[C];                                                                                             \
        const float *vr = value_row(kv, j + (e)) + d0;                                                        \
        if (j + (e) + PV_AHEAD < j1) /* the hardware prefetchers do not follow rows 4 KB apart across pages */ \
            for (int c = 0; c < C * VP_LANES; c += 16) v_prefetch(value_row(kv, j + (e) + PV_AHEAD) + d0 + c); \
        for (int c = 0; c < C; c++) vv[c] = vp_load(vr + VP_LANES * c);                                       \
        for (int h = 0; h < H; h++) {                                                                         \
            const vp pp = vp_set1(p[h][j + (e)]);                                                             \
            for (int c = 0; c < C; c++) acc[e][h][c] = vp_fmadd(pp, vv[c], acc[e][h][c]);                     \
        }                                                                                                     \
    } while (0)
#define PVL_(NAME, H, C, E)                                                                                   \
    static void NAME(const float *const *p, const kv_rows *kv, int64_t j0, int64_t j1, int64_t d0, int L0,    \
                     int L1, float *lanes) {                                                                  \
        for (int L = L0; L < L1; L += E) {                                                                    \
            vp acc[E][H][C];                                                                                  \
            for (int e = 0; e < E; e++)                                                                       \
                for (int h = 0; h < H; h++)                                                                   \
                    for (int c = 0; c < C; c++) acc[e][h][c] = vp_zero();                                     \
            int64_t j = j0 + L;                                                                               \
            for (; j + E - 1 < j1; j += 16) /* every lane of the pass has its row */                          \
                _Pragma("GCC unroll 2") for (int e = 0; e < E; e++) PVL_ROW(H, C, e);                         \
            for (int e = 0; e < E - 1 && j + e < j1; e++) PVL_ROW(H, C, e); /* the first lanes' last rows */  \
            for (int e = 0; e < E; e++)                                                                       \
                for (int h = 0; h < H; h++)                                                                   \
                    for (int c = 0; c < C; c++) vp_store(lanes + (((L + e) * H + h) * C + c) * VP_LANES, acc[e][h][c]); \
        }                                                                                                     \
    }
#define PV_(H, C)                                                                                             \
    PVL_(pvl_##H##_##C, H, C, 1)                                                                              \
    static void pv_##H##_##C(const float *const *p, const kv_rows *kv, int64_t j0, int64_t j1, int64_t d0,    \
                             float *lanes, float *const *y) {                                                 \
        pvl_##H##_##C(p, kv, j0, j1, d0, 0, 16, lanes);                                                       \
        pv_tree(H, C, lanes, d0, y);                                                                          \
    }
#define PV2_(H, C) PVL_(pvl2_##H##_##C, H, C, 2)

/* The tree over the 16 lanes pvl_* left in `lanes` (H rows, C parts), value by value, into y[h][d0 ..]. */
static inline void pv_tree(int H, int C, const float *lanes, int64_t d0, float *const *y) {
    for (int h = 0; h < H; h++)
        for (int c = 0; c < C; c++) {
            vp x[16];
            for (int L = 0; L < 16; L++) x[L] = vp_load(lanes + ((L * H + h) * C + c) * VP_LANES);
            for (int L = 0; L < 8; L++) x[L] = vp_add(x[L], x[L + 8]);
            for (int L = 0; L < 4; L++) x[L] = vp_add(x[L], x[L + 4]);
            for (int L = 0; L < 2; L++) x[L] = vp_add(x[L], x[L + 2]);
            vp_store(y[h] + d0 + VP_LANES * c, vp_add(x[0], x[1]));
        }
}
#define QK(R, C) QK_(R, C) /* expands QK_C and VP_PARTS before pasting */
#define PV(H, C) PV_(H, C)
#define FN_(KIND, A, B) KIND##_##A##_##B
#define FN(KIND, A, B) FN_(KIND, A, B)

typedef void (*qk_fn)(const float *const *, const float *, int64_t, int64_t, float *const *, int64_t);
typedef void (*pv_fn)(const float *const *, const kv_rows *, int64_t, int64_t, int64_t, float *, float *const *);
typedef void (*pvl_fn)(const float *const *, const kv_rows *, int64_t, int64_t, int64_t, int, int, float *);
QK(1, QK_C) QK(2, QK_C) QK(3, QK_C) QK(4, QK_C) QK(1, 1) QK(2, 1) QK(3, 1) QK(4, 1)
PV(1, PV_WIDE_C) PV(2, PV_WIDE_C) PV(3, PV_WIDE_C) PV(4, PV_WIDE_C)
PV(1, VP_PARTS) PV(2, VP_PARTS) PV(3, VP_PARTS) PV(4, VP_PARTS)
static const qk_fn QK_WIDE[QK_R + 1] = {0, FN(qk, 1, QK_C), FN(qk, 2, QK_C), FN(qk, 3, QK_C), FN(qk, 4, QK_C)};
static const qk_fn QK_ONE[QK_R + 1] = {0, qk_1_1, qk_2_1, qk_3_1, qk_4_1};
static const pv_fn PV_WIDE[PV_H + 1] = {0, FN(pv, 1, PV_WIDE_C), FN(pv, 2, PV_WIDE_C), FN(pv, 3, PV_WIDE_C),
                                        FN(pv, 4, PV_WIDE_C)};
static const pv_fn PV_ONE[PV_H + 1] = {0, FN(pv, 1, VP_PARTS), FN(pv, 2, VP_PARTS), FN(pv, 3, VP_PARTS),
                                       FN(pv, 4, VP_PARTS)};
static const pvl_fn PVL_WIDE[PV_H + 1] = {0, FN(pvl, 1, PV_WIDE_C), FN(pvl, 2, PV_WIDE_C), FN(pvl, 3, PV_WIDE_C),
                                          FN(pvl, 4, PV_WIDE_C)};
static const pvl_fn PVL_ONE[PV_H + 1] = {0, FN(pvl, 1, VP_PARTS), FN(pvl, 2, VP_PARTS), FN(pvl, 3, VP_PARTS),
                                         FN(pvl, 4, VP_PARTS)};
#if PV_PAIR_H > 0
#define PV2(H, C) PV2_(H, C)
PV2(1, PV_WIDE_C) PV2(2, PV_WIDE_C) PV2(3, PV_WIDE_C)
static const pvl_fn PVL2_WIDE[4] = {0, FN(pvl2, 1, PV_WIDE_C), FN(pvl2, 2, PV_WIDE_C), FN(pvl2, 3, PV_WIDE_C)};
_Static_assert(PV_PAIR_H <= 3, "PVL2_WIDE holds pvl2 tiles of up to 3 rows");
#endif

/* How many wide P.V calls (PV_WIDE_VALUES values each) cover the start of D values (D a multiple of 16), the
   rest going in narrow calls of 16: the most that leave a multiple of 16. */
static inline int64_t pv_wide_calls(int64_t D) {
    int64_t a = D / PV_WIDE_VALUES;
    while (a > 0 && (D - a * PV_WIDE_VALUES) % 16) a--;
    return a;
}

/* The first value of P.V chunk c: `wide` wide calls of PV_WIDE_VALUES values first, then narrow ones of 16. */
static inline int64_t pv_chunk_start(int64_t c, int64_t wide) {
    return c < wide ? c * PV_WIDE_VALUES : wide * PV_WIDE_VALUES + (c - wide) * 16;
}

/* Query positions [i0, i0 + n) of H heads, D a multiple of 16 (t: H * ATT_PB rows of sk floats; lanes:
   16 * 4 * 4 * 16 floats, the widest P.V tile of any build). The dot products of every row over the union of the rows' ranges R (a
   score outside a row's own R is never read), then each row's softmax over its own R, then P.V per
   position over its R, its heads side by side. */
static void attend_block(const float *q, int64_t H, int64_t i0, int64_t n, int64_t D, int64_t q_hs, int64_t q_ss,
                         const kv_rows *kv, int64_t sk, const uint8_t *keep, const float *add, int64_t m_ss, float scale,
                         float *y, int64_t y_hs, int64_t y_ss, float *t, float *lanes) {
    int64_t lo[ATT_PB], hi[ATT_PB], bj0 = sk, bj1 = 0, cnt = 0;
    const int64_t nw = pv_wide_calls(D); /* P.V's wide calls per row, the same for every row */
    int has[ATT_PB];
    const float *qr[ATT_PB * H];
    float *tr[ATT_PB * H];
    for (int64_t r = 0; r < n; r++) {
        int64_t f, l;
        has[r] = kept_range(keep ? keep + (i0 + r) * m_ss : 0, sk, &f, &l);
        if (!has[r]) continue;
        lo[r] = f / 16 * 16;
        hi[r] = l + 1;
        bj0 = lo[r] < bj0 ? lo[r] : bj0;
        bj1 = hi[r] > bj1 ? hi[r] : bj1;
        for (int64_t h = 0; h < H; h++, cnt++) {
            qr[cnt] = q + h * q_hs + (i0 + r) * q_ss;
            tr[cnt] = t + (r * H + h) * sk;
        }
    }
    for (int64_t j = bj0; j < bj1;) {
        const int wide = segment_left(kv, j, bj1) >= QK_C;
        QK_PREFETCH(kv, j, bj1, D);
        for (int64_t rr = 0; rr < cnt; rr += QK_R) {
            const int64_t R = cnt - rr < QK_R ? cnt - rr : QK_R;
            (wide ? QK_WIDE : QK_ONE)[R](qr + rr, key_row(kv, j), kv->ks, D, tr + rr, j);
        }
        j += wide ? QK_C : 1;
    }
    for (int64_t r = 0; r < n; r++) {
        const float *pr[H];
        float *yr[H];
        int64_t live = 0;
        for (int64_t h = 0; h < H; h++) {
            float *out = y + h * y_hs + (i0 + r) * y_ss, *row = t + (r * H + h) * sk;
            if (has[r] && softmax_range(row, add ? add + (i0 + r) * m_ss : 0, keep ? keep + (i0 + r) * m_ss : 0, lo[r],
                                        hi[r], scale)) {
                pr[live] = row;
                yr[live++] = out;
            } else {
                memset(out, 0, (size_t)D * 4);
            }
        }
        for (int64_t h = 0; h < live; h += PV_H) {
            const int64_t Hh = live - h < PV_H ? live - h : PV_H;
            int64_t d0 = 0;
            for (int64_t c = 0; c < nw; c++, d0 += PV_WIDE_VALUES) PV_WIDE[Hh](pr + h, kv, lo[r], hi[r], d0, lanes, yr + h);
            for (; d0 < D; d0 += 16) PV_ONE[Hh](pr + h, kv, lo[r], hi[r], d0, lanes, yr + h);
        }
    }
}

/* One query position (sq == 1, a decode step) of H heads over many keys, split over `threads` where
   kv_attention's blocks of positions would give one thread all of it: the dot products by tiles of keys,
   each head's softmax, then P.V by chunks of 16 values. Every t[j] and every y[h][d] is computed by one
   thread with the operations attend_block uses (the same QK and PV tiles), so the bytes are the same; only
   which thread computes which is different. Returns -2 when scratch memory is unavailable. */
static int attend_single(const float *q, int64_t H, int64_t D, int64_t q_hs, const kv_rows *kv, int64_t sk,
                         const uint8_t *keep, const float *add, float scale, float *y, int64_t y_hs, int threads) {
    int64_t f, l;
    if (!kept_range(keep, sk, &f, &l)) {
        for (int64_t h = 0; h < H; h++) memset(y + h * y_hs, 0, (size_t)D * 4);
        return 0;
    }
    const int64_t lo = f / 16 * 16, hi = l + 1;
    float *t = malloc((size_t)H * (size_t)sk * 4);
    if (!t) return -2;
    const float *qr[64];
    float *tr[64], *yr[64];
    const float *pr[64];
    int live[64];
    for (int64_t h = 0; h < H; h++) {
        qr[h] = q + h * q_hs;
        tr[h] = t + h * sk;
        yr[h] = y + h * y_hs;
    }
    const int64_t tile = 64 / QK_C * QK_C; /* keys per share of the dot products: a multiple of QK_C (64 or 63) */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t j0 = lo; j0 < hi; j0 += tile) {
        const int64_t j1 = j0 + tile < hi ? j0 + tile : hi;
        for (int64_t j = j0; j < j1;) {
            const int wide = segment_left(kv, j, j1) >= QK_C;
            QK_PREFETCH(kv, j, j1, D);
            for (int64_t rr = 0; rr < H; rr += QK_R) {
                const int64_t R = H - rr < QK_R ? H - rr : QK_R;
                (wide ? QK_WIDE : QK_ONE)[R](qr + rr, key_row(kv, j), kv->ks, D, tr + rr, j);
            }
            j += wide ? QK_C : 1;
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t h = 0; h < H; h++) live[h] = softmax_range(tr[h], add, keep, lo, hi, scale);
    int64_t n = 0;
    for (int64_t h = 0; h < H; h++) {
        if (live[h]) {
            pr[n] = tr[h];
            yr[n++] = y + h * y_hs;
        } else {
            memset(y + h * y_hs, 0, (size_t)D * 4);
        }
    }
    const int64_t wide = pv_wide_calls(D), chunks = wide + (D - wide * PV_WIDE_VALUES) / 16;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *lanes = aligned_alloc(64, 16 * 4 * 4 * 16 * 4);
        if (!lanes) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            if (!lanes) continue;
            const int64_t d0 = pv_chunk_start(c, wide);
            for (int64_t h = 0; h < n; h += PV_H) {
                const int64_t Hh = n - h < PV_H ? n - h : PV_H;
                (c < wide ? PV_WIDE : PV_ONE)[Hh](pr + h, kv, lo, hi, d0, lanes, yr + h);
            }
        }
        free(lanes);
    }
    free(t);
    return failed ? -2 : 0;
}

/* A decode step's attention over all G key/value heads of a layer at once, in one parallel region: group g's H
   query rows at q + (g H + h) D (one position each), its keys and values kv[g] (n keys, every one kept), its
   outputs at y + (g H + h) D; D a multiple of 16. The dot products by (group, tile of keys), each row's
   softmax, P.V by (group, chunk of values, heads, a quarter of the 16 lanes), then each value's tree over its
   lanes: every t[j], every lane's chain and every tree is computed by one thread with attend_single's
   operations and tiles, so the bytes are attend_single's, group by group; what changes is that the work of
   every group is shared by the threads (a group of 3 heads of 64 values over 2,048 keys was below
   attend_single's split and ran on one thread, three groups one after the other). Returns -2 when scratch
   memory is unavailable. */
#define STEP_LANE_SHARES 4 /* lanes 0-3, 4-7, 8-11, 12-15 */
static int attend_step(const float *q, int64_t G, int64_t H, int64_t D, const kv_rows *kv, int64_t n, float scale,
                       float *y, int threads) {
    if (G <= 0 || H <= 0 || H > 64 || D % 16 || n <= 0) return -1;
    const int64_t tile = 64 / QK_C * QK_C, tiles = (n + tile - 1) / tile;
    const int64_t wide = pv_wide_calls(D), chunks = wide + (D - wide * PV_WIDE_VALUES) / 16;
    const int64_t hgroups = (H + PV_H - 1) / PV_H, per_lanes = 16 * PV_H * PV_WIDE_C * VP_LANES;
    const int64_t pv_tasks = G * chunks * hgroups;
    float *t = malloc((size_t)(G * H) * (size_t)n * 4);
    float *lanes = aligned_alloc(64, (size_t)(pv_tasks * per_lanes * 4));
    int *live = malloc((size_t)(G * H) * sizeof(int));
    if (!t || !lanes || !live) {
        free(t);
        free(lanes);
        free(live);
        return -2;
    }
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
#pragma omp for schedule(static)
        for (int64_t task = 0; task < G * tiles; task++) {
            const int64_t g = task / tiles, j0 = task % tiles * tile, j1 = j0 + tile < n ? j0 + tile : n;
            const float *qr[64];
            float *tr[64];
            for (int64_t h = 0; h < H; h++) {
                qr[h] = q + (g * H + h) * D;
                tr[h] = t + (g * H + h) * n;
            }
            for (int64_t j = j0; j < j1;) {
#ifdef KV_REDUCE16X16
                if (segment_left(&kv[g], j, j1) >= 16) { /* no prefetch: the rows are read in order, which the
                                                            hardware follows (asking ahead measured slower) */
                    qk16(qr, H, key_row(&kv[g], j), kv[g].ks, D, tr, j);
                    j += 16;
                    continue;
                }
#endif
                const int w = segment_left(&kv[g], j, j1) >= QK_C;
                QK_PREFETCH(&kv[g], j, j1, D);
                for (int64_t rr = 0; rr < H; rr += QK_R) {
                    const int64_t R = H - rr < QK_R ? H - rr : QK_R;
                    (w ? QK_WIDE : QK_ONE)[R](qr + rr, key_row(&kv[g], j), kv[g].ks, D, tr + rr, j);
                }
                j += w ? QK_C : 1;
            }
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < G * H; r++) live[r] = softmax_range(t + r * n, 0, 0, 0, n, scale);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < pv_tasks * STEP_LANE_SHARES; task++) {
            const int64_t pt = task / STEP_LANE_SHARES, share = task % STEP_LANE_SHARES;
            const int64_t g = pt / (chunks * hgroups), c = pt / hgroups % chunks, h0 = pt % hgroups * PV_H;
            const int64_t Hh = H - h0 < PV_H ? H - h0 : PV_H;
            const int64_t d0 = pv_chunk_start(c, wide);
            const float *pr[PV_H];
            for (int64_t h = 0; h < Hh; h++) pr[h] = t + (g * H + h0 + h) * n;
            const int L0 = (int)share * (16 / STEP_LANE_SHARES);
#if PV_PAIR_H > 0
            if (c < wide && Hh <= PV_PAIR_H) { /* two lanes a pass */
                PVL2_WIDE[Hh](pr, &kv[g], 0, n, d0, L0, L0 + 16 / STEP_LANE_SHARES, lanes + pt * per_lanes);
                continue;
            }
#endif
            (c < wide ? PVL_WIDE : PVL_ONE)[Hh](pr, &kv[g], 0, n, d0, L0, L0 + 16 / STEP_LANE_SHARES, lanes + pt * per_lanes);
        }
#pragma omp for schedule(static)
        for (int64_t pt = 0; pt < pv_tasks; pt++) {
            const int64_t g = pt / (chunks * hgroups), c = pt / hgroups % chunks, h0 = pt % hgroups * PV_H;
            const int64_t Hh = H - h0 < PV_H ? H - h0 : PV_H;
            const int64_t d0 = pv_chunk_start(c, wide);
            float *yr[PV_H];
            for (int64_t h = 0; h < Hh; h++) yr[h] = y + (g * H + h0 + h) * D;
            pv_tree((int)Hh, (int)(c < wide ? PV_WIDE_C : VP_PARTS), lanes + pt * per_lanes, d0, yr);
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < G * H; r++)
            if (!live[r]) memset(y + r * D, 0, (size_t)D * 4); /* as attend_single: no row is live without a finite max */
    }
    free(t);
    free(lanes);
    free(live);
    return 0;
}

/* Attention of H query heads that share one key/value head: q row (h, i) at q + h q_hs + i q_ss (D values,
   contiguous), key j at k + j k_ss, value j at v + j v_ss, output row (h, i) at y + h y_hs + i y_ss; the
   mask row of position i (shared by the heads) at keep + i m_ss (uint8, 1: attend) or add + i m_ss (float,
   added to the scaled score), or neither (every key). The definition above for every row; `reference` 1
   computes it one operation at a time (attend_row_ref), as every build does where D is not a multiple of 16. Blocks of
   positions are split over `threads`; that never changes a byte. `attention` takes the keys and values in
   segments (kv_rows), kv_attention in one. */
static int attention(const float *q, int64_t H, int64_t sq, int64_t D, int64_t q_hs, int64_t q_ss, const kv_rows *kv,
                     int64_t sk, const uint8_t *keep, const float *add, int64_t m_ss, float scale, float *y, int64_t y_hs,
                     int64_t y_ss, int threads, int reference) {
    if (H <= 0 || H > 64 || sq < 0 || D <= 0 || sk <= 0 || (keep && add)) return -1;
    const int vector = !reference && D % 16 == 0;
    if (vector && sq == 1 && threads > 1 && (double)sk * (double)(D * H) >= 16.0 * SPLIT_MIN) /* 512 keys of 4 x 256 */
        return attend_single(q, H, D, q_hs, kv, sk, keep, add, scale, y, y_hs, threads);
    /* A short prompt (a question after a restore) in blocks of equal size, one per thread, rather than 16
       positions and a remainder: 17 positions were 16 on one thread and 1 on the other. */
    const int64_t pb = threads > 1 && sq <= ATT_PB * threads ? (sq + threads - 1) / threads : ATT_PB;
    const int64_t blocks = (sq + pb - 1) / pb;
    int failed = 0;
    const int team = threads < 1 ? 1 : threads > blocks ? (int)blocks : threads; /* no thread without a block */
#pragma omp parallel num_threads(team) if (team > 1 && (double)sq * (double)sk * (double)(D * H) >= 4.0 * SPLIT_MIN * 16)
    {
        float *t = malloc((size_t)(H * ATT_PB) * (size_t)sk * 4);
        float *lanes = aligned_alloc(64, 16 * 4 * 4 * 16 * 4);
        if (!t || !lanes) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < blocks; b++) {
            if (!t || !lanes) continue;
            const int64_t i0 = b * pb, n = sq - i0 < pb ? sq - i0 : pb;
            if (vector) {
                attend_block(q, H, i0, n, D, q_hs, q_ss, kv, sk, keep, add, m_ss, scale, y, y_hs, y_ss, t, lanes);
                continue;
            }
            for (int64_t i = i0; i < i0 + n; i++)
                for (int64_t h = 0; h < H; h++)
                    attend_row_ref(q + h * q_hs + i * q_ss, D, kv, sk, keep ? keep + i * m_ss : 0,
                                   add ? add + i * m_ss : 0, scale, y + h * y_hs + i * y_ss, t);
        }
        free(t);
        free(lanes);
    }
    return failed ? -2 : 0;
}

int kv_attention(const float *q, int64_t H, int64_t sq, int64_t D, int64_t q_hs, int64_t q_ss, const float *k,
                 int64_t k_ss, const float *v, int64_t v_ss, int64_t sk, const uint8_t *keep, const float *add,
                 int64_t m_ss, float scale, float *y, int64_t y_hs, int64_t y_ss, int threads, int reference) {
    const kv_rows kv = {k, v, k, v, k_ss, v_ss, INT64_MAX};
    return attention(q, H, sq, D, q_hs, q_ss, &kv, sk, keep, add, m_ss, scale, y, y_hs, y_ss, threads, reference);
}
