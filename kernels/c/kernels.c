/* kvgraft's kernels: one translation unit, built by kernels/fma16.py once per variant into the kernel cache
   with -ffp-contract=off (nothing here may be fused or reordered) and -fno-fast-math.

     reference.c   the definition in plain C, one operation at a time: the formats, the product's 16 lanes and
                   fixed tree, attention's rows (the written definition of fma16 and of kv_attention)
     int8ref.c     the integer definition (i8dot-v1) in plain C: rows of x to int8, integer sums, the scales' order
     scalar.c      exp, sin/cos and the GELUs of one value (double, rounded once)
     rows.c        rotary tables, RMSNorm, LayerNorm, the GELUs over rows
     simd.h        the mapping header: the named primitives, from arch/avx512.h, arch/avx2.h or arch/portable.h
     linear.c      the products (kv_linear), written once over the primitives
     int8.c        the integer products (kv_linear_i8: kv_linear dispatches a format with FMT_I8 to it)
     attention.c   attention (kv_attention), written once over the primitives
     step.c        a decode step's decoder layers in one call (kv_decode_layers)

   Three builds (kernels/fma16.py VARIANTS picks one per CPU, or KVGRAFT_ISA does): -DKV_AVX512 (the 16 lanes
   in one AVX-512 register), -DKV_AVX2 (in two AVX2 registers, lanes 0-7 and 8-15: the same fmaf per lane, and
   s[j] + s[j+8] is exactly lo[j] + hi[j]), neither (plain C loops over the 16 lanes). Each runs the same
   operations on every value, so the same bits; the plain C reference (kv_linear_ref, attend_row_ref) is in
   every build, and the tests and the loader compare each build with it. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

/* Below this many elements (or multiply-adds / 64) a call runs on the calling thread alone: waking a second
   thread cost milliseconds on a busy machine, more than the work (ATen's grain size is the same). Rows
   are independent, so the split never changes a byte. */
#define SPLIT_MIN 32768

#include "scalar.c"
#include "reference.c"
#include "int8ref.c"
#include "rows.c"
#include "simd.h"
#include "linear.c"
#include "int8.c"
#include "attention.c"
#include "step.c"

/* Which build this is, so the loader can check it loaded the one it asked for. */
const char *kv_isa(void) { return KV_ISA_NAME; }
