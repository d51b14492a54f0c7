// trident/nn/gemm.hpp — the host float GEMM under the reference layers.
//
// Synopsis
//   enum class op { n, t };          use a matrix as stored, or its transpose
//   void gemm(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k,
//             float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
//             float beta, float* c, std::size_t ldc)
//       row-major C[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C; beta == 0 never reads C
//   TRIDENT_HAS_CBLAS                0 (default): trident's own kernel; 1: cblas_sgemm from <cblas.h>
//
// Why our own kernel: the nn/ headers are reference layers for tests and examples, and must
// compile with nothing but a C++20 compiler (the per-header checks build them in the plain host
// flavour). The kernel is GotoBLAS-shaped — blocks of kc x nc of B and mc x kc of A are packed
// into contiguous, zero-padded micro-panels, and a register tile of mr x nr accumulators is
// updated over the panels' depth. On x86 with GCC or Clang the tile is held as GCC vector-
// extension values (SSE2, AVX2 or AVX-512 wide), which the compiler keeps in registers: about
// 90 GFLOP/s per AVX-512 core on the flagship's products (bench/RESULTS.md), without intrinsics.
// Elsewhere (another compiler, nvcc's host pass) the same loops over plain arrays.
//
// Width: the build targets plain x86-64 (SSE2). The same templates are also compiled for AVX2
// and AVX-512F (__attribute__((target)), a wider register tile) and the widest this CPU runs is
// chosen at run time, as the optimizer's host step does (optim/host_simd.hpp: its detection
// and force_host_isa serve both).
//
// Determinism: one thread, and every element of C is summed in one fixed order that depends only
// on k (in order within each kc block, blocks added in order), never on machine, vector width or
// thread count: the wider paths vectorise across columns, never across the sum, and FMA
// contraction is off (a fused multiply-add rounds once where the portable code rounds twice), so
// every path gives the same bits (nn.host checks it).
//
// Opting in to a BLAS: define TRIDENT_HAS_CBLAS=1 and link a CBLAS (the test target
// trident_test_blas does both with OpenBLAS). Results are then the BLAS's: OpenBLAS is run-to-run
// reproducible for a fixed thread count (OPENBLAS_NUM_THREADS), but not bitwise across counts
// or CPUs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "trident/optim/host_simd.hpp"

#if !defined(TRIDENT_HAS_CBLAS)
#define TRIDENT_HAS_CBLAS 0
#endif

#if TRIDENT_HAS_CBLAS
#include <cblas.h>

#include <limits>

#include "trident/core/error.hpp"
#endif

namespace trident::nn {

//! How gemm reads an operand: as stored (`n`) or transposed (`t`), as BLAS's 'N' and 'T'.
enum class op { n, t };

namespace detail {

// Register tile and cache blocks. mr x nr = 4 x 8 floats of accumulators fit the 16 SSE or AVX
// registers with room for the B row and A broadcasts; a kc x nc panel of B (256 x 512 floats,
// 512 KiB) stays in L2, an mc x kc panel of A (64 x 256, 64 KiB) in L1/L2. The AVX2 path takes
// 4 x 16 (8 of its 16 ymm registers), the AVX-512 path 8 x 32 (16 of 32 zmm): the fastest of
// the tiles tried on a 1024 x 512 x 128 product (bench/RESULTS.md).
inline constexpr std::size_t gemm_mr = 4;
inline constexpr std::size_t gemm_nr = 8;
inline constexpr std::size_t gemm_mc = 64;
inline constexpr std::size_t gemm_kc = 256;
inline constexpr std::size_t gemm_nc = 512;

// No FMA contraction in the kernels (GCC contracts a * b + c under -ffp-contract=fast, the
// GNU-mode default, when the target has FMA, which AVX-512F implies): the code below, and what
// is inlined into it, keeps one rounding per operation on every path.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__) && !defined(__CUDACC__)
// Clang fuses a * b + c within one expression by default ("on"); off up to the pop, as for GCC.
#pragma float_control(push)
#pragma clang fp contract(off)
#endif

// Packs op(A)[i0 : i0+mc, p0 : p0+kc] as micro-panels of MR rows: panel[p * MR + r].
// Rows past m are zero, so the kernel never branches; those accumulators are never stored.
template <std::size_t MR>
inline void pack_a(const float* a, std::size_t row_stride, std::size_t col_stride, std::size_t rows,
                   std::size_t depth, float* out) {
  for (std::size_t i = 0; i < rows; i += MR) {
    const std::size_t live = std::min(MR, rows - i);
    for (std::size_t p = 0; p < depth; ++p) {
      std::size_t r = 0;
      for (; r < live; ++r) out[p * MR + r] = a[(i + r) * row_stride + p * col_stride];
      for (; r < MR; ++r) out[p * MR + r] = 0.0f;
    }
    out += depth * MR;
  }
}

// Packs op(B)[p0 : p0+kc, j0 : j0+nc] as micro-panels of NR columns: panel[p * NR + j].
template <std::size_t NR>
inline void pack_b(const float* b, std::size_t row_stride, std::size_t col_stride, std::size_t depth,
                   std::size_t cols, float* out) {
  for (std::size_t j = 0; j < cols; j += NR) {
    const std::size_t live = std::min(NR, cols - j);
    for (std::size_t p = 0; p < depth; ++p) {
      std::size_t c = 0;
      for (; c < live; ++c) out[p * NR + c] = b[p * row_stride + (j + c) * col_stride];
      for (; c < NR; ++c) out[p * NR + c] = 0.0f;
    }
    out += depth * NR;
  }
}

// C = alpha * acc + beta * C for the live part of a tile (`first`: the first kc block, the only
// one where beta applies; later blocks add).
template <std::size_t MR, std::size_t NR>
__attribute__((always_inline)) inline void write_tile(const float (&acc)[MR][NR], float alpha, float beta, bool first,
                                                      float* c, std::size_t ldc, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    if (!first)
      for (std::size_t j = 0; j < cols; ++j) row[j] += alpha * acc[r][j];
    else if (beta == 0.0f)
      for (std::size_t j = 0; j < cols; ++j) row[j] = alpha * acc[r][j];
    else
      for (std::size_t j = 0; j < cols; ++j) row[j] = alpha * acc[r][j] + beta * row[j];
  }
}

// acc = A-panel x B-panel over `depth`, then C = alpha * acc + beta * C for the live part
// (`first` is whether this is the first kc block: only then does beta apply). Always inlined,
// so that it is compiled for the target of the path that calls it.
template <std::size_t MR, std::size_t NR>
__attribute__((always_inline)) inline void micro_kernel(std::size_t depth, const float* a, const float* b, float alpha,
                                                        float beta, bool first, float* c, std::size_t ldc, std::size_t rows,
                                                        std::size_t cols) {
  float acc[MR][NR] = {};
  for (std::size_t p = 0; p < depth; ++p) {
    const float* bp = b + p * NR;
    const float* ap = a + p * MR;
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t j = 0; j < NR; ++j) acc[r][j] += ap[r] * bp[j];
  }
  write_tile<MR, NR>(acc, alpha, beta, first, c, ldc, rows, cols);
}

// The same product with the accumulators as W-float vectors (GCC's vector extension), so that
// the compiler keeps the MR x NR tile in registers: written with plain arrays, GCC kept it on the
// stack and loaded and stored it on every step of the sum (40 GFLOP/s on AVX-512 against
// OpenBLAS's 150). Lane by lane the same operations in the same order (acc += a * b, one
// rounding each: no contraction here), so the same bits as micro_kernel.
#if defined(TRIDENT_DETAIL_HOST_SIMD)
// W floats as one GCC vector (a typedef per width: GCC ignores vector_size on a dependent alias).
// Only where the x86 paths are compiled (GCC or Clang, not nvcc); elsewhere the plain kernel.
template <std::size_t W>
struct float_vec;
template <>
struct float_vec<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct float_vec<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct float_vec<16> {
  typedef float type __attribute__((vector_size(64)));
};

template <std::size_t MR, std::size_t NR, std::size_t W>
__attribute__((always_inline)) inline void micro_kernel_vec(std::size_t depth, const float* a, const float* b, float alpha,
                                                            float beta, bool first, float* c, std::size_t ldc, std::size_t rows,
                                                            std::size_t cols) {
  static_assert(NR % W == 0);
  using vec = typename float_vec<W>::type;
  static_assert(sizeof(vec) == W * sizeof(float));
  constexpr std::size_t nv = NR / W;
  vec acc[MR][nv];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (std::size_t v = 0; v < nv; ++v) acc[r][v] = vec{};
  for (std::size_t p = 0; p < depth; ++p) {
    vec bv[nv];
#pragma GCC unroll 16
    for (std::size_t v = 0; v < nv; ++v) __builtin_memcpy(&bv[v], b + p * NR + v * W, sizeof(vec));
    const float* ap = a + p * MR;
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
#pragma GCC unroll 16
      for (std::size_t v = 0; v < nv; ++v) acc[r][v] += ap[r] * bv[v];
  }
  float tile[MR][NR];
  for (std::size_t r = 0; r < MR; ++r)
    for (std::size_t v = 0; v < nv; ++v) __builtin_memcpy(&tile[r][v * W], &acc[r][v], sizeof(vec));
  write_tile<MR, NR>(tile, alpha, beta, first, c, ldc, rows, cols);
}

#endif

template <std::size_t MR, std::size_t NR, std::size_t W = 0>
__attribute__((always_inline)) inline void gemm_blocked(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k,
                                                        float alpha, const float* a, std::size_t lda, const float* b,
                                                        std::size_t ldb, float beta, float* c, std::size_t ldc) {
  // The packed panels are sized for whole register tiles of a block (a tile that does not divide
  // the block would write past them).
  static_assert(gemm_mc % MR == 0 && gemm_nc % NR == 0, "gemm: the register tile must divide the cache blocks");
  // Element (i, p) of op(A) is a[i * a_row + p * a_col]; likewise for B.
  const std::size_t a_row = op_a == op::n ? lda : 1, a_col = op_a == op::n ? 1 : lda;
  const std::size_t b_row = op_b == op::n ? ldb : 1, b_col = op_b == op::n ? 1 : ldb;
  // Per-thread workspace, kept between calls: tests call gemm thousands of times.
  thread_local std::vector<float> a_pack, b_pack;
  a_pack.resize(gemm_mc * gemm_kc);
  b_pack.resize(gemm_kc * ((std::min(n, gemm_nc) + NR - 1) / NR * NR));

  for (std::size_t j0 = 0; j0 < n; j0 += gemm_nc) {
    const std::size_t nc = std::min(gemm_nc, n - j0);
    for (std::size_t p0 = 0; p0 < k; p0 += gemm_kc) {
      const std::size_t kc = std::min(gemm_kc, k - p0);
      pack_b<NR>(b + p0 * b_row + j0 * b_col, b_row, b_col, kc, nc, b_pack.data());
      for (std::size_t i0 = 0; i0 < m; i0 += gemm_mc) {
        const std::size_t mc = std::min(gemm_mc, m - i0);
        pack_a<MR>(a + i0 * a_row + p0 * a_col, a_row, a_col, mc, kc, a_pack.data());
        for (std::size_t j = 0; j < nc; j += NR)
          for (std::size_t i = 0; i < mc; i += MR)
#if defined(TRIDENT_DETAIL_HOST_SIMD)
            if constexpr (W != 0)
              micro_kernel_vec<MR, NR, W>(kc, a_pack.data() + i * kc, b_pack.data() + j * kc, alpha, beta, p0 == 0,
                                          c + (i0 + i) * ldc + j0 + j, ldc, std::min(MR, mc - i), std::min(NR, nc - j));
            else
#endif
              micro_kernel<MR, NR>(kc, a_pack.data() + i * kc, b_pack.data() + j * kc, alpha, beta, p0 == 0,
                                   c + (i0 + i) * ldc + j0 + j, ldc, std::min(MR, mc - i), std::min(NR, nc - j));
      }
    }
  }
}

inline void gemm_portable(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                          std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  gemm_blocked<gemm_mr, gemm_nr, 4>(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);  // SSE2 vectors
#else
  gemm_blocked<gemm_mr, gemm_nr>(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

#if defined(TRIDENT_DETAIL_HOST_SIMD)
__attribute__((target("avx2"))) inline void gemm_avx2(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                                      const float* a, std::size_t lda, const float* b, std::size_t ldb,
                                                      float beta, float* c, std::size_t ldc) {
  gemm_blocked<4, 16, 8>(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
__attribute__((target("avx512f"))) inline void gemm_avx512(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k,
                                                           float alpha, const float* a, std::size_t lda, const float* b,
                                                           std::size_t ldb, float beta, float* c, std::size_t ldc) {
  gemm_blocked<8, 32, 16>(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#elif defined(__clang__) && !defined(__CUDACC__)
#pragma float_control(pop)
#endif

// The widest path this CPU runs (optim::detail::active_host_isa, which tests can force).
inline void gemm_dispatch(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                          std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: gemm_avx512(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); return;
    case trident::optim::detail::host_isa::avx2: gemm_avx2(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); return;
    default: break;
  }
#endif
  gemm_portable(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail

//! Row-major single-precision GEMM: C[m, n] = alpha * op(A) op(B) + beta * C, where op(A) is
//! m x k and op(B) is k x n; lda, ldb, ldc are the row strides of A, B, C as stored. With
//! beta == 0, C is only written (it may hold garbage or NaN), as in BLAS. Pointers are unchecked.
//!
//!   // y[batch, out] = x[batch, in] * W[out, in]^T
//!   trident::nn::gemm(op::n, op::t, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
inline void gemm(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                 std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {  // C = beta * C, without reading C when beta == 0
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#if TRIDENT_HAS_CBLAS
  constexpr auto limit = static_cast<std::size_t>(std::numeric_limits<int>::max());
  TRIDENT_EXPECT(m <= limit && n <= limit && k <= limit && lda <= limit && ldb <= limit && ldc <= limit,
                 "gemm: sizes beyond int range (", m, " x ", n, " x ", k, ") for cblas_sgemm");
  cblas_sgemm(CblasRowMajor, op_a == op::n ? CblasNoTrans : CblasTrans, op_b == op::n ? CblasNoTrans : CblasTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
#else
  detail::gemm_dispatch(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

}  // namespace trident::nn
