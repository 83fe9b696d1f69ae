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
   and for the integer products (int8.c), where every build computes the same integers (exact) and floats:
     vb, vs, vi          64 bytes, 32 int16, 16 int32 (lane L of a vi: bytes 4L..4L+3 of a vb, int16 lanes 2L, 2L+1)
     vb_load vb_load2    64 bytes from p / 32 from p0 then 32 from p1;  vb_nib(v, high): each byte's low or high nibble
     vb_abs vb_sign      |w| per byte (-128 read as the unsigned 128) / what vi_dot_sg needs of w's signs (a vsg)
     vi_dot(w, x, s)     lane L: s[2L] (w x summed over bytes 4L, 4L+1) + s[2L+1] (over 4L+2, 4L+3), w unsigned, x signed
                         (maddubs then madd: the int16 pair sums saturate, which int8.c's ranges never reach)
     vi_dot_sg           the same with |w| and x negated where w was negative: signed w
     vi_zero vi_add v_from_vi vs_ones v_two(a, b)   zeros, int32 adds, (float) per lane, int16 ones, a in lanes 0-7 and b in 8-15
     k4_prep q6_scales   Q4_K's / Q6_K's scales as the vs each 64 bytes of its values take (int8.c), Q4_K's mins as a vm
     v4 v4_zero v4_mins v4_sum   4 float lanes; am[i] = fmaf((float)(mn[2i] bs[2i] + mn[2i+1] bs[2i+1]), dm, am[i]);
                         (a0 + a2) + (a1 + a3)
     q8_round q8_amax_bits    int8ref.c's rounding of n floats / the largest |x| of n floats by its bits
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
