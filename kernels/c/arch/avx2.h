/* AVX2 primitives (AVX2, FMA, F16C): v16 is two 256-bit registers, lanes 0-7 in lo and 8-15 in hi, and a
   part (vp) is one of them. The same fmaf per lane as AVX-512, and s[j] + s[j+8] is exactly lo[j] + hi[j],
   so the same bits. Integer-to-float conversions are of small integers (exact). Built with -DKV_AVX2. */

#include <immintrin.h>

#define KV_ISA_NAME "avx2"

typedef struct {
    __m256 lo, hi;
} v16;
static inline v16 v_of(__m256 lo, __m256 hi) {
    v16 r = {lo, hi};
    return r;
}
static inline v16 v_zero(void) { return v_of(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline v16 v_set1(float a) { return v_of(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
static inline v16 v_load(const float *p) { return v_of(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline v16 v_load_first(const float *p, int64_t n) { /* lanes 0..n-1 from p, the rest 0 (n < 16) */
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), count = _mm256_set1_epi32((int)n);
    const __m256i lo = _mm256_cmpgt_epi32(count, lanes), hi = _mm256_cmpgt_epi32(count, _mm256_add_epi32(lanes, _mm256_set1_epi32(8)));
    return v_of(_mm256_maskload_ps(p, lo), _mm256_maskload_ps(p + 8, hi));
}
static inline void v_store(float *p, v16 a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
}
static inline v16 v_fmadd(v16 a, v16 b, v16 c) { return v_of(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)); }
static inline v16 v_mul(v16 a, v16 b) { return v_of(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline v16 v_sub(v16 a, v16 b) { return v_of(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
static inline v16 v_add(v16 a, v16 b) { return v_of(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline float reduce16(v16 s) { /* s[j] + s[j+8] is lo[j] + hi[j]; then as the AVX-512 build */
    __m256 t = _mm256_add_ps(s.lo, s.hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); } /* F16C: exact, as half_to_float */
static inline void v_prefetch(const void *p) { _mm_prefetch((const char *)p, _MM_HINT_T0); }

static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256i i8x8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256i nibbles8(const uint8_t *p, int high) {
    __m256i v = u8x8(p);
    return high ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0xF));
}
static inline v16 q_i8(const uint8_t *p) { return v_of(_mm256_cvtepi32_ps(i8x8(p)), _mm256_cvtepi32_ps(i8x8(p + 8))); }
static inline v16 q_nibbles(const uint8_t *p, int high) {
    return v_of(_mm256_cvtepi32_ps(nibbles8(p, high)), _mm256_cvtepi32_ps(nibbles8(p + 8, high)));
}
/* table[q] for 8 indices q < 16: lanes q of table.lo, or q - 8 of table.hi where bit 3 of q is set (the sign
   bit of q << 28 selects) */
static inline __m256 lut8(v16 table, __m256i q) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(table.lo, q), _mm256_permutevar8x32_ps(table.hi, q),
                            _mm256_castsi256_ps(_mm256_slli_epi32(q, 28)));
}
static inline v16 q_lut(v16 table, const uint8_t *p, int high) {
    return v_of(lut8(table, nibbles8(p, high)), lut8(table, nibbles8(p + 8, high)));
}
/* 16 where bit j of `bits` (8 bits) is set, else 0, for lanes j = 0..7 */
static inline __m256i bit16x8(uint32_t bits) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel);
    return _mm256_and_si256(set, _mm256_set1_epi32(16));
}
static inline v16 q_q5(const uint8_t *p, int high, uint32_t bits) {
    const __m256i sixteen = _mm256_set1_epi32(16);
    __m256i lo = _mm256_or_si256(nibbles8(p, high), bit16x8(bits & 0xFF));
    __m256i hi = _mm256_or_si256(nibbles8(p + 8, high), bit16x8((bits >> 8) & 0xFF));
    return v_of(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, sixteen)), _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, sixteen)));
}
static inline __m256i q6x8(const uint8_t *ql, int ls, const uint8_t *qh, int hs) {
    __m256i l = _mm256_and_si256(_mm256_srli_epi32(u8x8(ql), ls), _mm256_set1_epi32(0xF));
    __m256i h = _mm256_and_si256(_mm256_srli_epi32(u8x8(qh), hs), _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
}
static inline v16 q_q6(const uint8_t *ql, int ls, const uint8_t *qh, int hs) {
    return v_of(_mm256_cvtepi32_ps(q6x8(ql, ls, qh, hs)), _mm256_cvtepi32_ps(q6x8(ql + 8, ls, qh + 8, hs)));
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
static inline v16 q_k4scales(const uint8_t *s) {
    const __m128i b = k4scales(s);
    const __m256 first = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    return v_of(first, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))));
}
/* Q6_K's 128 values of half a block as bytes, 32 at a time: a nibble of ql and two bits of qh moved to bits 4-5 (a
   shift of 16-bit words: the bits kept, 0x30 of each byte, come from that byte), minus 32 */
static inline void q_q6x128(const uint8_t *ql, const uint8_t *qh, int8_t *out) {
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
#define Q6_32(L, H) _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(L, m4), _mm256_and_si256(H, m30)), k32)
    _mm256_storeu_si256((__m256i *)out, Q6_32(l0, _mm256_slli_epi16(h, 4)));
    _mm256_storeu_si256((__m256i *)(out + 32), Q6_32(l1, _mm256_slli_epi16(h, 2)));
    _mm256_storeu_si256((__m256i *)(out + 64), Q6_32(_mm256_srli_epi16(l0, 4), h));
    _mm256_storeu_si256((__m256i *)(out + 96), Q6_32(_mm256_srli_epi16(l1, 4), _mm256_srli_epi16(h, 2)));
#undef Q6_32
}

/* A part is one register of 8 lanes: the tiles accumulate lanes 0-7 of every output over the whole reduction,
   then lanes 8-15 (each lane's fmaf chain is the one a v16 accumulator holds, in the same order, and the
   halves meet in reduce16), so a tile of 8-lane accumulators fits twice the outputs in 16 registers. */
#define VP_LANES 8
#define VP_PARTS 2
typedef __m256 vp;
static inline vp vp_zero(void) { return _mm256_setzero_ps(); }
static inline vp vp_set1(float a) { return _mm256_set1_ps(a); }
static inline vp vp_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vp_store(float *p, vp a) { _mm256_storeu_ps(p, a); }
static inline vp vp_fmadd(vp a, vp b, vp c) { return _mm256_fmadd_ps(a, b, c); }
static inline vp vp_add(vp a, vp b) { return _mm256_add_ps(a, b); }
static inline vp v_part(v16 a, int h) { return h ? a.hi : a.lo; }
static inline v16 v_join(vp first, vp last) { return v_of(first, last); }

/* q_lut is two permutes and a blend here: Q4_K's 1-row kernel ran 1.37x slower picking from its tables */
#define KV_LUT16 0 /* q_lut where a format could compute per lane instead */

/* Tile shapes (16 registers of 8 lanes: a v16 takes two, so its tiles are smaller; larger ones spill their
   accumulators to the stack). They decide which outputs are computed side by side, never how one is. */
#define PANEL_RB 3   /* weight rows of a panel per tile of products (x 4 rows of x: 12 accumulators, 3 weights) */
#define FUSEDM_TOP 4 /* 8 x 2 v16 accumulators would take 32 of AVX2's 16 registers */
#define FUSED256_RB 2 /* 8 (16 registers of sums) spills: Q4_K's per-lane expansion ran 1.3x slower at 4 */
#define QK_C 3       /* keys per tile of dot products (x 4 query rows: 12 accumulators) */
#define PV_WIDE_C 3  /* parts of 8 values per wide tile of P.V (x 4 probability rows): 24 values */
#define PV_PAIR_H 0  /* no P.V tile takes two lanes a pass (16 registers) */

/* ---- the integer products (int8.c): 64 bytes (vb), 32 int16 (vs) or 16 int32 (vi) in two registers, bytes
   0-31 (int16 lanes 0-15, int32 lanes 0-7) in lo; vsg the signs of 64 bytes (the bytes), vm 8 int16, v4 4 floats ---- */
typedef struct {
    __m256i lo, hi;
} vb;
typedef vb vs;
typedef vb vi;
typedef vb vsg;
typedef __m128i vm;
typedef __m128 v4;
static inline vb vb_of(__m256i lo, __m256i hi) {
    vb r = {lo, hi};
    return r;
}
static inline vb vb_load(const void *p) {
    return vb_of(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)((const uint8_t *)p + 32)));
}
static inline vb vb_load2(const void *p0, const void *p1) {
    return vb_of(_mm256_loadu_si256((const __m256i *)p0), _mm256_loadu_si256((const __m256i *)p1));
}
static inline vb vb_nib(vb v, int high) {
    const __m256i m = _mm256_set1_epi8(0xF);
    return high ? vb_of(_mm256_and_si256(_mm256_srli_epi16(v.lo, 4), m), _mm256_and_si256(_mm256_srli_epi16(v.hi, 4), m))
                : vb_of(_mm256_and_si256(v.lo, m), _mm256_and_si256(v.hi, m));
}
static inline vb vb_abs(vb w) { return vb_of(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(w.hi, w.hi)); }
static inline vsg vb_sign(vb w) { return w; }
static inline vi vi_zero(void) { return vb_of(_mm256_setzero_si256(), _mm256_setzero_si256()); }
static inline vi vi_add(vi a, vi b) { return vb_of(_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)); }
static inline vi vi_dot(vb w, vb x, vs s) {
    return vb_of(_mm256_madd_epi16(_mm256_maddubs_epi16(w.lo, x.lo), s.lo), _mm256_madd_epi16(_mm256_maddubs_epi16(w.hi, x.hi), s.hi));
}
static inline vi vi_dot_sg(vb aw, vsg sg, vb x, vs s) {
    return vi_dot(aw, vb_of(_mm256_sign_epi8(x.lo, sg.lo), _mm256_sign_epi8(x.hi, sg.hi)), s);
}
static inline v16 v_from_vi(vi a) { return v_of(_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)); }
static inline vs vs_ones(void) { return vb_of(_mm256_set1_epi16(1), _mm256_set1_epi16(1)); }
static inline v16 v_two(float a, float b) { return v_of(_mm256_set1_ps(a), _mm256_set1_ps(b)); }
/* 16 int16 lanes: 0-7 word a of t, 8-15 word b (t: 8 int16 in both 128-bit lanes) */
static inline __m256i w16_pick(__m256i t, int a, int b) {
    return _mm256_shuffle_epi8(t, _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * a)), _mm_set1_epi16((short)(0x0100 + 0x0202 * b))));
}
static inline void k4_prep(const uint8_t *scales, vs *s, vm *mn) {
    const __m128i b = k4scales(scales);
    const __m256i t = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
    for (int k = 0; k < 4; k++) {
        const int j = 4 * (k / 2) + k % 2;
        s[k] = vb_of(w16_pick(t, j, j), w16_pick(t, j + 2, j + 2));
    }
    *mn = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
}
static inline void q6_scales(const int8_t *sc, vs *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)sc);
    const __m256i t0 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(v)), t1 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(v, 8)));
    for (int c = 0; c < 4; c++) {
        const __m256i t = c < 2 ? t0 : t1;
        const int j = (4 * c) % 8;
        s[c] = vb_of(w16_pick(t, j, j + 1), w16_pick(t, j + 2, j + 3));
    }
}
static inline v4 v4_zero(void) { return _mm_setzero_ps(); }
static inline v4 v4_mins(v4 am, vm mn, const int16_t *bs, float dm) {
    return _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mn, _mm_loadu_si128((const __m128i *)bs))), _mm_set1_ps(dm), am);
}
static inline float v4_sum(v4 a) {
    const __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline void q8_round(const float *x, int64_t n, float id, int8_t *q) {
    const __m256 s = _mm256_set1_ps(id);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t i = 0; i < n; i += 16) {
        const __m256i a = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), s)), lo), hi);
        const __m256i b = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s)), lo), hi);
        const __m256i w = _mm256_packs_epi32(a, b); /* a0-3 b0-3 | a4-7 b4-7 as int16 (exact: within int8) */
        const __m128i p = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)(q + i), _mm_shuffle_epi32(p, 0xD8)); /* a0-3 a4-7 b0-3 b4-7 */
    }
}
static inline uint32_t q8_amax_bits(const float *x, int64_t n) {
    __m256i m = _mm256_setzero_si256();
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), abs));
    uint32_t t[8], r = 0;
    _mm256_storeu_si256((__m256i *)t, m);
    for (int j = 0; j < 8; j++) r = t[j] > r ? t[j] : r;
    return r;
}
