/* kvgraft's matrix product y = x @ W^T with one fixed order of float32 operations (fma16).

   Every output y[m][n] is computed as:
     16 lanes s[0..15] = +0.0;
     for k0 = 0, 16, 32, ... < K rounded up to 16:        (x and W read as 0 past K)
       for j in 0..15: s[j] = fmaf(x[m][k0+j], W[n][k0+j], s[j])
     t[j] = s[j] + s[j+8] (j<8);  u[j] = t[j] + t[j+4] (j<4);  v[j] = u[j] + u[j+2] (j<2);
     y[m][n] = v[0] + v[1]
   Every step is one correctly rounded IEEE-754 float32 operation, so the bytes of y[m][n] depend on
   the row x[m] and the row W[n] only: not on how many rows a call holds, which rows sit next to it,
   how the work is split between threads, or the machine, as long as it executes these operations
   (the AVX-512 path below and the plain C reference `kv_linear_ref` do; the tests compare them).

   W is either float32 or GGUF blocks that are expanded to float32 first (Q8_0, Q5_0, Q4_K, Q6_K,
   the formats of the packaged model's file). The expansion repeats gguf-py's dequantisation, the one
   the float32 model folder was made with; the loader checks, tensor by tensor, that it gives the
   same bytes as the float32 weights before using it, so a product over blocks equals the product
   over the float32 weights byte for byte, and reads 4-6x fewer bytes.

   Built by graft_core/fma16.py with -ffp-contract=off: nothing here may be fused or reordered. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

enum { FMT_F32 = 0, FMT_Q5_0 = 6, FMT_Q8_0 = 8, FMT_Q4_K = 12, FMT_Q6_K = 14 };

static float half_to_float(uint16_t h) { /* exact, in plain C; the AVX-512 paths use F16C's (also exact) */
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

/* The same expansion with AVX-512: the same operations on 16 values at a time. */
static void dequant_row(int fmt, const uint8_t *src, int64_t K, float *dst) {
    if (fmt == FMT_F32) {
        memcpy(dst, src, (size_t)K * 4);
    } else if (fmt == FMT_Q8_0) {
        for (int64_t b = 0; b < K / 32; b++, src += 34) {
            __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(src)));
            __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 2)));
            __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 18)));
            _mm512_storeu_ps(dst + b * 32, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
            _mm512_storeu_ps(dst + b * 32 + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
        }
    } else if (fmt == FMT_Q5_0) {
        const __m512i fifteen = _mm512_set1_epi32(0xF), sixteen = _mm512_set1_epi32(16);
        for (int64_t b = 0; b < K / 32; b++, src += 22) {
            __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(src)));
            uint32_t qh = (uint32_t)src[2] | ((uint32_t)src[3] << 8) | ((uint32_t)src[4] << 16) | ((uint32_t)src[5] << 24);
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + 6)));
            __m512i lo = _mm512_and_si512(v, fifteen), hi = _mm512_srli_epi32(v, 4);
            lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xFFFF), lo, sixteen);
            hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen);
            lo = _mm512_sub_epi32(lo, sixteen);
            hi = _mm512_sub_epi32(hi, sixteen);
            _mm512_storeu_ps(dst + b * 32, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
            _mm512_storeu_ps(dst + b * 32 + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
        }
    } else if (fmt == FMT_Q4_K) {
        const __m512i fifteen = _mm512_set1_epi32(0xF);
        for (int64_t b = 0; b < K / 256; b++, src += 144) {
            float d = _cvtsh_ss(rd16(src)), dmin = _cvtsh_ss(rd16(src + 2));
            const uint8_t *scales = src + 4, *qs = src + 16;
            for (int c = 0; c < 4; c++) {
                int sc0, m0, sc1, m1;
                q4k_scale_min(scales, 2 * c, &sc0, &m0);
                q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
                __m512 d0 = _mm512_set1_ps(d * (float)sc0), dm0 = _mm512_set1_ps(dmin * (float)m0);
                __m512 d1 = _mm512_set1_ps(d * (float)sc1), dm1 = _mm512_set1_ps(dmin * (float)m1);
                for (int h = 0; h < 2; h++) {
                    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * c + 16 * h)));
                    __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, fifteen));
                    __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
                    _mm512_storeu_ps(dst + b * 256 + 64 * c + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d0, lo), dm0));
                    _mm512_storeu_ps(dst + b * 256 + 64 * c + 32 + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, hi), dm1));
                }
            }
        }
    } else if (fmt == FMT_Q6_K) {
        const __m512i fifteen = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
        for (int64_t b = 0; b < K / 256; b++, src += 210) {
            const uint8_t *ql = src, *qh = src + 128;
            const int8_t *sc = (const int8_t *)(src + 192);
            float d = _cvtsh_ss(rd16(src + 208));
            for (int c = 0; c < 16; c++) { /* 16 weights at i = 16c: one scale */
                int h = c / 8, t = (c % 8) * 16;
                __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + h * 64 + t % 64)));
                __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + h * 32 + t % 32)));
                l = _mm512_and_si512(_mm512_srli_epi32(l, 4 * (t / 64)), fifteen);
                hb = _mm512_and_si512(_mm512_srli_epi32(hb, 2 * (t / 32)), three);
                __m512i q = _mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(hb, 4)), bias);
                __m512 ds = _mm512_set1_ps(d * (float)sc[c]);
                _mm512_storeu_ps(dst + b * 256 + 16 * c, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)));
            }
        }
    }
}

/* The fixed reduction of 16 lanes: halves first (j + 8), then j + 4, j + 2, j + 1. */
static inline float reduce16(__m512 s) {
    __m256 t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

static float reduce16_ref(const float *s) {
    float t[8], u[4], v[2];
    for (int j = 0; j < 8; j++) t[j] = s[j] + s[j + 8];
    for (int j = 0; j < 4; j++) u[j] = t[j] + t[j + 4];
    for (int j = 0; j < 2; j++) v[j] = u[j] + u[j + 2];
    return v[0] + v[1];
}

/* MB rows of x against RB rows of a panel (float32, each padded with zeros to Kp, a multiple of 16). */
#define TILE(MB, RB)                                                                                          \
    static void tile_##MB##_##RB(const float *x, int64_t ldx, const float *w, int64_t Kp, int64_t K, float *y, \
                                 int64_t ldy) {                                                               \
        __m512 acc[MB][RB];                                                                                   \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) acc[m][r] = _mm512_setzero_ps();                                     \
        int64_t k = 0;                                                                                        \
        for (; k + 16 <= K; k += 16) {                                                                        \
            __m512 wv[RB];                                                                                    \
            for (int r = 0; r < RB; r++) wv[r] = _mm512_loadu_ps(w + r * Kp + k);                              \
            for (int m = 0; m < MB; m++) {                                                                    \
                __m512 xv = _mm512_loadu_ps(x + m * ldx + k);                                                 \
                for (int r = 0; r < RB; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);              \
            }                                                                                                 \
        }                                                                                                     \
        if (k < K) {                                                                                          \
            __mmask16 mask = (__mmask16)((1u << (K - k)) - 1);                                                \
            __m512 wv[RB];                                                                                    \
            for (int r = 0; r < RB; r++) wv[r] = _mm512_loadu_ps(w + r * Kp + k);                              \
            for (int m = 0; m < MB; m++) {                                                                    \
                __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * ldx + k);                                     \
                for (int r = 0; r < RB; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);              \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MB; m++)                                                                          \
            for (int r = 0; r < RB; r++) y[m * ldy + r] = reduce16(acc[m][r]);                               \
    }

TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1)
TILE(1, 4) TILE(2, 4) TILE(3, 4) TILE(4, 4)
TILE(1, 8)


/* Sixteen weights of a row, W[n][k0..k0+15], expanded in registers: the same operations as dequant_row. */
static inline __m512 w16_f32(const uint8_t *row, int64_t k0) { return _mm512_loadu_ps((const float *)row + k0); }

static inline __m512 w16_q8_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 34;
    __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(blk)));
    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + (k0 % 32))));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
}

static inline __m512 w16_q5_0(const uint8_t *row, int64_t k0) {
    const uint8_t *blk = row + (k0 / 32) * 22;
    const int high = (k0 % 32) != 0;
    __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(blk)));
    uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 6)));
    v = high ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0xF));
    v = _mm512_mask_or_epi32(v, (__mmask16)(high ? qh >> 16 : qh & 0xFFFF), v, _mm512_set1_epi32(16));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(16))));
}

/* Where the bytes of W[n][k0..] start in a row (the prefetches ask for them two row groups ahead). */
static inline int64_t off_f32(int64_t k) { return 4 * k; }
static inline int64_t off_q8_0(int64_t k) { return k / 32 * 34; }
static inline int64_t off_q5_0(int64_t k) { return k / 32 * 22; }

/* One output row of x (M == 1) against RB weight rows, the weights expanded as they are read. */
#define FUSED(NAME, RB)                                                                                       \
    static void fused_##NAME##_##RB(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {      \
        __m512 acc[RB];                                                                                       \
        for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();                                            \
        for (int64_t k = 0; k < K; k += 16) {                                                                 \
            __m512 xv = _mm512_loadu_ps(x + k);                                                               \
            for (int r = 0; r < RB; r++) {                                                                    \
                _mm_prefetch((const char *)(w + (r + 2 * RB) * rb + off_##NAME(k)), _MM_HINT_T0);            \
                acc[r] = _mm512_fmadd_ps(xv, w16_##NAME(w + r * rb, k), acc[r]);                              \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < RB; r++) y[r] = reduce16(acc[r]);                                                 \
    }
FUSED(f32, 8) FUSED(f32, 1) FUSED(q8_0, 1) FUSED(q5_0, 8) FUSED(q5_0, 1)

/* Q8_0 against 8 rows, a block (two chunks of 16) at a time: one scale per row and block. */
static void fused_q8_0_8(const float *x, const uint8_t *w, int64_t rb, int64_t K, float *y) {
    __m512 acc[8];
    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        const uint8_t *blk = w + (k / 32) * 34;
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++, blk += rb) {
            _mm_prefetch((const char *)(blk + 16 * rb), _MM_HINT_T0); /* two groups of 8 rows ahead */
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(blk)));
            const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
            const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)));
            acc[r] = _mm512_fmadd_ps(x0, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)), acc[r]);
            acc[r] = _mm512_fmadd_ps(x1, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)), acc[r]);
        }
    }
    for (int r = 0; r < 8; r++) y[r] = reduce16(acc[r]);
}


/* MB rows of x against RB weight rows (MB <= 8, RB <= 2), the weights expanded in registers: for few
   rows of x, expanding a weight again per block of 8 rows costs less than a round trip through a panel. */
#define FUSEDM(NAME, MB, RB)                                                                                     \
    static void fusedm_##NAME##_##MB##_##RB(const float *x, int64_t ldx, const uint8_t *w, int64_t rb,         \
                                            int64_t K, float *y, int64_t ldy) {                                \
        __m512 acc[MB][RB];                                                                                    \
        for (int m = 0; m < MB; m++)                                                                           \
            for (int r = 0; r < RB; r++) acc[m][r] = _mm512_setzero_ps();                                      \
        for (int64_t k = 0; k < K; k += 16) {                                                                  \
            __m512 wv[RB];                                                                                     \
            for (int r = 0; r < RB; r++) {                                                                     \
                _mm_prefetch((const char *)(w + (r + 2 * RB) * rb + off_##NAME(k)), _MM_HINT_T0);            \
                wv[r] = w16_##NAME(w + r * rb, k);                                                             \
            }                                                                                                  \
            for (int m = 0; m < MB; m++) {                                                                     \
                const __m512 xv = _mm512_loadu_ps(x + m * ldx + k);                                            \
                for (int r = 0; r < RB; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);              \
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
                if (left >= 8) {                                                                               \
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

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t);
static const tile_fn TILES1[5] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};
static const tile_fn TILES4[5] = {0, tile_1_4, tile_2_4, tile_3_4, tile_4_4};

static int64_t pad16(int64_t K) { return (K + 15) / 16 * 16; }

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
                for (; r + 8 <= rows; r += 8) tile_1_8(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                for (; r + 4 <= rows; r += 4) tile_1_4(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                for (; r < rows; r++) tile_1_1(x, ldx, buf + r * Kp, Kp, K, y + n0 + r, ldy);
                continue;
            }
            for (int64_t m = 0; m < M; m += 4) {
                const int64_t mb = M - m < 4 ? M - m : 4;
                int64_t r = 0;
                for (; r + 4 <= rows; r += 4) TILES4[mb](x + m * ldx, ldx, buf + r * Kp, Kp, K, y + m * ldy + n0 + r, ldy);
                for (; r < rows; r++) TILES1[mb](x + m * ldx, ldx, buf + r * Kp, Kp, K, y + m * ldy + n0 + r, ldy);
            }
        }
        free(buf);
    }
    return failed ? -2 : 0;
}

/* The same products in plain C, one output at a time: the definition, for tests and for the record. */
int kv_linear_ref(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int fmt, int64_t N,
                  float *y, int64_t ldy) {
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0 || M < 0 || N < 0 || K <= 0) return -1;
    const int64_t Kp = pad16(K);
    float *row = calloc((size_t)Kp, 4);
    if (!row) return -2;
    for (int64_t n = 0; n < N; n++) {
        dequant_row_ref(fmt, w + n * rb, K, row);
        for (int64_t m = 0; m < M; m++) {
            float s[16] = {0};
            for (int64_t k = 0; k < Kp; k += 16)
                for (int j = 0; j < 16; j++) s[j] = fmaf(k + j < K ? x[m * ldx + k + j] : 0.0f, row[k + j], s[j]);
            y[m * ldy + n] = reduce16_ref(s);
        }
    }
    free(row);
    return 0;
}

/* W as float32 [N][K]: `vector` 1 uses the AVX-512 expansion the products use, 0 the plain C one. */
int kv_dequant(const uint8_t *w, int fmt, int64_t N, int64_t K, float *out, int vector) {
    int64_t rb = kv_row_bytes(fmt, K);
    if (rb < 0) return -1;
    for (int64_t n = 0; n < N; n++) (vector ? dequant_row : dequant_row_ref)(fmt, w + n * rb, K, out + n * K);
    return 0;
}
