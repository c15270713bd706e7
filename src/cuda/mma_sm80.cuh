// Warp-level tensor-core primitives of sm_80 and newer, as inline PTX: ldmatrix (shared memory to
// operand fragments), mma.sync m16n8k16 (16-bit operands, fp32 accumulators), mma.sync m16n8k8 on
// tf32 operands, and movmatrix (an 8x8 transpose in registers). Their fragment layouts are fixed by the PTX ISA, so values can stay in
// registers from one product to the next. With lane = 4 g + t:
//
//   A, 16 x 16, row major:  a0 = A[g][2t, 2t+1]    a1 = A[g+8][2t, 2t+1]
//                           a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B, 16 x 8, col major:   b0 = B[2t, 2t+1][g]    b1 = B[2t+8, 2t+9][g]
//   C, 16 x 8, fp32:        c0, c1 = C[g][2t, 2t+1]    c2, c3 = C[g+8][2t, 2t+1]
//
// Two adjacent C tiles (columns [0, 8) and [8, 16)), rounded to 16 bits in pairs, are exactly the
// A fragment of the 16 x 16 block they form: a product's result feeds the next product directly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace gdnkit::cuda {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
// Declares `name` as the CTA's dynamic shared memory. The kernels declare it only through this
// macro, which the emulator (tests/emu/fake) defines as the emulated CTA's own, so that the CTAs of
// a cluster can run there at once.
#define GDNKIT_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]

// Four 8 x 8 16-bit matrices; lanes 8 m .. 8 m + 7 give the row addresses of matrix m, and r[m]
// receives matrix m in the C layout of one 8 x 8 quarter (lane holds row g, columns 2t, 2t+1).
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// As ldsm_x4, each matrix transposed: lane holds rows 2t, 2t+1 of column g.
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// The inverse of ldsm_x4 (stmatrix, sm_90): lanes 8 m .. 8 m + 7 give the row addresses of matrix
// m, and r[m] holds matrix m in the C layout of one 8 x 8 quarter (lane holds row g, columns 2t,
// 2t + 1), as a wgmma accumulator's C tiles do after packing to 16 bits.
__device__ __forceinline__ void stsm_x4(void* row, const std::uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// stsm_x4 with each matrix stored transposed: row k of matrix m (at lane 8 m + k's address) gets
// column k of the C-layout quarter, i.e. the lanes' (g, 2t) elements land at row 2t, column g.
__device__ __forceinline__ void stsm_x4_trans(void* row, const std::uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// d += A B (16 x 8 x 16).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                        std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                 std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x rounded to tf32 (10 mantissa bits, nearest, ties away from zero), as an fp32 bit pattern: the
// rounding of cvt.rna.tf32.f32 for finite x in two integer instructions (the cvt costs about five
// here: it also keeps infinities and NaNs intact, which these operands never are).
__device__ __forceinline__ std::uint32_t tf32_round(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

// x split for 3xTF32 products: hi = x rounded to tf32, lo = x - hi (exact in fp32) as it is. A tf32
// mma reads only the top 19 bits of an operand register, so lo enters truncated to tf32: its error,
// 2^-10 of |lo| <= 2^-21 |x|, is below the fp32 accumulation's (tests/cpu/test_inverse.cpp measures
// the scheme), and rounding lo as well would cost two more instructions per element.
__device__ __forceinline__ void tf32_split(float x, std::uint32_t& hi, std::uint32_t& lo) {
  hi = tf32_round(x);
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// d += A B (16 x 8 x 8) on tf32 operands. With lane = 4 g + t:
//   A, 16 x 8:  a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]
//   B, 8 x 8:   b0 = B[t][g]  b1 = B[t+4][g]
//   C, 16 x 8:  as for m16n8k16.
__device__ __forceinline__ void mma1688_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The transpose of an 8 x 8 16-bit matrix held in the C layout of one quarter.
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The same value, opaque to the optimiser: what is computed from it is neither folded nor shared
// with other code (used to keep address arithmetic from being held in registers for long).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}
__device__ __forceinline__ std::int64_t opaque(std::int64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

}  // namespace gdnkit::cuda
