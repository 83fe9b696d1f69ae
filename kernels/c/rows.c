/* The row operations of a forward besides products and attention, plain C (the same operations in every
   build, see scalar.c): the rotary tables, RMSNorm (Gemma's and the Llama family's), the tanh GELU and SiLU
   (graft_core/numerics.py), and the retrieval embedder's LayerNorm and erf GELU (retrieval/encoder.py). Rows are independent, so the split
   over threads never changes a byte. */

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

/* RMSNorm of each row: ms = (fma16's dot of the row with itself) / n; r = 1 / sqrtf(ms + eps); then Gemma's
   y = (x * r) * (1 + w) (`plus_one`), or the Llama family's y = (x * r) * w (no + 1: adding 0 would turn a
   weight of -0 into +0). Inlined with a constant `plus_one`: each entry point is its own loop. */
static inline int rmsnorm_rows(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y, int threads,
                               const int plus_one) {
    if (rows < 0 || n <= 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (rows * n >= SPLIT_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * n;
        float s[16] = {0};
        for (int64_t k = 0; k < n; k += 16)
            for (int j = 0; j < 16; j++) s[j] = fmaf(k + j < n ? xi[k + j] : 0.0f, k + j < n ? xi[k + j] : 0.0f, s[j]);
        const float r = 1.0f / sqrtf(reduce16_ref(s) / (float)n + eps);
        if (plus_one)
            for (int64_t k = 0; k < n; k++) y[i * n + k] = (xi[k] * r) * (1.0f + w[k]);
        else
            for (int64_t k = 0; k < n; k++) y[i * n + k] = (xi[k] * r) * w[k];
    }
    return 0;
}

/* Gemma's RMSNorm: y = (x * r) * (1 + w). */
int kv_rmsnorm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y, int threads) {
    return rmsnorm_rows(x, rows, n, w, eps, y, threads, 1);
}

/* The Llama family's RMSNorm (LlamaRMSNorm, Qwen2RMSNorm, MistralRMSNorm): y = (x * r) * w. */
int kv_rmsnorm_mul(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y, int threads) {
    return rmsnorm_rows(x, rows, n, w, eps, y, threads, 0);
}

int kv_gelu_tanh(const float *x, int64_t n, float *y, int threads) {
    if (n < 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (n >= SPLIT_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gelu_one(x[i]);
    return 0;
}

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

int kv_silu(const float *x, int64_t n, float *y, int threads) {
    if (n < 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (n >= SPLIT_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = silu_one(x[i]);
    return 0;
}

int kv_gelu_erf(const float *x, int64_t n, float *y, int threads) {
    if (n < 0) return -1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (n >= SPLIT_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = gelu_erf_one(x[i]);
    return 0;
}
