/* The integer products' definition (linear VERSION i8dot-v1), in plain C, one operation at a time; int8.c computes
   the same operations on tiles of outputs, and the tests and the loader compare the two byte for byte.

   A product y = x @ W^T over blocks of a covered format (Q8_0, Q5_0, Q4_K, Q6_K) quantises each row of x first,
   in blocks of QB values (32 for Q8_0 and Q5_0, 256 for the K formats: the weight's own block):
     amax  = the largest |x_i| of the block, taken on the bits (a NaN above infinity: any order gives it)
     d     = amax / 127;  id = 127 / amax (both 0 where amax < 2^-100: such a block is zeros)
     q_i   = round-to-nearest-even(x_i * id) as an int32 (the int32 minimum for a NaN or a value out of range),
             then clamped to [-127, 127]
   and every output y[m][n] is then
     16 float lanes acc[L] = +0 and 4 more am[i] = +0;
     per block (in increasing order): exact integer sums isum[L] of weight x q products (which products
       fall in lane L is written per format below), then acc[L] = fmaf((float)isum[L], dw * d, acc[L]);
       for Q4_K also am[i] = fmaf((float)(mn[2i] bs[2i] + mn[2i+1] bs[2i+1]), dmin * d, am[i]) (bs: the sums
       of q over each 32 values, mn: the block's mins);
     y = reduce16(acc) - ((am[0] + am[2]) + (am[1] + am[3])).
   An integer sum is exact in any order, so the vector builds may add its products as they like; every float
   operation is one correctly rounded IEEE-754 operation in the order written, so a row's bytes depend on the
   row of x and the row of W only, as in fma16. Formats outside the four keep fma16's float32 products. */

static int kv_i8_block(int fmt) {
    return fmt == FMT_Q8_0 || fmt == FMT_Q5_0 ? 32 : fmt == FMT_Q4_K || fmt == FMT_Q6_K ? 256 : 0;
}

/* A 32-value block's signed values: Q8_0's bytes, or Q5_0's (nibble | its bit of qh << 4) - 16 (values j and j + 16
   from byte j's low and high nibbles, as the expansion reads them). */
static void q32_values(int fmt, const uint8_t *blk, int8_t *v) {
    if (fmt == FMT_Q8_0) {
        memcpy(v, blk + 2, 32);
        return;
    }
    const uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < 16; j++) {
        v[j] = (int8_t)(((qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16);
        v[j + 16] = (int8_t)(((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16);
    }
}

static inline int8_t q8_round1(float x, float id) {
    const float v = nearbyintf(x * id); /* the default rounding: to nearest, ties to even */
    const int32_t i = v >= -2147483648.0f && v < 2147483648.0f ? (int32_t)v : INT32_MIN;
    return (int8_t)(i < -127 ? -127 : i > 127 ? 127 : i);
}

static float q8_scale(uint32_t amax_bits, float *id) {
    float amax;
    memcpy(&amax, &amax_bits, 4);
    const int tiny = amax < 0x1p-100f; /* 127 / amax could overflow: the block is zeros (a NaN is not tiny) */
    *id = tiny ? 0.0f : 127.0f / amax;
    return tiny ? 0.0f : amax / 127.0f;
}

/* One row of K values to q (K bytes), d (K / qb scales) and bs (K / 32 sums), plain C. */
static void q8_row_ref(const float *x, int64_t K, int qb, int8_t *q, float *d, int16_t *bs) {
    for (int64_t b = 0; b < K / qb; b++) {
        uint32_t m = 0;
        for (int64_t i = b * qb; i < (b + 1) * qb; i++) {
            uint32_t bits;
            memcpy(&bits, x + i, 4);
            bits &= 0x7FFFFFFFu;
            m = bits > m ? bits : m;
        }
        float id;
        d[b] = q8_scale(m, &id);
        for (int64_t i = b * qb; i < (b + 1) * qb; i++) q[i] = q8_round1(x[i], id);
    }
    for (int64_t j = 0; j < K / 32; j++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += q[32 * j + i];
        bs[j] = (int16_t)s;
    }
}

/* One output: the quantised row (q, d, bs) against one weight row w, the definition above. Lanes:
   - Q8_0, Q5_0: blocks in pairs (a last odd block paired with a block of zeros, whose lanes get fmaf(0, 0, acc)):
     block b's signed values 4L..4L+3 (q32_values) in lane 8 (b % 2) + L, dw its scale;
   - Q4_K: byte p (0-127) of the 4-bit values holds value 64 (p / 32) + p % 32 (low nibble, sub-block
     2 (p / 32)) and that + 32 (high nibble, sub-block 2 (p / 32) + 1): both in lane (p % 64) / 4, each times
     its sub-block's 6-bit scale; dw = d, and the mins as above;
   - Q6_K: value i (its 6 bits - 32) in lane (i % 64) / 4, times its sub-block's (i / 16) int8 scale. */
static float dot_i8_ref(int fmt, const int8_t *q, const float *d, const int16_t *bs, const uint8_t *w, int64_t K) {
    float acc[16] = {0}, am[4] = {0};
    int32_t is[16];
    if (fmt == FMT_Q8_0 || fmt == FMT_Q5_0) {
        const int64_t nb = K / 32, bytes = fmt == FMT_Q8_0 ? 34 : 22;
        for (int64_t b = 0; b < nb + (nb & 1); b++) {
            const int base = 8 * (int)(b & 1);
            int8_t v[32] = {0};
            if (b < nb) q32_values(fmt, w + bytes * b, v);
            const float dd = b < nb ? half_to_float(rd16(w + bytes * b)) * d[b] : 0.0f;
            for (int L = 0; L < 8; L++) {
                int32_t s = 0;
                for (int j = 0; b < nb && j < 4; j++) s += v[4 * L + j] * q[32 * b + 4 * L + j];
                acc[base + L] = fmaf((float)s, dd, acc[base + L]);
            }
        }
    } else if (fmt == FMT_Q4_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            const uint8_t *blk = w + 144 * b, *qs = blk + 16;
            const int8_t *xq = q + 256 * b;
            int sc[8], mn[8];
            for (int j = 0; j < 8; j++) q4k_scale_min(blk + 4, j, &sc[j], &mn[j]);
            memset(is, 0, sizeof is);
            for (int p = 0; p < 128; p++) {
                const int c4 = p / 32, v = 64 * c4 + p % 32, L = (p % 64) / 4;
                is[L] += sc[2 * c4] * (qs[p] & 0xF) * xq[v] + sc[2 * c4 + 1] * (qs[p] >> 4) * xq[v + 32];
            }
            const float dd = half_to_float(rd16(blk)) * d[b], dm = half_to_float(rd16(blk + 2)) * d[b];
            for (int L = 0; L < 16; L++) acc[L] = fmaf((float)is[L], dd, acc[L]);
            for (int i = 0; i < 4; i++)
                am[i] = fmaf((float)(mn[2 * i] * bs[8 * b + 2 * i] + mn[2 * i + 1] * bs[8 * b + 2 * i + 1]), dm, am[i]);
        }
    } else if (fmt == FMT_Q6_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            const uint8_t *blk = w + 210 * b, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192), *xq = q + 256 * b;
            memset(is, 0, sizeof is);
            for (int i = 0; i < 256; i++) {
                const int h = i / 128, t = i % 128;
                const int l = (ql[h * 64 + t % 64] >> (4 * (t / 64))) & 0xF, hb = (qh[h * 32 + t % 32] >> (2 * (t / 32))) & 3;
                is[(i % 64) / 4] += sc[i / 16] * ((l | (hb << 4)) - 32) * xq[i];
            }
            const float dd = half_to_float(rd16(blk + 208)) * d[b];
            for (int L = 0; L < 16; L++) acc[L] = fmaf((float)is[L], dd, acc[L]);
        }
    }
    return reduce16_ref(acc) - ((am[0] + am[2]) + (am[1] + am[3]));
}

/* The same products in plain C, one output at a time: the definition, for tests and for the record. */
int kv_linear_i8_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
                     float *y, int64_t ldy) {
    const int qb = kv_i8_block(fmt);
    const int64_t rb = kv_row_bytes(fmt, K);
    if (!qb || rb < 0 || K % qb || M < 0 || N < 0 || K <= 0) return -1;
    int8_t *q = malloc((size_t)K);
    float *d = malloc((size_t)(K / qb) * 4);
    int16_t *bs = malloc((size_t)(K / 32) * 2);
    if (!q || !d || !bs) {
        free(q), free(d), free(bs);
        return -2;
    }
    for (int64_t m = 0; m < M; m++) {
        q8_row_ref(x + m * ldx, K, qb, q, d, bs);
        for (int64_t n = 0; n < N; n++) y[m * ldy + n] = dot_i8_ref(fmt, q, d, bs, w + n * rb, K);
    }
    free(q), free(d), free(bs);
    return 0;
}
