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
