/* kvgraft's matrix product y = x @ W^T with one fixed order of float32 operations (fma16).

   Every output y[m][n] is computed as:
     16 lanes s[0..15] = +0.0;
     for k0 = 0, 16, 32, ... < K rounded up to 16:        (x and W read as 0 past K)
       for j in 0..15: s[j] = fmaf(x[m][k0+j], W[n][k0+j], s[j])
     t[j] = s[j] + s[j+8] (j<8);  u[j] = t[j] + t[j+4] (j<4);  v[j] = u[j] + u[j+2] (j<2);
     y[m][n] = v[0] + v[1]
   Every step is one correctly rounded IEEE-754 float32 operation, so the bytes of y[m][n] depend on
   the row x[m] and the row W[n] only: not on how many rows a call holds, which rows sit next to it,
   how the work is split between threads, or the machine, as long as it executes these operations.

   One source, three builds (kernels/fma16.py picks one per CPU, or KVGRAFT_ISA does):
     -DFMA16_AVX512  the 16 lanes in one AVX-512 register;
     -DFMA16_AVX2    the same 16 lanes in two AVX2 registers (lanes 0-7, 8-15): the same fmaf per lane,
                     and s[j] + s[j+8] is exactly lo[j] + hi[j], so the same bits;
     neither         portable C: the definition itself (`outputs_ref`), split over output rows.
   The two vector builds share every kernel below, written over `v16` (16 float lanes) and a dozen
   primitives that each ISA defines with the same IEEE operations. The plain C reference
   `kv_linear_ref` is in every build; the tests and the loader compare each build with it.

   W is either float32 or GGUF blocks that are expanded to float32 first (Q8_0, Q5_0, Q4_K, Q6_K,
   the formats of the packaged model's file). The expansion repeats gguf-py's dequantisation, the one
   the float32 model folder was made with; the loader checks, tensor by tensor, that it gives the
   same bytes as the float32 weights before using it, so a product over blocks equals the product
   over the float32 weights byte for byte, and reads 4-6x fewer bytes.

   Built by kernels/fma16.py with -ffp-contract=off: nothing here may be fused or reordered. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

#if defined(FMA16_AVX512) || defined(FMA16_AVX2)
#define FMA16_VECTOR 1
#include <immintrin.h>
#endif

#if defined(FMA16_AVX512)
#define FMA16_ISA "avx512"
#elif defined(FMA16_AVX2)
#define FMA16_ISA "avx2"
#else
#define FMA16_ISA "portable"
#endif

/* Which build this is, so the loader can check it loaded the one it asked for. */
const char *kv_isa(void) { return FMA16_ISA; }

enum { FMT_F32 = 0, FMT_Q5_0 = 6, FMT_Q8_0 = 8, FMT_Q4_K = 12, FMT_Q6_K = 14 };

static float half_to_float(uint16_t h) { /* exact, in plain C; the vector builds use F16C's (also exact) */
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

int64_t kv_row_bytes(int fmt, int64_t K) {
    switch (fmt) {
    case FMT_F32: return K * 4;
    case FMT_Q8_0: return K % 32 ? -1 : K / 32 * 34;
    case FMT_Q5_0: return K % 32 ? -1 : K / 32 * 22;
    case FMT_Q4_K: return K % 256 ? -1 : K / 256 * 144;
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

#ifdef FMA16_VECTOR

/* ---- v16: 16 float32 lanes, and the primitives the kernels are written with. Each is the same IEEE
   operation per lane in both ISAs; integer-to-float conversions are of small integers (exact). ---- */
#if defined(FMA16_AVX512)
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
static inline float reduce16(v16 s) {
    __m256 t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
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
#else /* FMA16_AVX2: lanes 0-7 in lo, 8-15 in hi */
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
static inline float reduce16(v16 s) { /* s[j] + s[j+8] is lo[j] + hi[j]; then as the AVX-512 build */
    __m256 t = _mm256_add_ps(s.lo, s.hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
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
#endif

static inline float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); } /* F16C: exact, as half_to_float */

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
    } else if (fmt == FMT_Q6_K) {
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

/* MB rows of x against RB rows of a panel (float32, each padded with zeros to Kp, a multiple of 16). */
#define TILE(MB, RB)                                                                                          \
    static void tile_##MB##_##RB(const float *x, int64_t ldx, const float *w, int64_t Kp, int64_t K, float *y, \
                                 int64_t ldy) {                                                               \
        v16 acc[MB][RB];                                                                                      \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero();                                                \
        int64_t k = 0;                                                                                        \
        for (; k + 16 <= K; k += 16) {                                                                        \
            v16 wv[RB];                                                                                       \
            for (int r = 0; r < RB; r++) wv[r] = v_load(w + r * Kp + k);                                      \
            for (int m = 0; m < MB; m++) {                                                                    \
                v16 xv = v_load(x + m * ldx + k);                                                             \
                for (int r = 0; r < RB; r++) acc[m][r] = v_fmadd(xv, wv[r], acc[m][r]);                       \
            }                                                                                                 \
        }                                                                                                     \
        if (k < K) {                                                                                          \
            v16 wv[RB];                                                                                       \
            for (int r = 0; r < RB; r++) wv[r] = v_load(w + r * Kp + k);                                      \
            for (int m = 0; m < MB; m++) {                                                                    \
                v16 xv = v_load_first(x + m * ldx + k, K - k);                                                \
                for (int r = 0; r < RB; r++) acc[m][r] = v_fmadd(xv, wv[r], acc[m][r]);                       \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]);                               \
    }

/* Tile shapes: how many rows of x (PANEL_MB) and of a panel (PANEL_RB, ROW_RB for one row of x) a call holds
   in registers. They decide which outputs are computed side by side, never how one is computed. AVX-512 has
   32 registers of 16 lanes; AVX2 has 16 of 8, so a v16 takes two and its tiles are smaller (larger ones
   spill their accumulators to the stack). */
typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t);
#if defined(FMA16_AVX512)
#define PANEL_MB 4
#define PANEL_RB 4
#define ROW_RB 8
TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1)
TILE(1, 4) TILE(2, 4) TILE(3, 4) TILE(4, 4)
TILE(1, 8)
static const tile_fn TILES1[PANEL_MB + 1] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};
static const tile_fn TILESR[PANEL_MB + 1] = {0, tile_1_4, tile_2_4, tile_3_4, tile_4_4};
#define tile_1_row tile_1_8
#else
/* AVX2: one half of the 16 lanes at a time. Lanes 0-7 of every output of the tile over all of K, then lanes
   8-15: each lane's fmaf chain is the one a v16 accumulator holds, in the same order, and the two halves
   meet in reduce16 (s[j] + s[j+8] is lo[j] + hi[j]), so the same bits; but a tile of 8-lane accumulators
   fits twice the outputs in AVX2's 16 registers (4 x 3 here: 12 accumulators, 3 weights, 1 row of x). */
#define TILE_HALVES(MB, RB)                                                                                   \
    static void tile_##MB##_##RB(const float *x, int64_t ldx, const float *w, int64_t Kp, int64_t K, float *y, \
                                 int64_t ldy) {                                                               \
        __m256 part[2][MB][RB];                                                                               \
        for (int h = 0; h < 2; h++) {                                                                         \
            __m256 acc[MB][RB];                                                                               \
            for (int m = 0; m < MB; m++)                                                                      \
                for (int r = 0; r < RB; r++) acc[m][r] = _mm256_setzero_ps();                                 \
            int64_t k = 0;                                                                                    \
            for (; k + 16 <= K; k += 16) {                                                                    \
                __m256 wv[RB];                                                                                \
                for (int r = 0; r < RB; r++) wv[r] = _mm256_loadu_ps(w + r * Kp + k + 8 * h);                 \
                for (int m = 0; m < MB; m++) {                                                                \
                    const __m256 xv = _mm256_loadu_ps(x + m * ldx + k + 8 * h);                               \
                    for (int r = 0; r < RB; r++) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);           \
                }                                                                                             \
            }                                                                                                 \
            if (k < K) { /* the ragged tail: x read as 0 past K (the panel's rows are zero there) */          \
                __m256 wv[RB];                                                                                \
                for (int r = 0; r < RB; r++) wv[r] = _mm256_loadu_ps(w + r * Kp + k + 8 * h);                 \
                for (int m = 0; m < MB; m++) {                                                                \
                    const v16 xt = v_load_first(x + m * ldx + k, K - k);                                      \
                    const __m256 xv = h ? xt.hi : xt.lo;                                                      \
                    for (int r = 0; r < RB; r++) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);           \
                }                                                                                             \
            }                                                                                                 \
            for (int m = 0; m < MB; m++)                                                                      \
                for (int r = 0; r < RB; r++) part[h][m][r] = acc[m][r];                                       \
        }                                                                                                     \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(v_of(part[0][m][r], part[1][m][r]));      \
    }
#define PANEL_MB 4
#define PANEL_RB 3
#define ROW_RB 8
TILE_HALVES(1, 1) TILE_HALVES(2, 1) TILE_HALVES(3, 1) TILE_HALVES(4, 1)
TILE_HALVES(1, 3) TILE_HALVES(2, 3) TILE_HALVES(3, 3) TILE_HALVES(4, 3)
TILE_HALVES(1, 4) TILE_HALVES(1, 8)
static const tile_fn TILES1[PANEL_MB + 1] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};
static const tile_fn TILESR[PANEL_MB + 1] = {0, tile_1_3, tile_2_3, tile_3_3, tile_4_3};
#define tile_1_row tile_1_8
#endif


/* Sixteen weights of a row, W[n][k0..k0+15], expanded in registers: the same operations as dequant_row. */
static inline v16 w16_f32(const uint8_t *row, int64_t k0) { return v_load((const float *)row + k0); }

static inline v16 w16_q8_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 34;
    return v_mul(v_set1(h2f(blk)), q_i8(blk + 2 + (k0 % 32)));
}

static inline v16 w16_q5_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 22;
    const int high = (k0 % 32) != 0;
    uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
    return v_mul(v_set1(h2f(blk)), q_q5(blk + 6, high, high ? qh >> 16 : qh & 0xFFFF));
}

/* Where the bytes of W[n][k0..] start in a row (the prefetches ask for them two row groups ahead). */
static inline int64_t off_f32(int64_t k) { return 4 * k; }
static inline int64_t off_q8_0(int64_t k) { return k / 32 * 34; }
static inline int64_t off_q5_0(int64_t k) { return k / 32 * 22; }

/* One output row of x (M == 1) against RB weight rows, the weights expanded as they are read. */
#define FUSED(NAME, RB)                                                                                       \
    static void fused_##NAME##_##RB(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {      \
        v16 acc[RB];                                                                                          \
        for (int r = 0; r < RB; r++) acc[r] = v_zero();                                                       \
        for (int64_t k = 0; k < K; k += 16) {                                                                 \
            v16 xv = v_load(x + k);                                                                           \
            for (int r = 0; r < RB; r++) {                                                                    \
                _mm_prefetch((const char *)(w + (r + 2 * RB) * rb + off_##NAME(k)), _MM_HINT_T0);            \
                acc[r] = v_fmadd(xv, w16_##NAME(w + r * rb, k), acc[r]);                                      \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < RB; r++) y[r] = reduce16(acc[r]);                                                 \
    }
FUSED(f32, 8) FUSED(f32, 1) FUSED(q8_0, 1) FUSED(q5_0, 8) FUSED(q5_0, 1)

/* Q8_0 against 8 rows, a block (two chunks of 16) at a time: one scale per row and block. */
static void fused_q8_0_8(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {
    v16 acc[8];
    for (int r = 0; r < 8; r++) acc[r] = v_zero();
    for (int64_t k = 0; k < K; k += 32) {
        const v16 x0 = v_load(x + k), x1 = v_load(x + k + 16);
        const uint8_t *blk = w + (k / 32) * 34;
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++, blk += rb) {
            _mm_prefetch((const char *)(blk + 16 * rb), _MM_HINT_T0); /* two groups of 8 rows ahead */
            const v16 d = v_set1(h2f(blk));
            acc[r] = v_fmadd(x0, v_mul(d, q_i8(blk + 2)), acc[r]);
            acc[r] = v_fmadd(x1, v_mul(d, q_i8(blk + 18)), acc[r]);
        }
    }
    for (int r = 0; r < 8; r++) y[r] = reduce16(acc[r]);
}


/* MB rows of x against RB weight rows (MB <= FUSEDM_TOP, RB <= 2), the weights expanded in registers: for
   few rows of x, expanding a weight again per block of rows costs less than a round trip through a panel. */
#if defined(FMA16_AVX512)
#define FUSEDM_TOP 8
#else
#define FUSEDM_TOP 4 /* 8 x 2 accumulators would take 32 of AVX2's 16 registers */
#endif
#define FUSEDM(NAME, MB, RB)                                                                                     \
    static void fusedm_##NAME##_##MB##_##RB(const float *x, int64_t ldx, const uint8_t *w, int64_t rb,         \
                                            int64_t K, float *y, int64_t ldy) {                                \
        v16 acc[MB][RB];                                                                                       \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = v_zero();                                                 \
        for (int64_t k = 0; k < K; k += 16) {                                                                  \
            v16 wv[RB];                                                                                        \
            for (int r = 0; r < RB; r++) {                                                                     \
                _mm_prefetch((const char *)(w + (r + 2 * RB) * rb + off_##NAME(k)), _MM_HINT_T0);            \
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
#define FUSEDM_ALL(NAME)                                                                                        \
    FUSEDM(NAME, 8, 2) FUSEDM(NAME, 4, 2) FUSEDM(NAME, 2, 2) FUSEDM(NAME, 1, 2)                                 \
    FUSEDM(NAME, 8, 1) FUSEDM(NAME, 4, 1) FUSEDM(NAME, 2, 1) FUSEDM(NAME, 1, 1)                                 \
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
FUSEDM_ALL(f32) FUSEDM_ALL(q8_0) FUSEDM_ALL(q5_0)

typedef void (*fusedm_fn)(const float *, int64_t, int64_t, const uint8_t *, int64_t, int64_t, int64_t, int64_t, float *,
                          int64_t);
#define FUSEDM_MAX_ROWS 8 /* up to this many rows of x: the weights expanded in registers; more: through panels */

typedef void (*fused_fn)(const float *, const uint8_t *, int64_t, int64_t, float *);

/* The fused kernels for a format (K a multiple of 16 for float32), or none: the panel path takes it. */
static int fused_for(int fmt, int64_t K, fused_fn *f8, fused_fn *f1, fusedm_fn *fm) {
    if (fmt == FMT_F32 && K % 16 == 0) { *f8 = fused_f32_8; *f1 = fused_f32_1; *fm = fusedm_f32; return 1; }
    if (fmt == FMT_Q8_0) { *f8 = fused_q8_0_8; *f1 = fused_q8_0_1; *fm = fusedm_q8_0; return 1; }
    if (fmt == FMT_Q5_0) { *f8 = fused_q5_0_8; *f1 = fused_q5_0_1; *fm = fusedm_q5_0; return 1; }
    return 0;
}



static int64_t panel_rows(int64_t Kp) {
    int64_t r = 65536 / Kp; /* about 256 KB of float32 per panel */
    r = r < 8 ? 8 : r > 64 ? 64 : r;
    return r / 8 * 8;
}

/* The end of panel p of P weight rows (the last panel may be short). */
static int64_t panel_end(int64_t p, int64_t P, int64_t N) { return N - p * P < P ? N : p * P + P; }

/* y[M][N] (row stride ldy) = x[M][K] (row stride ldx) @ W^T, W given as N rows of row_bytes in `fmt`. */
int kv_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
              float *y, int64_t ldy, int threads) {
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0 || M < 0 || N < 0 || K <= 0) return -1;
    const int64_t Kp = pad16(K), P = panel_rows(Kp), panels = (N + P - 1) / P;
    fused_fn f8, f1;
    fusedm_fn fm;
    const int fused = fused_for(fmt, K, &f8, &f1, &fm);
    if (fused && M > 1 && M <= FUSEDM_MAX_ROWS) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
        for (int64_t p = 0; p < panels; p++) fm(x, M, ldx, w, rb, K, p * P, panel_end(p, P, N), y, ldy);
        return 0;
    }
    if (fused && M == 1) { /* one row: no panel, each weight is read once anyway */
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t end = panel_end(p, P, N);
            int64_t n = p * P;
            for (; n + 8 <= end; n += 8) f8(x, w + n * rb, rb, K, y + n);
            for (; n < end; n++) f1(x, w + n * rb, rb, K, y + n);
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
                for (; r + 4 <= rows; r += 4) tile_1_4(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
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


#else /* portable: the definition itself, each thread a share of the weight rows */

static void dequant_row(int fmt, const uint8_t *src, int64_t K, float *dst) { dequant_row_ref(fmt, src, K, dst); }

int kv_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
              float *y, int64_t ldy, int threads) {
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0 || M < 0 || N < 0 || K <= 0) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *row = calloc((size_t)pad16(K), 4); /* the zeros past K stay: dequant_row writes K values */
        if (!row) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!row) continue;
            dequant_row(fmt, w + n * rb, K, row);
            outputs_ref(x, M, K, ldx, row, y + n, ldy);
        }
        free(row);
    }
    return failed ? -2 : 0;
}

#endif

/* The same products in plain C, one output at a time: the definition, for tests and for the record. */
int kv_linear_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
                  float *y, int64_t ldy) {
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

/* W as float32 [N][K]: `vector` 1 uses the expansion this build's products use, 0 the plain C one. */
int kv_dequant(const uint8_t *w, int fmt, int64_t N, int64_t K, float *out, int vector) {
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0) return -1;
    for (int64_t n = 0; n < N; n++) (vector ? dequant_row : dequant_row_ref)(fmt, w + n * rb, K, out + n * K);
    return 0;
}

/* ---- kvgraft-f32-v2: the rest of a forward on one definition (graft_core/numerics.py) ----------------

   Plain C only (no intrinsics), so that every build of this file computes these with the same operations:
   with -ffp-contract=off and without -ffast-math the compiler may vectorise across independent elements
   but never reorders, contracts or reassociates, so the bytes do not depend on the vector width.
   exp, sin and cos are kvgraft's own (below), computed in double and rounded once to float32: no libm
   entry point whose variant is chosen by the CPU (glibc's ifuncs) decides a bit. floor, ldexp and sqrtf
   are exact or correctly rounded by IEEE-754 and C99 on every machine. */


/* Below this many elements (or multiply-adds / 64) a call runs on the calling thread alone: waking a second
   thread cost milliseconds on a busy machine, more than the work (ATen's grain size is the same). Rows
   are independent, so the split never changes a byte. */
#define SPLIT_MIN 32768

/* e^x in double: x = n ln2 + r (Cody-Waite with fdlibm's two-part ln2), e^r by its Taylor polynomial to
   degree 13 in Horner form (|r| <= 0.347: truncation < 1e-17), times 2^n (exact). */
static double kv_exp_d(double x) {
    if (x != x) return x;
    if (x > 709.78) return INFINITY;
    if (x < -745.2) return 0.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double n = floor(x * 1.44269504088896338700e+00 + 0.5);
    const double r = (x - n * ln2_hi) - n * ln2_lo;
    double p = 1.0 / 6227020800.0; /* 1/13! */
    static const double c[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                 1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                                 1.0 / 24.0,        1.0 / 6.0,        1.0 / 2.0,       1.0,
                                 1.0};
    for (int i = 0; i < 13; i++) p = p * r + c[i];
    if (n < -1021.0 || n > 1023.0) return ldexp(p, (int)n); /* near the ends of double's range */
    /* p * 2^n is exact here (p in [0.7, 1.5), the product a normal double): the bytes ldexp gives, without the call */
    const uint64_t bits = (uint64_t)((int64_t)n + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    return p * scale;
}

float kv_expf(float x) { return (float)kv_exp_d((double)x); }

/* kv_expf for x <= 0 without branches, so that a loop of it vectorises: the same operations on every x
   from -104 to 0 (2^n is a normal double there), and 0 below, where kv_expf rounds e^x < 2^-150 to 0
   as well. The same bytes as kv_expf (tests/test_numerics.py sweeps both). */
static inline float kv_expf_neg(float xf) {
    const double x = xf < -104.0f ? -104.0 : (double)xf;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double n = floor(x * 1.44269504088896338700e+00 + 0.5);
    const double r = (x - n * ln2_hi) - n * ln2_lo;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 1.0 / 2.0;
    p = p * r + 1.0;
    p = p * r + 1.0;
    /* n + 1023 is in [1, 2046]: through int32, whose conversion vectorises on AVX2 (int64's needs AVX-512DQ) */
    const uint64_t bits = (uint64_t)(uint32_t)((int32_t)n + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    const float e = (float)(p * scale);
    return xf < -104.0f ? 0.0f : e;
}

float kv_expf_neg_ref(float x) { return kv_expf_neg(x); }

/* sin and cos of a float32 argument (|x| < 2^20), in double: x = k pi/2 + r with fdlibm's 33-bit parts of
   pi/2 (k * part exact), Taylor polynomials on |r| <= pi/4 (sin to r^19, cos to r^20, Horner in r^2),
   the quadrant from k mod 4. */
static void kv_sincos_d(float xf, double *s_out, double *c_out) {
    const double x = (double)xf;
    const double pio2_1 = 1.57079632673412561417e+00, pio2_2 = 6.07710050630396597660e-11,
                 pio2_2t = 2.02226624879595063154e-21;
    const double k = floor(x * 6.36619772367581382433e-01 + 0.5);
    const double r = ((x - k * pio2_1) - k * pio2_2) - k * pio2_2t, r2 = r * r;
    static const double sin_c[9] = {1.0 / 355687428096000.0, -1.0 / 1307674368000.0, 1.0 / 6227020800.0,
                                    -1.0 / 39916800.0,       1.0 / 362880.0,         -1.0 / 5040.0,
                                    1.0 / 120.0,             -1.0 / 6.0,             1.0};
    static const double cos_c[10] = {-1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0,
                                     1.0 / 479001600.0,         -1.0 / 3628800.0,        1.0 / 40320.0,
                                     -1.0 / 720.0,              1.0 / 24.0,              -1.0 / 2.0,
                                     1.0};
    double ps = -1.0 / 121645100408832000.0, pc = 1.0 / 2432902008176640000.0; /* -1/19!, 1/20! */
    for (int i = 0; i < 9; i++) ps = ps * r2 + sin_c[i];
    for (int i = 0; i < 10; i++) pc = pc * r2 + cos_c[i];
    const double s = r * ps, c = pc;
    switch ((int64_t)k & 3) {
    case 0: *s_out = s; *c_out = c; break;
    case 1: *s_out = c; *c_out = -s; break;
    case 2: *s_out = -s; *c_out = -c; break;
    default: *s_out = -c; *c_out = s; break;
    }
}

/* Rotary tables: for each position p and frequency f, angle = (float)p * inv_freq[f] (one float32
   product, as transformers forms it), cos and sin rounded once to float32, each written twice (the
   halves of head_dim), then times `scaling` (float32). cos, sin: [P][2F]. */
int kv_rotary(const int64_t *pos, int64_t P, const float *inv_freq, int64_t F, float scaling, float *cos_out,
              float *sin_out) {
    if (P < 0 || F <= 0) return -1;
    for (int64_t p = 0; p < P; p++)
        for (int64_t f = 0; f < F; f++) {
            double s, c;
            kv_sincos_d((float)pos[p] * inv_freq[f], &s, &c);
            const float cf = (float)c * scaling, sf = (float)s * scaling;
            cos_out[p * 2 * F + f] = cf;
            cos_out[p * 2 * F + F + f] = cf;
            sin_out[p * 2 * F + f] = sf;
            sin_out[p * 2 * F + F + f] = sf;
        }
    return 0;
}

/* Gemma's RMSNorm of each row: ms = (fma16's dot of the row with itself) / n; r = 1 / sqrtf(ms + eps);
   y = (x * r) * (1 + w). */
int kv_rmsnorm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y, int threads) {
    if (rows < 0 || n <= 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (rows * n >= SPLIT_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * n;
        float s[16] = {0};
        for (int64_t k = 0; k < n; k += 16)
            for (int j = 0; j < 16; j++) s[j] = fmaf(k + j < n ? xi[k + j] : 0.0f, k + j < n ? xi[k + j] : 0.0f, s[j]);
        const float r = 1.0f / sqrtf(reduce16_ref(s) / (float)n + eps);
        for (int64_t k = 0; k < n; k++) y[i * n + k] = (xi[k] * r) * (1.0f + w[k]);
    }
    return 0;
}

/* GELU, tanh form, in double, rounded once: u = sqrt(2/pi) (x + 0.044715 x^3); 0.5 x (1 + tanh u) is
   written as x / (1 + e^(-2u)), the same function without the cancellation of 1 + tanh u for u < 0. */
static float gelu_ref(float xf) {
    const double v = (double)xf;
    const double u = 7.97884560802865355880e-01 * (v + 4.47150000000000022782e-02 * ((v * v) * v));
    return (float)(v / (1.0 + kv_exp_d(-2.0 * u)));
}

float kv_gelu_ref(float x) { return gelu_ref(x); }

/* gelu_ref without branches, so that its loop vectorises: e^z for z = -2u clamped to [-708, 708] (2^n a
   normal double there, the operations of kv_exp_d), and e = inf above 709.78 as kv_exp_d gives. Outside
   the clamp both give the same float: z > 708 makes v / (1 + e) round to -0 (or -inf / inf = NaN for
   v = -inf, kept by the inf), z < -708 makes 1 + e = 1. tests/test_numerics.py sweeps both. */
static inline float gelu_one(float xf) {
    const double v = (double)xf;
    const double u = 7.97884560802865355880e-01 * (v + 4.47150000000000022782e-02 * ((v * v) * v));
    const double z = -2.0 * u;
    const double x = z > 708.0 ? 708.0 : (z < -708.0 ? -708.0 : z);
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double n = floor(x * 1.44269504088896338700e+00 + 0.5);
    const double r = (x - n * ln2_hi) - n * ln2_lo;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 1.0 / 2.0;
    p = p * r + 1.0;
    p = p * r + 1.0;
    /* n + 1023 is in [1, 2046]: through int32, whose conversion vectorises on AVX2 (int64's needs AVX-512DQ) */
    const uint64_t bits = (uint64_t)(uint32_t)((int32_t)n + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    const double e = z > 709.78 ? INFINITY : p * scale;
    return (float)(v / (1.0 + e));
}

float kv_gelu_one(float x) { return gelu_one(x); }

int kv_gelu_tanh(const float *x, int64_t n, float *y, int threads) {
    if (n < 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (n >= SPLIT_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gelu_one(x[i]);
    return 0;
}

/* ---- the retrieval embedder's layer norm and erf GELU (retrieval/encoder.py), in the same plain C ----------- */

/* LayerNorm of each row: mean = (the row's sum in fma16's order: 16 lanes, then the fixed tree) / n;
   d = x - mean; var = (fma16's dot of d with itself) / n; r = 1 / sqrtf(var + eps); y = (d * r) * w + b. */
int kv_layernorm(const float *x, int64_t rows, int64_t n, const float *w, const float *b, float eps, float *y, int threads) {
    if (rows < 0 || n <= 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (rows * n >= SPLIT_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * n;
        float *yi = y + i * n;
        float s[16] = {0};
        for (int64_t k = 0; k < n; k += 16)
            for (int j = 0; j < 16; j++) s[j] = fmaf(k + j < n ? xi[k + j] : 0.0f, 1.0f, s[j]);
        const float mean = reduce16_ref(s) / (float)n;
        float q[16] = {0};
        for (int64_t k = 0; k < n; k += 16)
            for (int j = 0; j < 16; j++) {
                const float d = k + j < n ? xi[k + j] - mean : 0.0f;
                q[j] = fmaf(d, d, q[j]);
            }
        const float r = 1.0f / sqrtf(reduce16_ref(q) / (float)n + eps);
        for (int64_t k = 0; k < n; k++) yi[k] = ((xi[k] - mean) * r) * w[k] + b[k];
    }
    return 0;
}

/* GELU, erf form, in double, rounded once: x Phi(x) = 0.5 x (1 + erf(t)), t = x / sqrt 2, a = |t| clamped to 4,
   from two polynomials in the power basis of s in [-1, 1] (scripts/erf_coefficients.py: Chebyshev fits,
   Horner form here):
     a <= 1:  erf(t) = t A(s), s = 2 t^2 - 1                  (A: degree 11, error 7e-16)
     a > 1:   erfc(a) = e^(-a^2) B(s), s = (2a - 5) / 3       (B: degree 20, error 7e-15 relative)
   so 1 + erf(t) is 1 + t A for a <= 1, erfc(a) for t < -1 (no cancellation) and 2 - erfc(a) for t > 1;
   e^(-a^2) by kv_exp_d's operations (a <= 4: 2^n a normal double, so no branch). For t > 4 the float is x
   itself (erfc(4) / 2 < 8e-9, below half an ulp), for t < -4 it is -0 (|x Phi(x)| < 5e-8 there), a NaN is
   itself. Both pieces are computed for every element and one is selected, so that the loop vectorises. */
static const double erf_a[12] = { /* s^0 first */
    0.9654687386698675, -0.1405360890227172, 0.019852496688986938, -0.0022854855611357766, 0.00021751715601743752, -1.7537169499810805e-05, 1.2233828096782525e-06, -7.511554574867454e-08, 4.1157025426899375e-09, -2.0367876290755983e-10, 9.229999679960241e-12, -3.212644014366387e-13};
static const double erfc_b[21] = { /* s^0 first */
    0.21080636406114375, -0.11152102018467623, 0.05611049344494688, -0.027005296665753575, 0.012489373880645686, -0.005570706153870793, 0.0024036476681092837, -0.001005831697800622, 0.00040908498082991776, -0.00016201036568824504, 6.257873971725217e-05, -2.3614027325730628e-05, 8.713113123174969e-06, -3.1382621219530745e-06, 1.1106605397144171e-06, -3.9789094240983456e-07, 1.3606223764843504e-07, -3.593362252960036e-08, 1.1665995495712414e-08, -8.083569808585693e-09, 2.613145362554512e-09};

static inline float gelu_erf_one(float xf) {
    const double v = (double)xf;
    const double t0 = v * 7.07106781186547524401e-01;
    const double t = t0 > 4.0 ? 4.0 : (t0 < -4.0 ? -4.0 : t0);
    const double a = t < 0.0 ? -t : t;
    const double sa = 2.0 * (t * t) - 1.0, sb = (2.0 * a - 5.0) / 3.0;
    double pa = erf_a[11], pb = erfc_b[20];
#pragma GCC unroll 11
    for (int k = 10; k >= 0; k--) pa = pa * sa + erf_a[k];
#pragma GCC unroll 20
    for (int k = 19; k >= 0; k--) pb = pb * sb + erfc_b[k];
    const double x = -(t * t);
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double n = floor(x * 1.44269504088896338700e+00 + 0.5);
    const double r = (x - n * ln2_hi) - n * ln2_lo;
    double e = 1.0 / 6227020800.0;
    e = e * r + 1.0 / 479001600.0;
    e = e * r + 1.0 / 39916800.0;
    e = e * r + 1.0 / 3628800.0;
    e = e * r + 1.0 / 362880.0;
    e = e * r + 1.0 / 40320.0;
    e = e * r + 1.0 / 5040.0;
    e = e * r + 1.0 / 720.0;
    e = e * r + 1.0 / 120.0;
    e = e * r + 1.0 / 24.0;
    e = e * r + 1.0 / 6.0;
    e = e * r + 1.0 / 2.0;
    e = e * r + 1.0;
    e = e * r + 1.0;
    /* 2^n, n in [-23, 0], without a double -> int64 conversion (AVX2 has none, and the loop would not vectorise
       there): n + 1.5 2^52 is exact and holds 2^51 + n in its low bits; the exponent field is their low 11 bits
       + 1023 (2^51 is 0 modulo 2^12). The same 2^n, integer operations only. */
    const double shifted = n + 6755399441055744.0;
    uint64_t bits;
    memcpy(&bits, &shifted, 8);
    bits = (bits + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    const double erfc = (e * scale) * pb;
    const double one_plus_erf = a <= 1.0 ? 1.0 + t * pa : (t < 0.0 ? erfc : 2.0 - erfc);
    const double y = v * (0.5 * one_plus_erf);
    /* a NaN is returned as it came: arithmetic on it may give either sign (which operand's NaN an instruction
       keeps follows the operand order the compiler chose, which may differ between builds) */
    return v != v ? xf : (float)(t0 < -4.0 ? -0.0 : y);
}

float kv_gelu_erf_one(float x) { return gelu_erf_one(x); }

int kv_gelu_erf(const float *x, int64_t n, float *y, int threads) {
    if (n < 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (n >= SPLIT_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gelu_erf_one(x[i]);
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
   `attend_row_ref` is the definition, one operation at a time; the vector builds compute the same
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
    float m = -INFINITY;
    if (keep) {
        for (int64_t j = j0; j < j1; j++) m = keep[j] && t[j] > m ? t[j] : m;
    } else {
        for (int64_t j = j0; j < j1; j++) m = t[j] > m ? t[j] : m;
    }
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

#define ATT_PB 16 /* query positions per block: their heads' rows share the keys' loads */

#ifdef FMA16_VECTOR
#if defined(FMA16_AVX512)
static inline v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
#define QK_R 4 /* query rows x keys per tile of dot products: 16 accumulators of AVX-512's 32 registers */
#define QK_C 4
#define PV_H 4 /* probability rows x 16-value chunks per tile of P.V */
#define PV_C 4
#define PV_WIDE_VALUES 64 /* values of a wide P.V call (PV_C chunks of 16); a narrow one takes 16 */
#else
static inline v16 v_add(v16 a, v16 b) { return v_of(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
#define QK_R 4 /* AVX2: one half of the lanes at a time (QK_HALVES): 12 accumulators of its 16 registers */
#define QK_C 3
#define PV_H 4 /* AVX2: P.V by halves of 16 values (PV_HALVES): 4 rows x 3 chunks of 8 values */
#define PV_WIDE_VALUES 24 /* three chunks of 8 values; a narrow call takes 16 (two) */
#endif

/* R query rows q[r] against the C keys from k (row stride lk), D a multiple of 16: t[r][j + c]. */
#define QK(R, C)                                                                                              \
    static void qk_##R##_##C(const float *const *q, const float *k, int64_t lk, int64_t D, float *const *t,   \
                             int64_t j) {                                                                     \
        v16 acc[R][C];                                                                                        \
        for (int r = 0; r < R; r++)                                                                           \
            for (int c = 0; c < C; c++) acc[r][c] = v_zero();                                                 \
        for (int64_t d = 0; d < D; d += 16) {                                                                 \
            v16 kv[C];                                                                                        \
            for (int c = 0; c < C; c++) kv[c] = v_load(k + c * lk + d);                                       \
            for (int r = 0; r < R; r++) {                                                                     \
                const v16 qv = v_load(q[r] + d);                                                              \
                for (int c = 0; c < C; c++) acc[r][c] = v_fmadd(qv, kv[c], acc[r][c]);                        \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < R; r++)                                                                           \
            for (int c = 0; c < C; c++) t[r][j + c] = reduce16(acc[r][c]);                                    \
    }

/* H probability rows p[h] (indexed by key) against the values v (row stride lv) over keys [j0, j1), the C
   chunks of 16 values from d0: y[h][d0 .. d0 + 16C). Lane L holds the keys j0 + L + 16i (j0 a multiple of
   16: lane j mod 16), each lane's fmaf chain in increasing j, then the tree over lanes, value by value. */
#define PV(H, C)                                                                                              \
    static void pv_##H##_##C(const float *const *p, const kv_rows *kv, int64_t j0, int64_t j1, int64_t d0,    \
                             float *lanes, float *const *y) {                                                 \
        for (int L = 0; L < 16; L++) {                                                                        \
            v16 acc[H][C];                                                                                    \
            for (int h = 0; h < H; h++)                                                                       \
                for (int c = 0; c < C; c++) acc[h][c] = v_zero();                                             \
            for (int64_t j = j0 + L; j < j1; j += 16) {                                                       \
                v16 vv[C];                                                                                    \
                const float *vr = value_row(kv, j) + d0;                                                      \
                for (int c = 0; c < C; c++) vv[c] = v_load(vr + 16 * c);                                      \
                for (int h = 0; h < H; h++) {                                                                 \
                    const v16 pp = v_set1(p[h][j]);                                                           \
                    for (int c = 0; c < C; c++) acc[h][c] = v_fmadd(pp, vv[c], acc[h][c]);                    \
                }                                                                                             \
            }                                                                                                 \
            for (int h = 0; h < H; h++)                                                                       \
                for (int c = 0; c < C; c++) v_store(lanes + ((L * H + h) * C + c) * 16, acc[h][c]);           \
        }                                                                                                     \
        for (int h = 0; h < H; h++)                                                                           \
            for (int c = 0; c < C; c++) {                                                                     \
                v16 x[16];                                                                                    \
                for (int L = 0; L < 16; L++) x[L] = v_load(lanes + ((L * H + h) * C + c) * 16);               \
                for (int L = 0; L < 8; L++) x[L] = v_add(x[L], x[L + 8]);                                     \
                for (int L = 0; L < 4; L++) x[L] = v_add(x[L], x[L + 4]);                                     \
                for (int L = 0; L < 2; L++) x[L] = v_add(x[L], x[L + 2]);                                     \
                v_store(y[h] + d0 + 16 * c, v_add(x[0], x[1]));                                               \
            }                                                                                                 \
    }

typedef void (*qk_fn)(const float *const *, const float *, int64_t, int64_t, float *const *, int64_t);
typedef void (*pv_fn)(const float *const *, const kv_rows *, int64_t, int64_t, int64_t, float *, float *const *);
#if defined(FMA16_AVX512)
QK(1, 4) QK(2, 4) QK(3, 4) QK(4, 4) QK(1, 1) QK(2, 1) QK(3, 1) QK(4, 1)
PV(1, 4) PV(2, 4) PV(3, 4) PV(4, 4) PV(1, 1) PV(2, 1) PV(3, 1) PV(4, 1)
static const qk_fn QK_WIDE[QK_R + 1] = {0, qk_1_4, qk_2_4, qk_3_4, qk_4_4};
static const qk_fn QK_ONE[QK_R + 1] = {0, qk_1_1, qk_2_1, qk_3_1, qk_4_1};
static const pv_fn PV_WIDE[PV_H + 1] = {0, pv_1_4, pv_2_4, pv_3_4, pv_4_4};
static const pv_fn PV_ONE[PV_H + 1] = {0, pv_1_1, pv_2_1, pv_3_1, pv_4_1};
#else
QK(1, 1) QK(2, 1) QK(3, 1) QK(4, 1)
/* AVX2: lanes 0-7 of the tile's dot products over all of D, then lanes 8-15 (as TILE_HALVES does for the
   products): each lane's fmaf chain is the one a v16 accumulator holds, in the same order, and the halves
   meet in reduce16, so the same bits; 8-lane accumulators fit a 4 x 3 tile in 16 registers instead of 2 x 2. */
#define QK_HALVES(R, C)                                                                                       \
    static void qk_##R##_##C(const float *const *q, const float *k, int64_t lk, int64_t D, float *const *t,   \
                             int64_t j) {                                                                     \
        __m256 part[2][R][C];                                                                                 \
        for (int h = 0; h < 2; h++) {                                                                         \
            __m256 acc[R][C];                                                                                 \
            for (int r = 0; r < R; r++)                                                                       \
                for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();                                  \
            for (int64_t d = 8 * h; d < D; d += 16) {                                                         \
                __m256 kv[C];                                                                                 \
                for (int c = 0; c < C; c++) kv[c] = _mm256_loadu_ps(k + c * lk + d);                          \
                for (int r = 0; r < R; r++) {                                                                 \
                    const __m256 qv = _mm256_loadu_ps(q[r] + d);                                              \
                    for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);            \
                }                                                                                             \
            }                                                                                                 \
            for (int r = 0; r < R; r++)                                                                       \
                for (int c = 0; c < C; c++) part[h][r][c] = acc[r][c];                                        \
        }                                                                                                     \
        for (int r = 0; r < R; r++)                                                                           \
            for (int c = 0; c < C; c++) t[r][j + c] = reduce16(v_of(part[0][r][c], part[1][r][c]));           \
    }
QK_HALVES(1, 3) QK_HALVES(2, 3) QK_HALVES(3, 3) QK_HALVES(4, 3)
static const qk_fn QK_WIDE[QK_R + 1] = {0, qk_1_3, qk_2_3, qk_3_3, qk_4_3};
static const qk_fn QK_ONE[QK_R + 1] = {0, qk_1_1, qk_2_1, qk_3_1, qk_4_1};
/* AVX2's P.V by chunks of 8 values: each value's lane chains (lane L: keys j0 + L + 16i, fmaf in increasing
   j) and its tree over the lanes are the ones PV computes for it in a 16-value chunk, so the same bits;
   8-value accumulators fit 4 probability rows x 3 chunks in AVX2's 16 registers instead of 2 x 2 v16. */
#define PV_HALVES(H, C)                                                                                       \
    static void pvh_##H##_##C(const float *const *p, const kv_rows *kv, int64_t j0, int64_t j1, int64_t d0,   \
                              float *lanes, float *const *y) {                                                \
        for (int L = 0; L < 16; L++) {                                                                        \
            __m256 acc[H][C];                                                                                 \
            for (int h = 0; h < H; h++)                                                                       \
                for (int c = 0; c < C; c++) acc[h][c] = _mm256_setzero_ps();                                  \
            for (int64_t j = j0 + L; j < j1; j += 16) {                                                       \
                __m256 vv[C];                                                                                 \
                const float *vr = value_row(kv, j) + d0;                                                      \
                for (int c = 0; c < C; c++) vv[c] = _mm256_loadu_ps(vr + 8 * c);                              \
                for (int h = 0; h < H; h++) {                                                                 \
                    const __m256 pp = _mm256_set1_ps(p[h][j]);                                                \
                    for (int c = 0; c < C; c++) acc[h][c] = _mm256_fmadd_ps(pp, vv[c], acc[h][c]);            \
                }                                                                                             \
            }                                                                                                 \
            for (int h = 0; h < H; h++)                                                                       \
                for (int c = 0; c < C; c++) _mm256_storeu_ps(lanes + ((L * H + h) * C + c) * 8, acc[h][c]);  \
        }                                                                                                     \
        for (int h = 0; h < H; h++)                                                                           \
            for (int c = 0; c < C; c++) {                                                                     \
                __m256 x[16];                                                                                 \
                for (int L = 0; L < 16; L++) x[L] = _mm256_loadu_ps(lanes + ((L * H + h) * C + c) * 8);       \
                for (int L = 0; L < 8; L++) x[L] = _mm256_add_ps(x[L], x[L + 8]);                             \
                for (int L = 0; L < 4; L++) x[L] = _mm256_add_ps(x[L], x[L + 4]);                             \
                for (int L = 0; L < 2; L++) x[L] = _mm256_add_ps(x[L], x[L + 2]);                             \
                _mm256_storeu_ps(y[h] + d0 + 8 * c, _mm256_add_ps(x[0], x[1]));                               \
            }                                                                                                 \
    }
PV_HALVES(1, 3) PV_HALVES(2, 3) PV_HALVES(3, 3) PV_HALVES(4, 3)
PV_HALVES(1, 2) PV_HALVES(2, 2) PV_HALVES(3, 2) PV_HALVES(4, 2)
static const pv_fn PV_WIDE[PV_H + 1] = {0, pvh_1_3, pvh_2_3, pvh_3_3, pvh_4_3};
static const pv_fn PV_ONE[PV_H + 1] = {0, pvh_1_2, pvh_2_2, pvh_3_2, pvh_4_2};
#endif

/* How many wide P.V calls (PV_WIDE_VALUES values each) cover the start of D values (D a multiple of 16), the
   rest going in narrow calls of 16: the most that leave a multiple of 16. */
static inline int64_t pv_wide_calls(int64_t D) {
    int64_t a = D / PV_WIDE_VALUES;
    while (a > 0 && (D - a * PV_WIDE_VALUES) % 16) a--;
    return a;
}

/* Query positions [i0, i0 + n) of H heads, D a multiple of 16 (t: H * ATT_PB rows of sk floats; lanes:
   16 * 4 * 4 * 16 floats, the widest P.V tile of either build). The dot products of every row over the union of the rows' ranges R (a
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
            const int64_t d0 = c < wide ? c * PV_WIDE_VALUES : wide * PV_WIDE_VALUES + (c - wide) * 16;
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
#endif

/* Attention of H query heads that share one key/value head: q row (h, i) at q + h q_hs + i q_ss (D values,
   contiguous), key j at k + j k_ss, value j at v + j v_ss, output row (h, i) at y + h y_hs + i y_ss; the
   mask row of position i (shared by the heads) at keep + i m_ss (uint8, 1: attend) or add + i m_ss (float,
   added to the scaled score), or neither (every key). The definition above for every row; `reference` 1
   computes it one operation at a time (attend_row_ref), as the portable build always does. Blocks of
   positions are split over `threads`; that never changes a byte. `attention` takes the keys and values in
   segments (kv_rows), kv_attention in one. */
static int attention(const float *q, int64_t H, int64_t sq, int64_t D, int64_t q_hs, int64_t q_ss, const kv_rows *kv,
                     int64_t sk, const uint8_t *keep, const float *add, int64_t m_ss, float scale, float *y, int64_t y_hs,
                     int64_t y_ss, int threads, int reference) {
    if (H <= 0 || H > 64 || sq < 0 || D <= 0 || sk <= 0 || (keep && add)) return -1;
#ifdef FMA16_VECTOR
    const int vector = !reference && D % 16 == 0;
#else
    const int vector = 0;
    (void)reference;
#endif
#ifdef FMA16_VECTOR
    if (vector && sq == 1 && threads > 1 && (double)sk * (double)(D * H) >= 16.0 * SPLIT_MIN) /* 512 keys of 4 x 256 */
        return attend_single(q, H, D, q_hs, kv, sk, keep, add, scale, y, y_hs, threads);
#endif
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
#ifdef FMA16_VECTOR
                attend_block(q, H, i0, n, D, q_hs, q_ss, kv, sk, keep, add, m_ss, scale, y, y_hs, y_ss, t, lanes);
#endif
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

/* ---- a decode step's layers in one call (graft_core/step.py) -----------------------------------------

   The layers of a Gemma 3 decoder for S sessions' new rows (one each for a decode step, a prompt's for a
   prefill), each operation the one the model's
   modules run one call at a time (graft_core.batch.Batcher._pass, itself checked against transformers'
   forward): kv_rmsnorm, kv_linear, the rotary embedding as ATen computes q * cos + rotate_half(q) * sin
   (rotate_half(q) = cat(-q2, q1); three float32 operations per element), kv_attention over the session's
   cached rows and the new one, GELU(gate) * up, and the residual adds. Nothing is reordered or fused, so
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
} kv_layer;

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
        rc |= kv_rmsnorm(x, M, E, y->norm[0], y->eps, h, threads);
        rc |= kv_linear(h, M, E, E, y->w[0], y->fmt[0], QD, q, QD, threads);
        rc |= kv_linear(h, M, E, E, y->w[1], y->fmt[1], KD, kk, KD, threads);
        rc |= kv_linear(h, M, E, E, y->w[2], y->fmt[2], KD, vv, KD, threads);
        rc |= kv_rmsnorm(q, M * H, D, y->norm[1], y->eps, qr, threads);
        rc |= kv_rmsnorm(kk, M * G, D, y->norm[2], y->eps, kr, threads);
        const int64_t group = H / G;
        for (int64_t s = 0, m0 = 0; s < S && !rc; m0 += rows[s], s++) {
            const int64_t c = l * S + s, T = rows[s];
            if (end[c] + T > cap[c]) { rc = -3; break; }
            for (int64_t r = 0; r < T; r++) { /* every new key/value row first: row r attends rows up to end + r */
                const float *cs = cos[c] + r * D, *sn = sin[c] + r * D;
                for (int64_t hh = 0; hh < H; hh++)
                    rotate_row(qr + (m0 + r) * QD + hh * D, cs, sn, D, q + (m0 + r) * QD + hh * D);
                for (int64_t gg = 0; gg < G; gg++) {
                    const int64_t at = (gg * cap[c] + end[c] + r) * D;
                    rotate_row(kr + (m0 + r) * KD + gg * D, cs, sn, D, kbuf[c] + at);
                    memcpy(vbuf[c] + at, vv + (m0 + r) * KD + gg * D, (size_t)D * 4);
                }
            }
            /* the rows row r sees, counted from the first one held (shared rows, then the buffer's from `start`):
               every held one and the new ones up to it, or within a sliding window those less than `window`
               positions back */
            const int64_t w = window[l], held = bn[c] + end[c] - start[c];
#define ROW_LO(r) (w > 0 && held + (r) - w + 1 > 0 ? held + (r) - w + 1 : 0)
#define ROWS_FROM(lo, gg) held_rows(bk[c], bv[c], bcap[c], bn[c], kbuf[c], vbuf[c], cap[c], start[c], gg, D, lo)
            if (T == 1) {
                const int64_t lo = ROW_LO(0);
                for (int64_t gg = 0; gg < G && !rc; gg++) {
                    const kv_rows kv = ROWS_FROM(lo, gg);
                    rc |= attention(q + m0 * QD + gg * group * D, group, 1, D, D, QD, &kv, held - lo + 1, 0, 0, 0, y->scale,
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
                rc |= attention(q + m0 * QD + gg * group * D, group, T, D, D, QD, &kv, n, keep, 0, n, y->scale,
                                att + m0 * QD + gg * group * D, D, QD, threads, 0);
            }
#undef ROWS_FROM
            free(keep);
        }
        rc |= kv_linear(att, M, QD, QD, y->w[3], y->fmt[3], E, o, E, threads);
        rc |= kv_rmsnorm(o, M, E, y->norm[3], y->eps, h, threads);
        for (int64_t i = 0; i < M * E; i++) x[i] = x[i] + h[i];
        rc |= kv_rmsnorm(x, M, E, y->norm[4], y->eps, h, threads);
        rc |= kv_linear(h, M, E, E, y->w[5], y->fmt[5], I, u, I, threads);
        rc |= kv_linear(h, M, E, E, y->w[4], y->fmt[4], I, g, I, threads);
        rc |= kv_gelu_tanh(g, M * I, g, threads);
        for (int64_t i = 0; i < M * I; i++) g[i] = g[i] * u[i];
        rc |= kv_linear(g, M, I, I, y->w[6], y->fmt[6], E, o, E, threads);
        rc |= kv_rmsnorm(o, M, E, y->norm[5], y->eps, h, threads);
        for (int64_t i = 0; i < M * E; i++) x[i] = x[i] + h[i];
    }
    free(buf);
    return rc;
}
