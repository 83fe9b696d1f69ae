/* exp, sin and cos and the two GELUs of one value, in double and rounded once to float32 (kvgraft-f32-v2 and
   the embedder's kvgraft-enc-v1): plain C, the same operations in every build.

   No intrinsics: with -ffp-contract=off and without -ffast-math the compiler may vectorise a loop of these
   across independent elements but never reorders, contracts or reassociates, so the bytes do not depend on
   the vector width. exp, sin and cos are kvgraft's own (below): no libm entry point whose variant is chosen
   by the CPU (glibc's ifuncs) decides a bit. floor, ldexp and sqrtf are exact or correctly rounded by
   IEEE-754 and C99 on every machine. */

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

/* GELU, tanh form, in double, rounded once: u = sqrt(2/pi) (x + 0.044715 x^3); 0.5 x (1 + tanh u) is
   written as x / (1 + e^(-2u)), the same function without the cancellation of 1 + tanh u for u < 0. */
static float gelu_ref(float xf) {
    const double v = (double)xf;
    const double u = 7.97884560802865355880e-01 * (v + 4.47150000000000022782e-02 * ((v * v) * v));
    return (float)(v / (1.0 + kv_exp_d(-2.0 * u)));
}

float kv_gelu_ref(float x) { return gelu_ref(x); }

/* e^z by kv_exp_d's operations without its branches, so that a loop calling it vectorises: z clamped to
   [-708, 708] (2^n a normal double there), and inf above 709.78 as kv_exp_d gives. gelu_one and silu_one
   below use it; outside the clamp each gives the same float as its reference (said at each). */
static inline double exp_branch_free(double z) {
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
    return e;
}

/* gelu_ref without branches, so that its loop vectorises: e^z for z = -2u clamped to [-708, 708] (2^n a
   normal double there, the operations of kv_exp_d), and e = inf above 709.78 as kv_exp_d gives. Outside
   the clamp both give the same float: z > 708 makes v / (1 + e) round to -0 (or -inf / inf = NaN for
   v = -inf, kept by the inf), z < -708 makes 1 + e = 1. tests/test_numerics.py sweeps both. */
static inline float gelu_one(float xf) {
    const double v = (double)xf;
    const double u = 7.97884560802865355880e-01 * (v + 4.47150000000000022782e-02 * ((v * v) * v));
    const double z = -2.0 * u;
    const double e = exp_branch_free(z);
    return (float)(v / (1.0 + e));
}

float kv_gelu_one(float x) { return gelu_one(x); }

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

/* SiLU (the Llama family's activation), in double, rounded once: x / (1 + e^(-x)) with kvgraft's exp. */
static float silu_ref(float xf) {
    const double v = (double)xf;
    return (float)(v / (1.0 + kv_exp_d(-v)));
}

float kv_silu_ref(float x) { return silu_ref(x); }

/* silu_ref without branches, so that its loop vectorises: e^z for z = -x clamped to [-708, 708] (2^n a normal
   double there, kv_exp_d's operations), and e = inf above 709.78 as kv_exp_d gives. Outside the clamp both give
   the same float: z > 708 makes v / (1 + e) round to -0 (|v / e| < 2^-900), z < -708 makes 1 + e = 1. A NaN is
   returned as it came (as gelu_erf_one: which operand's NaN an instruction keeps may differ between builds).
   tests/test_numerics.py sweeps both. */
static inline float silu_one(float xf) {
    const double v = (double)xf;
    const double z = -v;
    const double e = exp_branch_free(z);
    return v != v ? xf : (float)(v / (1.0 + e));
}

float kv_silu_one(float x) { return silu_one(x); }
