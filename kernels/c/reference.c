/* The definition in plain C, one operation at a time: the formats' expansion, the 16-lane tree, one output of a
   product, and one query row of attention. Every build computes these the same way; the shared operations
   (linear.c, attention.c) are checked against them byte for byte by the loader and the tests.

   A product y = x @ W^T (fma16): every output y[m][n] is computed as
     16 lanes s[0..15] = +0.0;
     for k0 = 0, 16, 32, ... < K rounded up to 16:        (x and W read as 0 past K)
       for j in 0..15: s[j] = fmaf(x[m][k0+j], W[n][k0+j], s[j])
     t[j] = s[j] + s[j+8] (j<8);  u[j] = t[j] + t[j+4] (j<4);  v[j] = u[j] + u[j+2] (j<2);
     y[m][n] = v[0] + v[1]
   Every step is one correctly rounded IEEE-754 float32 operation, so the bytes of y[m][n] depend on
   the row x[m] and the row W[n] only: not on how many rows a call holds, which rows sit next to it,
   how the work is split between threads, or the machine, as long as it executes these operations.

   W is either float32 or GGUF blocks that are expanded to float32 first (F16, BF16, Q4_0, Q4_1, Q5_0,
   Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: the formats llama.cpp's common quantisations write; ggml's layouts). The expansion repeats gguf-py's dequantisation, the one
   the float32 model folder was made with; the loader checks, tensor by tensor, that it gives the
   same bytes as the float32 weights before using it, so a product over blocks equals the product
   over the float32 weights byte for byte, and reads 4-6x fewer bytes. */

enum {
    FMT_F32 = 0, FMT_F16 = 1, FMT_Q4_0 = 2, FMT_Q4_1 = 3, FMT_Q5_0 = 6, FMT_Q5_1 = 7, FMT_Q8_0 = 8,
    FMT_Q4_K = 12, FMT_Q5_K = 13, FMT_Q6_K = 14, FMT_BF16 = 30
};

static float half_to_float(uint16_t h) { /* exact, in plain C (the AVX builds use F16C's, also exact) */
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* A format with FMT_I8 set: the same blocks, multiplied under the integer definition (int8ref.c, int8.c) where the
   format is one it covers (kv_i8_block); the entry points below dispatch on it. */
#define FMT_I8 0x100
static int kv_i8_block(int fmt);
int kv_linear_i8_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N, float *y,
                     int64_t ldy);

int64_t kv_row_bytes(int fmt, int64_t K) {
    if (fmt & FMT_I8) return kv_i8_block(fmt & ~FMT_I8) ? kv_row_bytes(fmt & ~FMT_I8, K) : -1;
    switch (fmt) {
    case FMT_F32: return K * 4;
    case FMT_F16: return K * 2;
    case FMT_BF16: return K * 2;
    case FMT_Q4_0: return K % 32 ? -1 : K / 32 * 18;
    case FMT_Q4_1: return K % 32 ? -1 : K / 32 * 20;
    case FMT_Q5_0: return K % 32 ? -1 : K / 32 * 22;
    case FMT_Q5_1: return K % 32 ? -1 : K / 32 * 24;
    case FMT_Q8_0: return K % 32 ? -1 : K / 32 * 34;
    case FMT_Q4_K: return K % 256 ? -1 : K / 256 * 144;
    case FMT_Q5_K: return K % 256 ? -1 : K / 256 * 176;
    case FMT_Q6_K: return K % 256 ? -1 : K / 256 * 210;
    default: return -1;
    }
}

static void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* One row of W as float32, plain C: the reference expansion (gguf-py's arithmetic, one float op at a time). */
static void dequant_row_ref(int fmt, const uint8_t *src, int64_t K, float *dst) {
    if (fmt == FMT_F32) {
        memcpy(dst, src, (size_t)K * 4);
    } else if (fmt == FMT_F16) {
        for (int64_t j = 0; j < K; j++) dst[j] = half_to_float(rd16(src + 2 * j));
    } else if (fmt == FMT_BF16) { /* the upper half of a float32: exact */
        for (int64_t j = 0; j < K; j++) {
            uint32_t bits = (uint32_t)rd16(src + 2 * j) << 16;
            memcpy(dst + j, &bits, 4);
        }
    } else if (fmt == FMT_Q4_0) { /* d, 16 bytes: value j the low nibble of byte j, j + 16 its high; d * (q - 8) */
        for (int64_t b = 0; b < K / 32; b++, src += 18) {
            float d = half_to_float(rd16(src));
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((src[2 + j] & 0xF) - 8);
                dst[b * 32 + j + 16] = d * (float)((src[2 + j] >> 4) - 8);
            }
        }
    } else if (fmt == FMT_Q4_1 || fmt == FMT_Q5_1) { /* d, m, [qh,] 16 bytes; d * q + m: a product, then a sum */
        const int five = fmt == FMT_Q5_1, step = five ? 24 : 20;
        for (int64_t b = 0; b < K / 32; b++, src += step) {
            float d = half_to_float(rd16(src)), m = half_to_float(rd16(src + 2));
            uint32_t qh = five ? (uint32_t)src[4] | ((uint32_t)src[5] << 8) | ((uint32_t)src[6] << 16) | ((uint32_t)src[7] << 24) : 0;
            const uint8_t *qs = src + (five ? 8 : 4);
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4), hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                float plo = d * (float)lo, phi = d * (float)hi;
                dst[b * 32 + j] = plo + m;
                dst[b * 32 + j + 16] = phi + m;
            }
        }
    } else if (fmt == FMT_Q8_0) {
        for (int64_t b = 0; b < K / 32; b++, src += 34) {
            float d = half_to_float(rd16(src));
            for (int j = 0; j < 32; j++) dst[b * 32 + j] = d * (float)(int8_t)src[2 + j];
        }
    } else if (fmt == FMT_Q5_0) {
        for (int64_t b = 0; b < K / 32; b++, src += 22) {
            float d = half_to_float(rd16(src));
            uint32_t qh = (uint32_t)src[2] | ((uint32_t)src[3] << 8) | ((uint32_t)src[4] << 16) | ((uint32_t)src[5] << 24);
            const uint8_t *qs = src + 6;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4), hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                dst[b * 32 + j] = d * (float)(lo - 16);
                dst[b * 32 + j + 16] = d * (float)(hi - 16);
            }
        }
    } else if (fmt == FMT_Q4_K) {
        for (int64_t b = 0; b < K / 256; b++, src += 144) {
            float d = half_to_float(rd16(src)), dmin = half_to_float(rd16(src + 2));
            const uint8_t *scales = src + 4, *qs = src + 16;
            for (int c = 0; c < 4; c++) {
                int sc0, m0, sc1, m1;
                q4k_scale_min(scales, 2 * c, &sc0, &m0);
                q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
                float d0 = d * (float)sc0, dm0 = dmin * (float)m0, d1 = d * (float)sc1, dm1 = dmin * (float)m1;
                for (int j = 0; j < 32; j++) {
                    float lo = d0 * (float)(qs[32 * c + j] & 0xF), hi = d1 * (float)(qs[32 * c + j] >> 4);
                    dst[b * 256 + 64 * c + j] = lo - dm0;
                    dst[b * 256 + 64 * c + 32 + j] = hi - dm1;
                }
            }
        }
    } else if (fmt == FMT_Q5_K) { /* Q4_K's scales, then 32 bytes of high bits (bit s of byte j: value j of sub-block s) */
        for (int64_t b = 0; b < K / 256; b++, src += 176) {
            float d = half_to_float(rd16(src)), dmin = half_to_float(rd16(src + 2));
            const uint8_t *scales = src + 4, *qh = src + 16, *qs = src + 48;
            for (int c = 0; c < 4; c++) {
                int sc0, m0, sc1, m1;
                q4k_scale_min(scales, 2 * c, &sc0, &m0);
                q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
                float d0 = d * (float)sc0, dm0 = dmin * (float)m0, d1 = d * (float)sc1, dm1 = dmin * (float)m1;
                for (int j = 0; j < 32; j++) {
                    int lo = (qs[32 * c + j] & 0xF) | (((qh[j] >> (2 * c)) & 1) << 4);
                    int hi = (qs[32 * c + j] >> 4) | (((qh[j] >> (2 * c + 1)) & 1) << 4);
                    float plo = d0 * (float)lo, phi = d1 * (float)hi;
                    dst[b * 256 + 64 * c + j] = plo - dm0;
                    dst[b * 256 + 64 * c + 32 + j] = phi - dm1;
                }
            }
        }
    } else if (fmt == FMT_Q6_K) {
        for (int64_t b = 0; b < K / 256; b++, src += 210) {
            const uint8_t *ql = src, *qh = src + 128;
            const int8_t *sc = (const int8_t *)(src + 192);
            float d = half_to_float(rd16(src + 208));
            for (int i = 0; i < 256; i++) {
                int h = i / 128, t = i % 128;
                int l = (ql[h * 64 + t % 64] >> (4 * (t / 64))) & 0xF;
                int hb = (qh[h * 32 + t % 32] >> (2 * (t / 32))) & 3;
                float ds = d * (float)sc[i / 16];
                dst[b * 256 + i] = ds * (float)((l | (hb << 4)) - 32);
            }
        }
    }
}

/* The fixed reduction of 16 lanes, as written in the definition: s[j] + s[j+8], then + 4, + 2, + 1. */
static float reduce16_ref(const float *s) {
    float t[8], u[4], v[2];
    for (int j = 0; j < 8; j++) t[j] = s[j] + s[j + 8];
    for (int j = 0; j < 4; j++) u[j] = t[j] + t[j + 4];
    for (int j = 0; j < 2; j++) v[j] = u[j] + u[j + 2];
    return v[0] + v[1];
}

static int64_t pad16(int64_t K) { return (K + 15) / 16 * 16; }

/* y[m][0] for M rows of x against one weight row already expanded to float32 and zero-padded to a multiple
   of 16: the definition, one fmaf per lane per step (fmaf from math.h is correctly rounded). */
static void outputs_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const float *row, float *y, int64_t ldy) {
    const int64_t Kp = pad16(K);
    for (int64_t m = 0; m < M; m++) {
        float s[16] = {0};
        for (int64_t k = 0; k < Kp; k += 16)
            for (int j = 0; j < 16; j++) s[j] = fmaf(k + j < K ? x[m * ldx + k + j] : 0.0f, row[k + j], s[j]);
        y[m * ldy] = reduce16_ref(s);
    }
}

/* The same products in plain C, one output at a time: the definition, for tests and for the record. */
int kv_linear_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
                  float *y, int64_t ldy) {
    if (fmt & FMT_I8) return kv_linear_i8_ref(x, M, K, ldx, w, fmt & ~FMT_I8, N, y, ldy);
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0 || M < 0 || N < 0 || K <= 0) return -1;
    float *row = calloc((size_t)pad16(K), 4);
    if (!row) return -2;
    for (int64_t n = 0; n < N; n++) {
        dequant_row_ref(fmt, w + n * rb, K, row);
        outputs_ref(x, M, K, ldx, row, y + n, ldy);
    }
    free(row);
    return 0;
}

/* ---- attention: one key/value head and the query heads that share it, fused ------------------------

   The definition, for one query row q (head h, position i) over keys k_j and values v_j (j < sk, D values
   each), and its mask row (keep: 1 attend, 0 left out; or an additive float row, every key kept; or none:
   every key kept):
     f, l      = the first and last kept key; nothing kept: y = +0 everywhere;
     R         = [j0, j1) = [f rounded down to a multiple of 16, l + 1);
     for j in R: t_j = dot(q, k_j) * scale (+ add_j), dot in fma16's order along D (16 lanes of fmaf,
                 the tree s[j] + s[j+8], +4, +2, +1: what kv_linear computes for one output);
     m         = the largest t_j over the kept j in R (m = -inf: y = +0 everywhere);
     e_j       = kv_expf_neg(t_j - m) for a kept j, +0 for a left-out one;
     sum       = the e_j of R in 16 lanes (key j in lane j mod 16, increasing j) and the same tree;
     p_j       = e_j / sum;
     y[d]      = for each lane L, acc = +0, then acc = fmaf(p_j, v_j[d], acc) for j in R, j mod 16 == L, in
                 increasing j; y[d] = the tree over the 16 lanes.
   Every step is one correctly rounded float32 (or, inside kv_expf_neg, double) operation, so y depends
   on q, the keys and values and the mask row only: not on the rows computed beside it, the blocks, the
   threads or the build. A left-out key inside R adds fmaf(0, v, acc) to its lane; R starts at a multiple
   of 16, so the keys before f (all left out) come first in their lanes, onto +0, and change nothing.
   (Another start gives the same bytes too: the trees add lanes 8, 4, 2, 1 apart, so moving every key of
   a row by the same number of lanes only swaps the operands of additions.)
   `attend_row_ref` is the definition, one operation at a time; the shared operations (attention.c) compute the same
   operations on blocks of rows (kv_attention), and the tests compare them byte for byte. */

/* The kept range of a mask row of sk keys (keep NULL: every key): 1 with [*f, *l] set, 0 when nothing is kept. */
static int kept_range(const uint8_t *keep, int64_t sk, int64_t *f, int64_t *l) {
    int64_t a = 0, b = sk - 1;
    if (keep) {
        while (a < sk && !keep[a]) a++;
        while (b >= a && !keep[b]) b--;
    }
    *f = a;
    *l = b;
    return a <= b;
}

/* The dot products t[j], j in [j0, j1) (j0 a multiple of 16), to probabilities in place, as the definition
   above says; returns 0 where the row's output is all +0 (m = -inf), else 1. Plain C, the same in every
   build: each loop is over independent elements (the compiler may vectorise it, never reorder an operation)
   but the max, which is exact in any order, and the 16-lane sum, written lane by lane. */
static int softmax_range(float *t, const float *add, const uint8_t *keep, int64_t j0, int64_t j1, float scale) {
    for (int64_t j = j0; j < j1; j++) t[j] = t[j] * scale;
    if (add)
        for (int64_t j = j0; j < j1; j++) t[j] = t[j] + add[j];
    /* the max in 16 lanes (key j in lane j mod 16), then over the lanes: the same value as one scan, but for
       the sign of a zero max, which changes no t[j] - m below (t - 0 is t; t = +-0 gives +-0, whose e is 1) */
    float m16[16];
    for (int L = 0; L < 16; L++) m16[L] = -INFINITY;
    int64_t jm = j0;
    if (keep) {
        for (; jm + 16 <= j1; jm += 16)
            for (int L = 0; L < 16; L++) m16[L] = keep[jm + L] && t[jm + L] > m16[L] ? t[jm + L] : m16[L];
        for (int L = 0; jm + L < j1; L++) m16[L] = keep[jm + L] && t[jm + L] > m16[L] ? t[jm + L] : m16[L];
    } else {
        for (; jm + 16 <= j1; jm += 16)
            for (int L = 0; L < 16; L++) m16[L] = t[jm + L] > m16[L] ? t[jm + L] : m16[L];
        for (int L = 0; jm + L < j1; L++) m16[L] = t[jm + L] > m16[L] ? t[jm + L] : m16[L];
    }
    float m = -INFINITY;
    for (int L = 0; L < 16; L++) m = m16[L] > m ? m16[L] : m;
    if (m == -INFINITY) return 0;
    if (keep) {
        for (int64_t j = j0; j < j1; j++) t[j] = keep[j] ? t[j] - m : -INFINITY; /* e^-inf: +0 */
    } else {
        for (int64_t j = j0; j < j1; j++) t[j] = t[j] - m;
    }
    for (int64_t j = j0; j < j1; j++) t[j] = kv_expf_neg(t[j]);
    float s[16] = {0};
    int64_t j = j0;
    for (; j + 16 <= j1; j += 16)
        for (int L = 0; L < 16; L++) s[L] = s[L] + t[j + L];
    for (int L = 0; j + L < j1; L++) s[L] = s[L] + t[j + L];
    const float sum = reduce16_ref(s);
    for (int64_t j2 = j0; j2 < j1; j2++) t[j2] = t[j2] / sum;
    return 1;
}

/* Keys and values in one or two segments: key j < split at k0 + j ks, key j >= split at k1 + (j - split) ks,
   values alike (stride vs); one segment: split = INT64_MAX. A restored artifact's rows are one segment shared
   by every session that grafts it, the session's own rows the other (graft_core/layers.py). Which segment a
   row is read from changes no operation of the definition, so no byte. */
typedef struct {
    const float *k0, *v0, *k1, *v1;
    int64_t ks, vs, split;
} kv_rows;

static inline const float *key_row(const kv_rows *s, int64_t j) {
    return j < s->split ? s->k0 + j * s->ks : s->k1 + (j - s->split) * s->ks;
}
static inline const float *value_row(const kv_rows *s, int64_t j) {
    return j < s->split ? s->v0 + j * s->vs : s->v1 + (j - s->split) * s->vs;
}
/* How many keys from j on lie in j's segment, up to j1 (a tile of dot products reads consecutive rows). */
static inline int64_t segment_left(const kv_rows *s, int64_t j, int64_t j1) {
    return (j < s->split && s->split < j1 ? s->split : j1) - j;
}

/* One query row, the definition one operation at a time (t: scratch of sk floats). */
static void attend_row_ref(const float *q, int64_t D, const kv_rows *kv, int64_t sk,
                           const uint8_t *keep, const float *add, float scale, float *y, float *t) {
    int64_t f, l;
    if (!kept_range(keep, sk, &f, &l)) {
        memset(y, 0, (size_t)D * 4);
        return;
    }
    const int64_t j0 = f / 16 * 16, j1 = l + 1, Dp = pad16(D);
    for (int64_t j = j0; j < j1; j++) {
        float s[16] = {0};
        for (int64_t d0 = 0; d0 < Dp; d0 += 16)
            for (int L = 0; L < 16; L++) {
                const int64_t d = d0 + L;
                s[L] = fmaf(d < D ? q[d] : 0.0f, d < D ? key_row(kv, j)[d] : 0.0f, s[L]);
            }
        t[j] = reduce16_ref(s);
    }
    if (!softmax_range(t, add, keep, j0, j1, scale)) {
        memset(y, 0, (size_t)D * 4);
        return;
    }
    for (int64_t d = 0; d < D; d++) {
        float acc[16] = {0};
        for (int64_t j = j0; j < j1; j++) acc[(j - j0) & 15] = fmaf(t[j], value_row(kv, j)[d], acc[(j - j0) & 15]);
        y[d] = reduce16_ref(acc);
    }
}
