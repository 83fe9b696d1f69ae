/* Portable primitives: plain C, any CPU. v16 is 16 floats in memory and every primitive is a loop over the
   lanes of the IEEE operation simd.h names (fmaf from math.h is correctly rounded), so the shared operations
   compute on it exactly what they compute in registers on AVX-512 and AVX2. Built without ISA flags. */

#define KV_ISA_NAME "portable"

typedef struct {
    float l[16];
} v16;
static inline v16 v_zero(void) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = 0.0f;
    return r;
}
static inline v16 v_set1(float a) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = a;
    return r;
}
static inline v16 v_load(const float *p) {
    v16 r;
    memcpy(r.l, p, sizeof r.l);
    return r;
}
static inline v16 v_load_first(const float *p, int64_t n) { /* lanes 0..n-1 from p, the rest 0 (n < 16) */
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = j < n ? p[j] : 0.0f;
    return r;
}
static inline void v_store(float *p, v16 a) { memcpy(p, a.l, sizeof a.l); }
static inline v16 v_fmadd(v16 a, v16 b, v16 c) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = fmaf(a.l[j], b.l[j], c.l[j]);
    return r;
}
static inline v16 v_mul(v16 a, v16 b) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = a.l[j] * b.l[j];
    return r;
}
static inline v16 v_sub(v16 a, v16 b) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = a.l[j] - b.l[j];
    return r;
}
static inline v16 v_add(v16 a, v16 b) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = a.l[j] + b.l[j];
    return r;
}
static inline float reduce16(v16 s) { return reduce16_ref(s.l); }
static inline float h2f(const uint8_t *p) { return half_to_float(rd16(p)); }
static inline void v_prefetch(const void *p) { (void)p; }

static inline v16 q_i8(const uint8_t *p) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = (float)(int8_t)p[j];
    return r;
}
static inline v16 q_nibbles(const uint8_t *p, int high) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = (float)(high ? p[j] >> 4 : p[j] & 0xF);
    return r;
}
static inline v16 q_lut(v16 table, const uint8_t *p, int high) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = table.l[high ? p[j] >> 4 : p[j] & 0xF];
    return r;
}
static inline v16 q_q5(const uint8_t *p, int high, uint32_t bits) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = (float)(((high ? p[j] >> 4 : p[j] & 0xF) | (int)(((bits >> j) & 1) << 4)) - 16);
    return r;
}
static inline v16 q_k4scales(const uint8_t *s) {
    v16 r;
    for (int j = 0; j < 4; j++) {
        r.l[j] = (float)(s[j] & 63), r.l[8 + j] = (float)(s[j + 4] & 63);
        r.l[4 + j] = (float)((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
        r.l[12 + j] = (float)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
    return r;
}
static inline v16 q_q6(const uint8_t *ql, int ls, const uint8_t *qh, int hs) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = (float)((((ql[j] >> ls) & 0xF) | (((qh[j] >> hs) & 3) << 4)) - 32);
    return r;
}
static inline void q_q6x128(const uint8_t *ql, const uint8_t *qh, int8_t *out) {
    for (int t = 0; t < 128; t++)
        out[t] = (int8_t)((((ql[t % 64] >> 4 * (t / 64)) & 0xF) | (((qh[t % 32] >> 2 * (t / 32)) & 3) << 4)) - 32);
}

/* A part is the whole v16, as on AVX-512. */
#define VP_LANES 16
#define VP_PARTS 1
typedef v16 vp;
static inline vp vp_zero(void) { return v_zero(); }
static inline vp vp_set1(float a) { return v_set1(a); }
static inline vp vp_load(const float *p) { return v_load(p); }
static inline void vp_store(float *p, vp a) { v_store(p, a); }
static inline vp vp_fmadd(vp a, vp b, vp c) { return v_fmadd(a, b, c); }
static inline vp vp_add(vp a, vp b) { return v_add(a, b); }
static inline vp v_part(v16 a, int h) { (void)h; return a; }
static inline v16 v_join(vp first, vp last) { (void)last; return first; }

#define KV_LUT16 1 /* q_lut where a format could compute per lane instead (a loop either way) */

/* Tile shapes: AVX-512's (no registers to fit here; the shapes change no byte). */
#define PANEL_RB 4
#define FUSEDM_TOP 8
#define FUSED256_RB 8
#define QK_C 4
#define PV_WIDE_C 4
#define PV_PAIR_H 0  /* no P.V tile takes two lanes a pass */

/* ---- the integer products (int8.c): loops over the bytes, int16 pairs and int32 lanes of the AVX builds ---- */
typedef struct {
    int8_t b[64];
} vb;
typedef struct {
    int16_t s[32];
} vs;
typedef struct {
    int32_t i[16];
} vi;
typedef vb vsg;
typedef struct {
    int16_t s[8];
} vm;
typedef struct {
    float l[4];
} v4;
static inline vb vb_load(const void *p) {
    vb r;
    memcpy(r.b, p, 64);
    return r;
}
static inline vb vb_load2(const void *p0, const void *p1) {
    vb r;
    memcpy(r.b, p0, 32);
    memcpy(r.b + 32, p1, 32);
    return r;
}
static inline vb vb_nib(vb v, int high) {
    for (int j = 0; j < 64; j++) v.b[j] = (int8_t)(high ? (uint8_t)v.b[j] >> 4 : v.b[j] & 0xF);
    return v;
}
static inline vb vb_abs(vb w) { /* -128 stays 0x80: 128 read unsigned */
    for (int j = 0; j < 64; j++) w.b[j] = (int8_t)(uint8_t)(w.b[j] < 0 ? 0u - (uint8_t)w.b[j] : (uint8_t)w.b[j]);
    return w;
}
static inline vsg vb_sign(vb w) { return w; }
static inline vi vi_zero(void) {
    vi r;
    memset(&r, 0, sizeof r);
    return r;
}
static inline vi vi_add(vi a, vi b) {
    for (int j = 0; j < 16; j++) a.i[j] += b.i[j];
    return a;
}
static inline int32_t sat16(int32_t v) { return v > 32767 ? 32767 : v < -32768 ? -32768 : v; }
static inline vi vi_dot(vb w, vb x, vs s) { /* maddubs (w unsigned, x signed, saturated pair sums), then madd */
    vi r;
    for (int L = 0; L < 16; L++) {
        int32_t t = 0;
        for (int h = 0; h < 2; h++) {
            const int j = 4 * L + 2 * h;
            t += sat16((uint8_t)w.b[j] * x.b[j] + (uint8_t)w.b[j + 1] * x.b[j + 1]) * s.s[2 * L + h];
        }
        r.i[L] = t;
    }
    return r;
}
static inline vi vi_dot_sg(vb aw, vsg sg, vb x, vs s) {
    for (int j = 0; j < 64; j++)
        if (sg.b[j] < 0) x.b[j] = (int8_t)(uint8_t)(0u - (uint8_t)x.b[j]);
    return vi_dot(aw, x, s);
}
static inline v16 v_from_vi(vi a) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = (float)a.i[j];
    return r;
}
static inline vs vs_ones(void) {
    vs r;
    for (int j = 0; j < 32; j++) r.s[j] = 1;
    return r;
}
static inline v16 v_two(float a, float b) {
    v16 r;
    for (int j = 0; j < 16; j++) r.l[j] = j < 8 ? a : b;
    return r;
}
static inline void k4_prep(const uint8_t *scales, vs *s, vm *mn) {
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) q4k_scale_min(scales, j, &sc[j], &m[j]), mn->s[j] = (int16_t)m[j];
    for (int k = 0; k < 4; k++) {
        const int j = 4 * (k / 2) + k % 2;
        for (int l = 0; l < 32; l++) s[k].s[l] = (int16_t)sc[l < 16 ? j : j + 2];
    }
}
static inline void q6_scales(const int8_t *sc, vs *s) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) s[c].s[l] = sc[4 * c + l / 8];
}
static inline v4 v4_zero(void) {
    v4 r = {{0.0f, 0.0f, 0.0f, 0.0f}};
    return r;
}
static inline v4 v4_mins(v4 am, vm mn, const int16_t *bs, float dm) {
    for (int i = 0; i < 4; i++) am.l[i] = fmaf((float)(mn.s[2 * i] * bs[2 * i] + mn.s[2 * i + 1] * bs[2 * i + 1]), dm, am.l[i]);
    return am;
}
static inline float v4_sum(v4 a) { return (a.l[0] + a.l[2]) + (a.l[1] + a.l[3]); }
static inline void q8_round(const float *x, int64_t n, float id, int8_t *q) {
    for (int64_t i = 0; i < n; i++) q[i] = q8_round1(x[i], id);
}
static inline uint32_t q8_amax_bits(const float *x, int64_t n) {
    uint32_t r = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, 4);
        b &= 0x7FFFFFFFu;
        r = b > r ? b : r;
    }
    return r;
}
