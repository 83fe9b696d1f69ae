/* AVX-512 primitives (F, BW, VL, DQ, FMA, F16C): v16 is one 512-bit register, and so is a part (vp).
   Each primitive is the IEEE operation simd.h names, per lane; integer-to-float conversions are of small
   integers (exact). Built with -DKV_AVX512 (kernels/fma16.py VARIANTS). */

#include <immintrin.h>

#define KV_ISA_NAME "avx512"

typedef __m512 v16;
static inline v16 v_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v_set1(float a) { return _mm512_set1_ps(a); }
static inline v16 v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline v16 v_load_first(const float *p, int64_t n) { /* lanes 0..n-1 from p, the rest 0 (n < 16) */
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
static inline void v_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
static inline v16 v_fmadd(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline v16 v_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
static inline v16 v_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
static inline v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline float reduce16(v16 s) {
    __m256 t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
/* reduce16 of 16 registers at once: lane i of the result is reduce16(s[i]), by the same additions (each
   level adds the lanes the tree adds, s[j] + s[j + 8], then + 4, + 2, + 1), two registers' halves per
   instruction rather than one register's. The pairing leaves register P[i] in lane i. */
#define KV_REDUCE16X16 1
#define R16_PAIR(x, y, lo, hi) _mm512_add_ps(_mm512_shuffle_f32x4(x, y, lo), _mm512_shuffle_f32x4(x, y, hi))
#define R16_QUAD(x, y, lo, hi) _mm512_add_ps(_mm512_shuffle_ps(x, y, lo), _mm512_shuffle_ps(x, y, hi))
static inline v16 reduce16x16(const v16 *s) {
    /* + 8: lanes j and j + 8 of two registers, paired so that register i ends in lane i */
    const v16 c0 = R16_PAIR(s[0], s[4], 0x44, 0xEE), c1 = R16_PAIR(s[2], s[6], 0x44, 0xEE);
    const v16 c2 = R16_PAIR(s[1], s[5], 0x44, 0xEE), c3 = R16_PAIR(s[3], s[7], 0x44, 0xEE);
    const v16 c4 = R16_PAIR(s[8], s[12], 0x44, 0xEE), c5 = R16_PAIR(s[10], s[14], 0x44, 0xEE);
    const v16 c6 = R16_PAIR(s[9], s[13], 0x44, 0xEE), c7 = R16_PAIR(s[11], s[15], 0x44, 0xEE);
    /* + 4: quarters 0 and 1, 2 and 3 */
    const v16 d0 = R16_PAIR(c0, c4, 0x88, 0xDD), d1 = R16_PAIR(c1, c5, 0x88, 0xDD);
    const v16 d2 = R16_PAIR(c2, c6, 0x88, 0xDD), d3 = R16_PAIR(c3, c7, 0x88, 0xDD);
    /* + 2: lanes 0, 1 and 2, 3 of each quarter; + 1: lanes 0 and 1 */
    const v16 e0 = R16_QUAD(d0, d2, 0x44, 0xEE), e1 = R16_QUAD(d1, d3, 0x44, 0xEE);
    return R16_QUAD(e0, e1, 0x88, 0xDD);
}
#undef R16_PAIR
#undef R16_QUAD
static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); } /* F16C: exact, as half_to_float */
static inline void v_prefetch(const void *p) { _mm_prefetch((const char *)p, _MM_HINT_T0); }

static inline __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
/* 16 signed bytes as floats */
static inline v16 q_i8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* the low (high == 0) or high nibbles of 16 bytes as floats */
static inline v16 q_nibbles(const uint8_t *p, int high) {
    __m512i v = u8x16(p);
    return _mm512_cvtepi32_ps(high ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0xF)));
}
/* table[nibble j] for lanes j = 0..15: the low (high == 0) or high nibbles of 16 bytes pick lanes of `table` */
static inline v16 q_lut(v16 table, const uint8_t *p, int high) { /* vpermps reads bits 0-3 of an index: no mask */
    __m512i v = u8x16(p);
    return _mm512_permutexvar_ps(high ? _mm512_srli_epi32(v, 4) : v, table);
}
/* Q5_0: (nibble | bit j of `bits` << 4) - 16 for lanes j = 0..15 */
static inline v16 q_q5(const uint8_t *p, int high, uint32_t bits) {
    __m512i v = u8x16(p);
    v = high ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0xF));
    v = _mm512_mask_or_epi32(v, (__mmask16)bits, v, _mm512_set1_epi32(16));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(16)));
}
/* Q6_K: ((ql >> ls) & 15 | ((qh >> hs) & 3) << 4) - 32 */
static inline v16 q_q6(const uint8_t *ql, int ls, const uint8_t *qh, int hs) {
    __m512i l = _mm512_and_si512(_mm512_srli_epi32(u8x16(ql), ls), _mm512_set1_epi32(0xF));
    __m512i h = _mm512_and_si512(_mm512_srli_epi32(u8x16(qh), hs), _mm512_set1_epi32(3));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(h, 4)), _mm512_set1_epi32(32)));
}
/* Q4_K's scales and mins: of the packed dwords A, B, C at s, [A & 0x3F.., (C & 0x0F..) | (A >> 2) & 0x30..,
   B & 0x3F.., (C >> 4) & 0x0F.. | (B >> 2) & 0x30..] as 16 bytes, then as floats (the bits a byte keeps come
   from that byte) */
static inline __m128i k4scales(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i p = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0x98), _mm_setr_epi32(0, 0, 0, 4)); /* A C B C>>4 */
    const __m128i q = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0x50), _mm_setr_epi32(0, 2, 0, 2));  /* A A>>2 B B>>2 */
    const __m128i lo = _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F);
    const __m128i hi = _mm_setr_epi32(0, 0x30303030, 0, 0x30303030);
    return _mm_or_si128(_mm_and_si128(p, lo), _mm_and_si128(q, hi));
}
static inline v16 q_k4scales(const uint8_t *s) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(k4scales(s))); }
/* Q6_K's 128 values of half a block as bytes, assembled 64 at a time: ql's low nibbles (t < 64), then its high
   ones, each with its two bits of qh moved to bits 4-5 (a shift of qh's 16-bit words: the bits kept, 0x30 of each
   byte, come from that byte), minus 32 */
static inline void q_q6x128(const uint8_t *ql, const uint8_t *qh, int8_t *out) {
    const __m512i l = _mm512_loadu_si512(ql), h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    /* qh's words shifted left 4 (t < 32) or 2 (t < 64); right 0 (t < 96) or 2 */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i hlo = _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30);
    const __m512i hhi = _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30);
    /* (a & b) | c: vpternlog's 0xEA */
    const __m512i lo = _mm512_ternarylogic_epi32(l, m4, hlo, 0xEA);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), m4, hhi, 0xEA);
    _mm512_storeu_si512(out, _mm512_sub_epi8(lo, k32));
    _mm512_storeu_si512(out + 64, _mm512_sub_epi8(hi, k32));
}

/* A part is the whole register: the tiles accumulate all 16 lanes at once. */
#define VP_LANES 16
#define VP_PARTS 1
typedef __m512 vp;
static inline vp vp_zero(void) { return _mm512_setzero_ps(); }
static inline vp vp_set1(float a) { return _mm512_set1_ps(a); }
static inline vp vp_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vp_store(float *p, vp a) { _mm512_storeu_ps(p, a); }
static inline vp vp_fmadd(vp a, vp b, vp c) { return _mm512_fmadd_ps(a, b, c); }
static inline vp vp_add(vp a, vp b) { return _mm512_add_ps(a, b); }
static inline vp v_part(v16 a, int h) { (void)h; return a; }
static inline v16 v_join(vp first, vp last) { (void)last; return first; }

#define KV_LUT16 1 /* q_lut where a format could compute per lane instead (vpermps: one instruction) */

/* Tile shapes (32 registers of 16 lanes): they decide which outputs are computed side by side, never how
   one is computed. */
#define PANEL_RB 4   /* weight rows of a panel per tile of products (x 4 rows of x: 16 accumulators) */
#define FUSEDM_TOP 8 /* rows of x per tile with the weights expanded in registers (8 x 2 accumulators) */
#define FUSED256_RB 8 /* weight rows side by side, chunk by chunk, in the 256-value formats' 1-row kernel */
#define QK_C 4       /* keys per tile of dot products (x 4 query rows) */
#define PV_WIDE_C 4  /* parts of 16 values per wide tile of P.V (x 4 probability rows): 64 values */
#define PV_PAIR_H 3  /* rows of a P.V tile that takes two lanes a pass (2 x 3 x 4 accumulators) */

/* ---- the integer products (int8.c): 64 bytes (vb), 32 int16 (vs) or 16 int32 (vi) in one register; vsg the
   signs of 64 bytes, vm 8 int16, v4 4 floats ---- */
typedef __m512i vb;
typedef __m512i vs;
typedef __m512i vi;
typedef __mmask64 vsg;
typedef __m128i vm;
typedef __m128 v4;
static inline vb vb_load(const void *p) { return _mm512_loadu_si512(p); }
static inline vb vb_load2(const void *p0, const void *p1) { /* 32 bytes from p0, then 32 from p1 */
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}
static inline vb vb_nib(vb v, int high) { return _mm512_and_si512(high ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0xF)); }
static inline vb vb_abs(vb w) { return _mm512_abs_epi8(w); } /* -128 stays 0x80: 128 read unsigned */
static inline vsg vb_sign(vb w) { return _mm512_movepi8_mask(w); }
static inline vi vi_zero(void) { return _mm512_setzero_si512(); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
/* lane L: s[2L] (w[4L] x[4L] + w[4L+1] x[4L+1]) + s[2L+1] (w[4L+2] x[4L+2] + w[4L+3] x[4L+3]); w unsigned, x signed,
   the pair sums saturated to int16 (int8.c's ranges never reach it) */
static inline vi vi_dot(vb w, vb x, vs s) { return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), s); }
/* the same with |w| and x negated where w was negative (the sign from vb_sign) */
static inline vi vi_dot_sg(vb aw, vsg sg, vb x, vs s) {
    return vi_dot(aw, _mm512_mask_sub_epi8(x, sg, _mm512_setzero_si512(), x), s);
}
static inline v16 v_from_vi(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vs vs_ones(void) { return _mm512_set1_epi16(1); }
static inline v16 v_two(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }
/* int16 lane l of vs k: Q4_K's sub-block (k = 2 c + nibble: lanes 0-15 sub-block 4 c + nibble, 16-31 that + 2), or
   Q6_K's (lanes 8 i .. 8 i + 7 of vs c: sub-block 4 c + i) */
#define K4_IDX(j) {j, j, j, j, j, j, j, j, j, j, j, j, j, j, j, j, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, \
                   j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2}
#define Q6_IDX(c) {4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1,  \
                   4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2,     \
                   4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3,     \
                   4 * c + 3, 4 * c + 3}
static const int16_t K4_PICK[4][32] __attribute__((aligned(64))) = {K4_IDX(0), K4_IDX(1), K4_IDX(4), K4_IDX(5)};
static const int16_t Q6_PICK[4][32] __attribute__((aligned(64))) = {Q6_IDX(0), Q6_IDX(1), Q6_IDX(2), Q6_IDX(3)};
static inline void k4_prep(const uint8_t *scales, vs *s, vm *mn) {
    const __m128i b = k4scales(scales);
    const __m512i t = _mm512_castsi128_si512(_mm_cvtepu8_epi16(b));
    for (int k = 0; k < 4; k++) s[k] = _mm512_permutexvar_epi16(_mm512_load_si512(K4_PICK[k]), t);
    *mn = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
}
static inline void q6_scales(const int8_t *sc, vs *s) {
    const __m512i t = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
    for (int c = 0; c < 4; c++) s[c] = _mm512_permutexvar_epi16(_mm512_load_si512(Q6_PICK[c]), t);
}
static inline v4 v4_zero(void) { return _mm_setzero_ps(); }
/* am[i] = fmaf((float)(mn[2i] bs[2i] + mn[2i+1] bs[2i+1]), dm, am[i]) */
static inline v4 v4_mins(v4 am, vm mn, const int16_t *bs, float dm) {
    return _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)bs))), _mm_set1_ps(dm), am);
}
static inline float v4_sum(v4 a) { /* (a0 + a2) + (a1 + a3) */
    const __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
/* n floats (a multiple of 16) to int8: round to nearest even, the int32 minimum for NaN or out of range
   (cvtps's "indefinite"), then clamped to [-127, 127] */
static inline void q8_round(const float *x, int64_t n, float id, int8_t *q) {
    const __m512 s = _mm512_set1_ps(id);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t i = 0; i < n; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), s));
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi)));
    }
}
/* the largest |x| of n floats (a multiple of 16) by its bits: NaN above infinity, so any order gives it */
static inline uint32_t q8_amax_bits(const float *x, int64_t n) {
    __m512i m = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16)
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + i), _mm512_set1_epi32(0x7FFFFFFF)));
    return (uint32_t)_mm512_reduce_max_epu32(m);
}
