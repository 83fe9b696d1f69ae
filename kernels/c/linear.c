/* The products y = x @ W^T (kv_linear) written once over simd.h's primitives: the same operations as
   reference.c's definition (outputs_ref), computed on tiles of outputs side by side, with the weights
   expanded into a panel of float32 rows or in registers as they are read. Which outputs share a tile, how
   the rows are split over threads and which build runs change no byte (tests/test_fma16.py). */

/* The expansion of dequant_row_ref with vectors: the same operations on 16 values at a time. */
static void dequant_row(int fmt, const uint8_t *src, int64_t K, float *dst) {
    if (fmt == FMT_F32) {
        memcpy(dst, src, (size_t)K * 4);
    } else if (fmt == FMT_Q8_0) {
        for (int64_t b = 0; b < K / 32; b++, src += 34) {
            const v16 d = v_set1(h2f(src));
            v_store(dst + b * 32, v_mul(d, q_i8(src + 2)));
            v_store(dst + b * 32 + 16, v_mul(d, q_i8(src + 18)));
        }
    } else if (fmt == FMT_Q5_0) {
        for (int64_t b = 0; b < K / 32; b++, src += 22) {
            const v16 d = v_set1(h2f(src));
            uint32_t qh = (uint32_t)src[2] | ((uint32_t)src[3] << 8) | ((uint32_t)src[4] << 16) | ((uint32_t)src[5] << 24);
            v_store(dst + b * 32, v_mul(d, q_q5(src + 6, 0, qh & 0xFFFF)));
            v_store(dst + b * 32 + 16, v_mul(d, q_q5(src + 6, 1, qh >> 16)));
        }
    } else if (fmt == FMT_Q4_K) {
        for (int64_t b = 0; b < K / 256; b++, src += 144) {
            float d = h2f(src), dmin = h2f(src + 2);
            const uint8_t *scales = src + 4, *qs = src + 16;
            for (int c = 0; c < 4; c++) {
                int sc0, m0, sc1, m1;
                q4k_scale_min(scales, 2 * c, &sc0, &m0);
                q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
                const v16 d0 = v_set1(d * (float)sc0), dm0 = v_set1(dmin * (float)m0);
                const v16 d1 = v_set1(d * (float)sc1), dm1 = v_set1(dmin * (float)m1);
                for (int h = 0; h < 2; h++) {
                    const uint8_t *q = qs + 32 * c + 16 * h;
                    v_store(dst + b * 256 + 64 * c + 16 * h, v_sub(v_mul(d0, q_nibbles(q, 0)), dm0));
                    v_store(dst + b * 256 + 64 * c + 32 + 16 * h, v_sub(v_mul(d1, q_nibbles(q, 1)), dm1));
                }
            }
        }
    } else if (fmt == FMT_Q4_0) { /* q - 8 and q + 16 below are exact: small integers */
        for (int64_t b = 0; b < K / 32; b++, src += 18) {
            const v16 d = v_set1(h2f(src)), eight = v_set1(8.0f);
            v_store(dst + b * 32, v_mul(d, v_sub(q_nibbles(src + 2, 0), eight)));
            v_store(dst + b * 32 + 16, v_mul(d, v_sub(q_nibbles(src + 2, 1), eight)));
        }
    } else if (fmt == FMT_Q4_1 || fmt == FMT_Q5_1) { /* d * q + m: a product, then a sum */
        const int five = fmt == FMT_Q5_1, step = five ? 24 : 20;
        for (int64_t b = 0; b < K / 32; b++, src += step) {
            const v16 d = v_set1(h2f(src)), m = v_set1(h2f(src + 2)), sixteen = v_set1(16.0f);
            if (five) {
                uint32_t qh = (uint32_t)src[4] | ((uint32_t)src[5] << 8) | ((uint32_t)src[6] << 16) | ((uint32_t)src[7] << 24);
                v_store(dst + b * 32, v_add(v_mul(d, v_add(q_q5(src + 8, 0, qh & 0xFFFF), sixteen)), m));
                v_store(dst + b * 32 + 16, v_add(v_mul(d, v_add(q_q5(src + 8, 1, qh >> 16), sixteen)), m));
            } else {
                v_store(dst + b * 32, v_add(v_mul(d, q_nibbles(src + 4, 0)), m));
                v_store(dst + b * 32 + 16, v_add(v_mul(d, q_nibbles(src + 4, 1)), m));
            }
        }
    } else if (fmt == FMT_Q5_K) {
        for (int64_t b = 0; b < K / 256; b++, src += 176) {
            float d = h2f(src), dmin = h2f(src + 2);
            const uint8_t *scales = src + 4, *qh = src + 16, *qs = src + 48;
            const v16 sixteen = v_set1(16.0f);
            for (int c = 0; c < 4; c++) {
                int sc0, m0, sc1, m1;
                q4k_scale_min(scales, 2 * c, &sc0, &m0);
                q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
                const v16 d0 = v_set1(d * (float)sc0), dm0 = v_set1(dmin * (float)m0);
                const v16 d1 = v_set1(d * (float)sc1), dm1 = v_set1(dmin * (float)m1);
                for (int h = 0; h < 2; h++) {
                    uint32_t lo = 0, hi = 0; /* bit j: the high bit of value 16h + j of sub-blocks 2c and 2c + 1 */
                    for (int j = 0; j < 16; j++) {
                        lo |= (uint32_t)((qh[16 * h + j] >> (2 * c)) & 1) << j;
                        hi |= (uint32_t)((qh[16 * h + j] >> (2 * c + 1)) & 1) << j;
                    }
                    const uint8_t *q = qs + 32 * c + 16 * h;
                    v_store(dst + b * 256 + 64 * c + 16 * h, v_sub(v_mul(d0, v_add(q_q5(q, 0, lo), sixteen)), dm0));
                    v_store(dst + b * 256 + 64 * c + 32 + 16 * h, v_sub(v_mul(d1, v_add(q_q5(q, 1, hi), sixteen)), dm1));
                }
            }
        }
    } else if (fmt != FMT_Q6_K) { /* F16 and BF16: one exact conversion per value, the reference's plain C */
        dequant_row_ref(fmt, src, K, dst);
    } else {
        for (int64_t b = 0; b < K / 256; b++, src += 210) {
            const uint8_t *ql = src, *qh = src + 128;
            const int8_t *sc = (const int8_t *)(src + 192);
            float d = h2f(src + 208);
            for (int c = 0; c < 16; c++) { /* 16 weights at i = 16c: one scale */
                int h = c / 8, t = (c % 8) * 16;
                const v16 q = q_q6(ql + h * 64 + t % 64, 4 * (t / 64), qh + h * 32 + t % 32, 2 * (t / 32));
                v_store(dst + b * 256 + 16 * c, v_mul(v_set1(d * (float)sc[c]), q));
            }
        }
    }
}

/* MB rows of x against RB rows of a panel (float32, each padded with zeros to Kp, a multiple of 16), one part
   of the 16 lanes at a time (simd.h: the whole v16, or lanes 0-7 then 8-15): each lane's fmaf chain over all
   of K is the one a v16 accumulator holds, in the same order, and the parts meet in reduce16. */
#define TILE_(MB, RB)                                                                                         \
    static void tile_##MB##_##RB(const float *x, int64_t ldx, const float *w, int64_t Kp, int64_t K, float *y, \
                                 int64_t ldy) {                                                               \
        vp part[VP_PARTS][MB][RB];                                                                            \
        for (int h = 0; h < VP_PARTS; h++) {                                                                  \
            vp acc[MB][RB];                                                                                   \
            for (int m = 0; m < MB; m++)                                                                      \
                for (int r = 0; r < RB; r++) acc[m][r] = vp_zero();                                           \
            int64_t k = 0;                                                                                    \
            for (; k + 16 <= K; k += 16) {                                                                    \
                vp wv[RB];                                                                                    \
                for (int r = 0; r < RB; r++) wv[r] = vp_load(w + r * Kp + k + VP_LANES * h);                  \
                for (int m = 0; m < MB; m++) {                                                                \
                    const vp xv = vp_load(x + m * ldx + k + VP_LANES * h);                                    \
                    for (int r = 0; r < RB; r++) acc[m][r] = vp_fmadd(xv, wv[r], acc[m][r]);                  \
                }                                                                                             \
            }                                                                                                 \
            if (k < K) { /* the ragged tail: x read as 0 past K (the panel's rows are zero there) */          \
                vp wv[RB];                                                                                    \
                for (int r = 0; r < RB; r++) wv[r] = vp_load(w + r * Kp + k + VP_LANES * h);                  \
                for (int m = 0; m < MB; m++) {                                                                \
                    const vp xv = v_part(v_load_first(x + m * ldx + k, K - k), h);                            \
                    for (int r = 0; r < RB; r++) acc[m][r] = vp_fmadd(xv, wv[r], acc[m][r]);                  \
                }                                                                                             \
            }                                                                                                 \
            for (int m = 0; m < MB; m++)                                                                      \
                for (int r = 0; r < RB; r++) part[h][m][r] = acc[m][r];                                       \
        }                                                                                                     \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(v_join(part[0][m][r], part[VP_PARTS - 1][m][r])); \
    }
#define TILE(MB, RB) TILE_(MB, RB) /* expands PANEL_RB and ROW_RB before pasting */
#define TILE_FN_(MB, RB) tile_##MB##_##RB
#define TILE_FN(MB, RB) TILE_FN_(MB, RB)

/* Tile shapes: how many rows of x (PANEL_MB) and of a panel (PANEL_RB, from the arch file; ROW_RB for one row
   of x) a call holds side by side. They decide which outputs are computed together, never how one is. */
#define PANEL_MB 4
#define ROW_RB 8
typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t);
TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1)
TILE(1, PANEL_RB) TILE(2, PANEL_RB) TILE(3, PANEL_RB) TILE(4, PANEL_RB)
TILE(1, ROW_RB)
static const tile_fn TILES1[PANEL_MB + 1] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};
static const tile_fn TILESR[PANEL_MB + 1] = {0, TILE_FN(1, PANEL_RB), TILE_FN(2, PANEL_RB), TILE_FN(3, PANEL_RB),
                                             TILE_FN(4, PANEL_RB)};
#define tile_1_row TILE_FN(1, ROW_RB)

/* Sixteen weights of a row, W[n][k0..k0+15] (k0 a multiple of 16), expanded in registers: the same operations
   as dequant_row on the same values. One per format with a fused product; off_* says where those bytes start
   (the prefetches ask for them two row groups ahead). */
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline v16 w16_f32(const uint8_t *row, int64_t k0) { return v_load((const float *)row + k0); }

static inline v16 w16_q8_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 34;
    return v_mul(v_set1(h2f(blk)), q_i8(blk + 2 + (k0 % 32)));
}

static inline v16 w16_q5_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 22;
    const int high = (k0 % 32) != 0;
    const uint32_t qh = rd32(blk + 2);
    return v_mul(v_set1(h2f(blk)), q_q5(blk + 6, high, high ? qh >> 16 : qh & 0xFFFF));
}

static inline v16 w16_q4_0(const uint8_t *row, int64_t k0) { /* d * (q - 8) */
    const uint8_t *blk = row + (k0 / 32) * 18;
    return v_mul(v_set1(h2f(blk)), v_sub(q_nibbles(blk + 2, (k0 % 32) != 0), v_set1(8.0f)));
}

static inline v16 w16_q4_1(const uint8_t *row, int64_t k0) { /* d * q + m */
    const uint8_t *blk = row + (k0 / 32) * 20;
    return v_add(v_mul(v_set1(h2f(blk)), q_nibbles(blk + 4, (k0 % 32) != 0)), v_set1(h2f(blk + 2)));
}

static inline v16 w16_q5_1(const uint8_t *row, int64_t k0) { /* d * (q5 + 16 - 16 ...): dequant_row's q_q5 + 16 */
    const uint8_t *blk = row + (k0 / 32) * 24;
    const int high = (k0 % 32) != 0;
    const uint32_t qh = rd32(blk + 4);
    const v16 q = v_add(q_q5(blk + 8, high, high ? qh >> 16 : qh & 0xFFFF), v_set1(16.0f));
    return v_add(v_mul(v_set1(h2f(blk)), q), v_set1(h2f(blk + 2)));
}

/* Q4_K: 16 values of sub-block s (32 values each, one scale and min) at 16 h within it */
static inline v16 w16_q4_k(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 256) * 144;
    const int i = (int)(k0 % 256), c = i / 64, hi = (i % 64) >= 32, h = (i % 32) / 16;
    int sc, m;
    q4k_scale_min(blk + 4, 2 * c + hi, &sc, &m);
    const v16 ds = v_set1(h2f(blk) * (float)sc), dm = v_set1(h2f(blk + 2) * (float)m);
    return v_sub(v_mul(ds, q_nibbles(blk + 16 + 32 * c + 16 * h, hi)), dm);
}

static inline v16 w16_q5_k(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 256) * 176, *qh = blk + 16;
    const int i = (int)(k0 % 256), c = i / 64, hi = (i % 64) >= 32, h = (i % 32) / 16, s = 2 * c + hi;
    int sc, m;
    q4k_scale_min(blk + 4, s, &sc, &m);
    uint32_t bits = 0; /* bit j: the high bit of value 16h + j of sub-block s */
    for (int j = 0; j < 16; j++) bits |= (uint32_t)((qh[16 * h + j] >> s) & 1) << j;
    const v16 ds = v_set1(h2f(blk) * (float)sc), dm = v_set1(h2f(blk + 2) * (float)m);
    return v_sub(v_mul(ds, v_add(q_q5(blk + 48 + 32 * c + 16 * h, hi, bits), v_set1(16.0f))), dm);
}

static inline v16 w16_q6_k(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 256) * 210;
    const int c = (int)(k0 % 256) / 16, h = c / 8, t = (c % 8) * 16;
    const v16 q = q_q6(blk + h * 64 + t % 64, 4 * (t / 64), blk + 128 + h * 32 + t % 32, 2 * (t / 32));
    return v_mul(v_set1(h2f(blk + 208) * (float)((const int8_t *)blk)[192 + c]), q);
}

static inline int64_t off_f32(int64_t k) { return 4 * k; }
static inline int64_t off_q8_0(int64_t k) { return k / 32 * 34; }
static inline int64_t off_q5_0(int64_t k) { return k / 32 * 22; }
static inline int64_t off_q4_0(int64_t k) { return k / 32 * 18; }
static inline int64_t off_q4_1(int64_t k) { return k / 32 * 20; }
static inline int64_t off_q5_1(int64_t k) { return k / 32 * 24; }
static inline int64_t off_q4_k(int64_t k) { return k / 256 * 144; }
static inline int64_t off_q5_k(int64_t k) { return k / 256 * 176; }
static inline int64_t off_q6_k(int64_t k) { return k / 256 * 210; }

/* One output row of x (M == 1) against RB weight rows, the weights expanded as they are read. */
#define FUSED(NAME, RB)                                                                                       \
    static void fused_##NAME##_##RB(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {      \
        v16 acc[RB];                                                                                          \
        for (int r = 0; r < RB; r++) acc[r] = v_zero();                                                       \
        for (int64_t k = 0; k < K; k += 16) {                                                                 \
            v16 xv = v_load(x + k);                                                                           \
            for (int r = 0; r < RB; r++) {                                                                    \
                v_prefetch(w + (r + 2 * RB) * rb + off_##NAME(k));                                              \
                acc[r] = v_fmadd(xv, w16_##NAME(w + r * rb, k), acc[r]);                                      \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < RB; r++) y[r] = reduce16(acc[r]);                                                 \
    }
FUSED(f32, 8) FUSED(f32, 1) FUSED(q8_0, 1) FUSED(q5_0, 1)
FUSED(q4_0, 1) FUSED(q4_1, 1) FUSED(q5_1, 1) FUSED(q4_k, 1) FUSED(q5_k, 1) FUSED(q6_k, 1)

/* The 32-value formats against 8 rows, a block (two chunks of 16) at a time: a row's scales are read once a
   block. X32_* expands a block's 32 values into two registers, the same operations as its w16_*. */
static inline void x32_q8_0(const uint8_t *b, v16 *lo, v16 *hi) {
    const v16 d = v_set1(h2f(b));
    *lo = v_mul(d, q_i8(b + 2)), *hi = v_mul(d, q_i8(b + 18));
}
static inline void x32_q5_0(const uint8_t *b, v16 *lo, v16 *hi) {
    const v16 d = v_set1(h2f(b));
    const uint32_t qh = rd32(b + 2);
    *lo = v_mul(d, q_q5(b + 6, 0, qh & 0xFFFF)), *hi = v_mul(d, q_q5(b + 6, 1, qh >> 16));
}
/* The 4-bit formats: the 16 values a block's nibbles can stand for, each computed by its w16_* operations,
   then picked by the nibbles (q_lut): two operations per value fewer, the same bits. */
static inline v16 v_iota16(void) {
    static const float iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return v_load(iota);
}
static inline void x32_q4_0(const uint8_t *b, v16 *lo, v16 *hi) {
    const v16 t = v_mul(v_set1(h2f(b)), v_sub(v_iota16(), v_set1(8.0f)));
    *lo = q_lut(t, b + 2, 0), *hi = q_lut(t, b + 2, 1);
}
static inline void x32_q4_1(const uint8_t *b, v16 *lo, v16 *hi) {
    const v16 t = v_add(v_mul(v_set1(h2f(b)), v_iota16()), v_set1(h2f(b + 2)));
    *lo = q_lut(t, b + 4, 0), *hi = q_lut(t, b + 4, 1);
}
static inline void x32_q5_1(const uint8_t *b, v16 *lo, v16 *hi) {
    const v16 d = v_set1(h2f(b)), m = v_set1(h2f(b + 2)), sixteen = v_set1(16.0f);
    const uint32_t qh = rd32(b + 4);
    *lo = v_add(v_mul(d, v_add(q_q5(b + 8, 0, qh & 0xFFFF), sixteen)), m);
    *hi = v_add(v_mul(d, v_add(q_q5(b + 8, 1, qh >> 16), sixteen)), m);
}
#define FUSED32_8(NAME, BYTES)                                                                                \
    static void fused_##NAME##_8(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {         \
        v16 acc[8];                                                                                          \
        for (int r = 0; r < 8; r++) acc[r] = v_zero();                                                       \
        for (int64_t k = 0; k < K; k += 32) {                                                                \
            const v16 x0 = v_load(x + k), x1 = v_load(x + k + 16);                                           \
            const uint8_t *blk = w + (k / 32) * (BYTES);                                                     \
            _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++, blk += rb) {                                 \
                v_prefetch(blk + 16 * rb); /* two groups of 8 rows ahead */                                  \
                v16 lo, hi;                                                                                  \
                x32_##NAME(blk, &lo, &hi);                                                                   \
                acc[r] = v_fmadd(x0, lo, acc[r]);                                                            \
                acc[r] = v_fmadd(x1, hi, acc[r]);                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int r = 0; r < 8; r++) y[r] = reduce16(acc[r]);                                                 \
    }
FUSED32_8(q8_0, 34) FUSED32_8(q5_0, 22) FUSED32_8(q4_0, 18) FUSED32_8(q4_1, 20) FUSED32_8(q5_1, 24)

/* The 256-value formats against 8 rows, a block at a time: each row's block prepared once (prep256_*: its scales
   decoded, and what its chunks need written to memory), then chunk c = 0..15 in order (chunk256_*: the operations
   of its w16_* on the same values) of FUSED256_RB rows side by side, so that their fmaf chains interleave. What
   the preparation wrote is read back from memory (KV_FROM_MEMORY): a scale is broadcast by a load, bytes are
   widened as they are loaded. */
typedef struct { /* Q4_K: d * sc[s] in lanes 0-7 of ds, dmin * m[s] in lanes 8-15 of dm (w16_q4_k's products) */
    _Alignas(64) float ds[16], dm[16];
} st_q4_k;
static inline void prep256_q4_k(const uint8_t *blk, st_q4_k *st) {
    const v16 q = q_k4scales(blk + 4);
    v_store(st->ds, v_mul(v_set1(h2f(blk)), q));
    v_store(st->dm, v_mul(v_set1(h2f(blk + 2)), q));
}
/* chunk c = 4 c4 + 2 hi + h: sub-block s = 2 c4 + hi, the low (hi 0) or high nibbles of bytes 32 c4 + 16 h. Where
   q_lut is one permute (KV_LUT16), the 16 values the nibbles stand for, d * sc[s] * j - dmin * m[s], are computed
   (once for the sub-block's two chunks: the compiler keeps them) and picked; else each lane computes its own. */
static inline v16 chunk256_q4_k(const st_q4_k *st, const uint8_t *blk, int c) {
    const int s = c / 2;
    const uint8_t *q = blk + 16 + 32 * (c / 4) + 16 * (c % 2);
    const v16 ds = v_set1(st->ds[s]), dm = v_set1(st->dm[8 + s]);
#if KV_LUT16
    return q_lut(v_sub(v_mul(ds, v_iota16()), dm), q, s % 2);
#else
    return v_sub(v_mul(ds, q_nibbles(q, s % 2)), dm);
#endif
}
typedef struct { /* Q6_K: the 256 values q - 32 as signed bytes, and the 16 products d * sc[c] (w16_q6_k's) */
    _Alignas(64) int8_t q[256];
    _Alignas(64) float ds[16];
} st_q6_k;
static inline void prep256_q6_k(const uint8_t *blk, st_q6_k *st) {
    q_q6x128(blk, blk + 128, st->q);
    q_q6x128(blk + 64, blk + 160, st->q + 128);
    v_store(st->ds, v_mul(v_set1(h2f(blk + 208)), q_i8(blk + 192)));
}
static inline v16 chunk256_q6_k(const st_q6_k *st, const uint8_t *blk, int c) {
    (void)blk;
    return v_mul(v_set1(st->ds[c]), q_i8((const uint8_t *)st->q + 16 * c));
}
#define FUSED256_8(NAME, BYTES)                                                                               \
    static void fused_##NAME##_8(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {         \
        v16 acc[8];                                                                                          \
        st_##NAME st[8];                                                                                     \
        for (int r = 0; r < 8; r++) acc[r] = v_zero();                                                       \
        for (int64_t k = 0; k < K; k += 256) {                                                               \
            const uint8_t *blk = w + (k / 256) * (BYTES);                                                    \
            for (int r = 0; r < 8; r++) {                                                                    \
                for (int l = 0; l < (BYTES); l += 64) v_prefetch(blk + r * rb + 16 * rb + l);                \
                prep256_##NAME(blk + r * rb, &st[r]);                                                        \
            }                                                                                                \
            KV_FROM_MEMORY();                                                                                \
            for (int r0 = 0; r0 < 8; r0 += FUSED256_RB)                                                      \
                _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) {                                      \
                    const v16 xv = v_load(x + k + 16 * c);                                                   \
                    _Pragma("GCC unroll 8") for (int r = r0; r < r0 + FUSED256_RB; r++)                      \
                        acc[r] = v_fmadd(xv, chunk256_##NAME(&st[r], blk + r * rb, c), acc[r]);              \
                }                                                                                            \
        }                                                                                                    \
        for (int r = 0; r < 8; r++) y[r] = reduce16(acc[r]);                                                 \
    }
FUSED256_8(q4_k, 144) FUSED256_8(q6_k, 210)
FUSED(q5_k, 8)
/* MB rows of x against RB weight rows (MB <= FUSEDM_TOP, RB <= 2), the weights expanded in registers: for
   few rows of x, expanding a weight again per block of rows costs less than a round trip through a panel. */
#define FUSEDM(NAME, MB, RB)                                                                                     \
    static void fusedm_##NAME##_##MB##_##RB(const float *x, int64_t ldx, const uint8_t *w, int64_t rb,         \
                                            int64_t K, float *y, int64_t ldy) {                                \
        v16 acc[MB][RB];                                                                                       \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero();                                                 \
        for (int64_t k = 0; k < K; k += 16) {                                                                  \
            v16 wv[RB];                                                                                        \
            for (int r = 0; r < RB; r++) {                                                                     \
                v_prefetch(w + (r + 2 * RB) * rb + off_##NAME(k));                                              \
                wv[r] = w16_##NAME(w + r * rb, k);                                                             \
            }                                                                                                  \
            for (int m = 0; m < MB; m++) {                                                                     \
                const v16 xv = v_load(x + m * ldx + k);                                                        \
                for (int r = 0; r < RB; r++) acc[m][r] = v_fmadd(xv, wv[r], acc[m][r]);                        \
            }                                                                                                  \
        }                                                                                                      \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]);                                \
    }
/* The same for the 256-value formats, a block at a time: each weight row's block prepared once (prep256_*), then
   its 16 chunks in order (chunk256_*), as the 1-row kernel. */
#define FUSEDM256(NAME, MB, RB)                                                                                  \
    static void fusedm_##NAME##_##MB##_##RB(const float *x, int64_t ldx, const uint8_t *w, int64_t rb,         \
                                            int64_t K, float *y, int64_t ldy) {                                \
        v16 acc[MB][RB];                                                                                       \
        st_##NAME st[RB];                                                                                      \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero();                                                 \
        for (int64_t k = 0; k < K; k += 256) {                                                                 \
            const uint8_t *blk = w + off_##NAME(k);                                                            \
            for (int r = 0; r < RB; r++) {                                                                     \
                for (int64_t l = 0; l < off_##NAME(256); l += 64) v_prefetch(blk + (r + 2 * RB) * rb + l);     \
                prep256_##NAME(blk + r * rb, &st[r]);                                                          \
            }                                                                                                  \
            KV_FROM_MEMORY();                                                                                  \
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) {                                            \
                v16 wv[RB];                                                                                    \
                for (int r = 0; r < RB; r++) wv[r] = chunk256_##NAME(&st[r], blk + r * rb, c);                \
                for (int m = 0; m < MB; m++) {                                                                 \
                    const v16 xv = v_load(x + m * ldx + k + 16 * c);                                           \
                    for (int r = 0; r < RB; r++) acc[m][r] = v_fmadd(xv, wv[r], acc[m][r]);                    \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]);                                \
    }
/* KERNEL (FUSEDM or FUSEDM256) for every tile, and the loop over tiles */
#define FUSEDM_ALL_(KERNEL, NAME)                                                                               \
    KERNEL(NAME, 8, 2) KERNEL(NAME, 4, 2) KERNEL(NAME, 2, 2) KERNEL(NAME, 1, 2)                                 \
    KERNEL(NAME, 8, 1) KERNEL(NAME, 4, 1) KERNEL(NAME, 2, 1) KERNEL(NAME, 1, 1)                                 \
    static void fusedm_##NAME(const float *x, int64_t M, int64_t ldx, const uint8_t *w, int64_t rb, int64_t K,  \
                              int64_t n0, int64_t n1, float *y, int64_t ldy) {                                  \
        for (int64_t n = n0; n < n1;) {                                                                        \
            const int two = n + 2 <= n1;                                                                       \
            for (int64_t m = 0; m < M;) {                                                                      \
                const int64_t left = M - m;                                                                    \
                const float *xm = x + m * ldx;                                                                 \
                float *ym = y + m * ldy + n;                                                                   \
                const uint8_t *wn = w + n * rb;                                                                \
                if (FUSEDM_TOP >= 8 && left >= 8) {                                                            \
                    (two ? fusedm_##NAME##_8_2 : fusedm_##NAME##_8_1)(xm, ldx, wn, rb, K, ym, ldy);            \
                    m += 8;                                                                                    \
                } else if (left >= 4) {                                                                        \
                    (two ? fusedm_##NAME##_4_2 : fusedm_##NAME##_4_1)(xm, ldx, wn, rb, K, ym, ldy);            \
                    m += 4;                                                                                    \
                } else if (left >= 2) {                                                                        \
                    (two ? fusedm_##NAME##_2_2 : fusedm_##NAME##_2_1)(xm, ldx, wn, rb, K, ym, ldy);            \
                    m += 2;                                                                                    \
                } else {                                                                                       \
                    (two ? fusedm_##NAME##_1_2 : fusedm_##NAME##_1_1)(xm, ldx, wn, rb, K, ym, ldy);            \
                    m += 1;                                                                                    \
                }                                                                                              \
            }                                                                                                  \
            n += two ? 2 : 1;                                                                                  \
        }                                                                                                      \
    }
#define FUSEDM_ALL(NAME) FUSEDM_ALL_(FUSEDM, NAME)
FUSEDM_ALL(f32) FUSEDM_ALL(q8_0) FUSEDM_ALL(q5_0) FUSEDM_ALL(q4_0) FUSEDM_ALL(q4_1) FUSEDM_ALL(q5_1)
FUSEDM_ALL_(FUSEDM256, q4_k) FUSEDM_ALL(q5_k) FUSEDM_ALL_(FUSEDM256, q6_k)

typedef void (*fusedm_fn)(const float *, int64_t, int64_t, const uint8_t *, int64_t, int64_t, int64_t, int64_t, float *,
                          int64_t);
#define FUSEDM_MAX_ROWS 8 /* up to this many rows of x: the weights expanded in registers; more: through panels */

typedef void (*fused_fn)(const float *, const uint8_t *, int64_t, int64_t, float *);

/* The fused kernels for a format (K a multiple of 16 for float32), or none: the panel path takes it (F16, BF16). */
static int fused_for(int fmt, int64_t K, fused_fn *f8, fused_fn *f1, fusedm_fn *fm) {
#define USE(NAME) { *f8 = fused_##NAME##_8; *f1 = fused_##NAME##_1; *fm = fusedm_##NAME; return 1; }
    switch (fmt) {
    case FMT_F32: if (K % 16 == 0) USE(f32) return 0;
    case FMT_Q8_0: USE(q8_0)
    case FMT_Q5_0: USE(q5_0)
    case FMT_Q4_0: USE(q4_0)
    case FMT_Q4_1: USE(q4_1)
    case FMT_Q5_1: USE(q5_1)
    case FMT_Q4_K: USE(q4_k)
    case FMT_Q5_K: USE(q5_k)
    case FMT_Q6_K: USE(q6_k)
    default: return 0;
    }
#undef USE
}


static int64_t panel_rows(int64_t Kp) {
    int64_t r = 65536 / Kp; /* about 256 KB of float32 per panel */
    r = r < 8 ? 8 : r > 64 ? 64 : r;
    return r / 8 * 8;
}

/* The end of panel p of P weight rows (the last panel may be short). */
static int64_t panel_end(int64_t p, int64_t P, int64_t N) { return N - p * P < P ? N : p * P + P; }

/* y[M][N] (row stride ldy) = x[M][K] (row stride ldx) @ W^T, W given as N rows of row_bytes in `fmt`. */
int kv_linear_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N, float *y,
                 int64_t ldy, int threads);
int kv_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
              float *y, int64_t ldy, int threads) {
    if (fmt & FMT_I8) return kv_linear_i8(x, M, K, ldx, w, fmt & ~FMT_I8, N, y, ldy, threads);
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0 || M < 0 || N < 0 || K <= 0) return -1;
    const int64_t Kp = pad16(K), P = panel_rows(Kp), panels = (N + P - 1) / P;
    fused_fn f8, f1;
    fusedm_fn fm;
    const int fused = fused_for(fmt, K, &f8, &f1, &fm);
    /* The fused paths split the outputs over the threads in groups of rows (8, the 1-row kernel's tile; 2 x 8 for
       a few rows of x), each thread a contiguous run of groups: a panel's 64 rows would leave one thread idle a
       third of a 192-row product. */
    if (fused && M > 1 && M <= FUSEDM_MAX_ROWS) {
        const int64_t groups = (N + 15) / 16;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
        for (int64_t gi = 0; gi < groups; gi++) fm(x, M, ldx, w, rb, K, gi * 16, N - gi * 16 < 16 ? N : gi * 16 + 16, y, ldy);
        return 0;
    }
    if (fused && M == 1) { /* one row: no panel, each weight is read once anyway */
        const int64_t groups = (N + 7) / 8;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
        for (int64_t gi = 0; gi < groups; gi++) {
            const int64_t n = gi * 8;
            if (n + 8 <= N)
                f8(x, w + n * rb, rb, K, y + n);
            else
                for (int64_t j = n; j < N; j++) f1(x, w + j * rb, rb, K, y + j);
        }
        return 0;
    }
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *buf = aligned_alloc(64, (size_t)(P * Kp * 4));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            if (!buf) continue;
            const int64_t n0 = p * P, rows = panel_end(p, P, N) - n0;
            for (int64_t r = 0; r < rows; r++) {
                dequant_row(fmt, w + (n0 + r) * rb, K, buf + r * Kp);
                if (Kp > K) memset(buf + r * Kp + K, 0, (size_t)(Kp - K) * 4);
            }
            if (M == 1) {
                int64_t r = 0;
                for (; r + ROW_RB <= rows; r += ROW_RB) tile_1_row(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                for (; r + PANEL_RB <= rows; r += PANEL_RB) TILE_FN(1, PANEL_RB)(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                for (; r < rows; r++) tile_1_1(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                continue;
            }
            for (int64_t m = 0; m < M; m += PANEL_MB) {
                const int64_t mb = M - m < PANEL_MB ? M - m : PANEL_MB;
                int64_t r = 0;
                for (; r + PANEL_RB <= rows; r += PANEL_RB)
                    TILESR[mb](x + m * ldx, ldx, buf + r * Kp, Kp, K, y + m * ldy + n0 + r, ldy);
                for (; r < rows; r++) TILES1[mb](x + m * ldx, ldx, buf + r * Kp, Kp, K, y + m * ldy + n0 + r, ldy);
            }
        }
        free(buf);
    }
    return failed ? -2 : 0;
}

/* W as float32 [N][K]: `vector` 1 uses the expansion this build's products use, 0 the plain C one. */
int kv_dequant(const uint8_t *w, int fmt, int64_t N, int64_t K, float *out, int vector) {
    fmt &= ~FMT_I8; /* the same blocks */
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0) return -1;
    for (int64_t n = 0; n < N; n++) (vector ? dequant_row : dequant_row_ref)(fmt, w + n * rb, K, out + n * K);
    return 0;
}
