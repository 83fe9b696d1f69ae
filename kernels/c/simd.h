/* The mapping header: the named primitives the shared operations (linear.c, attention.c) are written with,
   from one file per instruction set under arch/ (ggml's ggml-cpu/arch/ and simd-mappings.h pattern).
   -DKV_AVX512 selects arch/avx512.h, -DKV_AVX2 arch/avx2.h, neither arch/portable.h.

   Every arch file defines the same names, each the same IEEE-754 float32 operation per lane in every build
   (which is why the builds compute the same bits):
     v16                 16 float32 lanes
     v_zero v_set1       +0.0 / a in every lane
     v_load v_store      16 floats from / to p (unaligned)
     v_load_first(p, n)  lanes 0..n-1 from p, the rest 0 (n < 16); reads nothing at p + n or after
     v_fmadd(a, b, c)    a * b + c rounded once (fmaf), per lane
     v_mul v_sub v_add   a * b, a - b, a + b, per lane
     reduce16(s)         the definition's tree: t[j] = s[j] + s[j+8], then + 4, + 2, + 1 (reference.c)
     h2f(p)              the float16 at p (little-endian) as a float, exactly
     v_prefetch(p)       a hint; never a fault, never a value
     q_i8 q_nibbles      16 signed bytes / low or high nibbles of 16 bytes, as floats (exact small integers)
     q_lut(t, p, high)   lane j of t picked by the low or high nibble of byte j of p: the 16 values a 4-bit
                         block can hold, computed once, then selected (the same value as computing it per weight)
     q_q5(p, high, bits) Q5_0's values (nibble | bit j of `bits` << 4) - 16
     q_k4scales(s)       a Q4_K block's 8 scales, then its 8 mins (12 packed bytes at s; reads 16): q4k_scale_min's
                         values, as floats
     q_q6(ql, ls, qh, hs) Q6_K's values ((ql >> ls) & 15 | ((qh >> hs) & 3) << 4) - 32
     q_q6x128(ql, qh, o) the same for 128 values of half a Q6_K block (ql 64 bytes, qh 32), as signed bytes:
                         o[t] = ((ql[t % 64] >> 4 (t / 64)) & 15 | ((qh[t % 32] >> 2 (t / 32)) & 3) << 4) - 32
     vp, VP_LANES,       one part of a v16: its VP_LANES lanes from VP_LANES * h (16: the whole; 8: a half),
     VP_PARTS            VP_PARTS of them (literals, so that tile names can be pasted from them)
     vp_zero vp_set1 vp_load vp_store vp_fmadd vp_add   as above, on a part
     v_part(a, h)        part h of a;  v_join(first, last): the v16 of its parts (the same one where one part
                         is the whole)
   and the tile shapes PANEL_RB, FUSEDM_TOP, FUSED256_RB, QK_C, PV_WIDE_C (how many outputs a tile holds side by
   side: never how one output is computed), KV_LUT16 (whether a format with a choice picks from a q_lut table or
   computes per lane: the same operations on the same values either way), and KV_ISA_NAME, the build's name (kv_isa). */

#if defined(KV_AVX512)
#include "arch/avx512.h"
#elif defined(KV_AVX2)
#include "arch/avx2.h"
#else
#include "arch/portable.h"
#endif

/* A compiler barrier, no instruction: values the code stored before it are read back from memory after it, so a
   scalar is broadcast by a load (no shuffle) and bytes widened as they are loaded, where the compiler would
   otherwise take them out of the registers it stored (an extract or permute per use). */
#define KV_FROM_MEMORY() __asm__ __volatile__("" ::: "memory")

_Static_assert(VP_LANES * VP_PARTS == 16, "a v16 is VP_PARTS parts of VP_LANES lanes");
