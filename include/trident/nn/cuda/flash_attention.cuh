// trident/nn/cuda/flash_attention.cuh — causal attention on the GPU without the [seq, seq]
// probabilities: nn/flash_attention.hpp's tiles run as thread blocks, their products on TF32
// tensor cores.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda)
//   struct flash_attention { std::size_t seq, batch, heads, head_dim;     head_dim 32 or 64
//     std::size_t qkv_size() const, out_size() const, lse_size() const
//     void forward(stream, qkv, out, lse) const                  out, and lse [batch, heads, seq]
//     void backward(stream, qkv, out, lse, dout, delta, dqkv) const   delta: scratch, lse_size() }
//
// nn::causal_attention's contract and layouts (nn/attention.hpp), with forward saving each row's
// log-sum-exp instead of the probabilities (4 * seq bytes per row less: 805 MB per GPT-2 124M
// layer at B = 16, T = 1024). The algorithm and its indexing are nn/flash_attention.hpp's,
// shared with the host emulation that nn.host tests against nn::causal_attention; this header
// adds only the block's execution: each phase on the block's 128 threads, __syncthreads between
// block phases and __syncwarp between a warp's own, rows moved as float4, and the tile products
// as wmma m16n16k8 TF32 fragments: operands loaded from shared memory, A's fragment once per
// [16, 64] panel, results stored to shared memory or, for backward's dk, dv and dq, kept in
// accumulator fragments across the loop and stored once (nothing depends on the fragments'
// register layout). Products therefore round their operands to TF32 (10-bit mantissa), as
// cuBLAS's TF32 mode does; sums are in float. Two blocks per H100 SM (registers and shared
// memory). bench/gpt_block_ops_cuda times it against the unfused attention (bench/RESULTS.md).
// Deterministic: no atomics (dq has its own pass over the key tiles). Needs compute capability
// 8.0 or newer (TF32 tensor cores) and 103 KiB of shared memory per block at head_dim 64 (A100,
// H100; not the 99 KiB of sm_86/sm_89 cards: refused there with an error before anything runs).
//
//   trident::nn::cuda::flash_attention fa{.seq = 1024, .batch = 16, .heads = 12, .head_dim = 64};
//   fa.forward(stream, qkv, out, lse);
//   fa.backward(stream, qkv, out, lse, dout, delta, dqkv);
#pragma once

#if !defined(__CUDACC__)
#error "trident/nn/cuda/flash_attention.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <cuda_runtime.h>
#include <mma.h>

#include <cstddef>
#include <type_traits>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_attention.hpp"

namespace trident::nn::cuda {

namespace detail {

// nn::flash's block execution on the GPU (host_exec's counterpart).
struct flash_device_exec {
  template <class F>
  __device__ void each(F&& f) const {
    f(static_cast<int>(threadIdx.x));
  }
  template <class F>
  __device__ void warps(F&& f) const {
    f(static_cast<int>(threadIdx.x) / 32);  // all 32 threads of a warp: the wmma calls are collective
  }
  template <class G>
  __device__ void lanes(G&& g) const {
    g(static_cast<int>(threadIdx.x) % 32);
  }
  __device__ void sync() const { __syncthreads(); }
  __device__ void sync_warp() const { __syncwarp(); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;
  // acc[j] += A[16, k] B[k, 16j : 16j + 16] with host_exec::mma's layouts, k a multiple of 8.
  // Every pointer is 32-byte aligned and every leading dimension a multiple of 8 floats
  // (nn::flash's layout), as wmma's loads require. A's fragment for each step of k is loaded and
  // rounded once for the N tiles; each tile's sum runs over k in order, as one tile's would.
  template <bool ARow, bool BRow, int N>
  __device__ static void mma_into(accumulator (&acc)[N], const float* a, int lda, const float* b, int ldb, int k) {
    namespace wmma = nvcuda::wmma;
    using layout_a = std::conditional_t<ARow, wmma::row_major, wmma::col_major>;
    using layout_b = std::conditional_t<BRow, wmma::row_major, wmma::col_major>;
    for (int x = 0; x < k; x += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, layout_a> fa;
      wmma::load_matrix_sync(fa, a + (ARow ? x : x * lda), static_cast<unsigned>(lda));
#pragma unroll
      for (int e = 0; e < fa.num_elements; ++e) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, layout_b> fb;
        const float* bj = b + (BRow ? 16 * j : 16 * j * ldb);
        wmma::load_matrix_sync(fb, bj + (BRow ? x * ldb : x), static_cast<unsigned>(ldb));
#pragma unroll
        for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
  }
  // C[16, 16N] (+)= A[16, k] B[k, 16N], C in shared memory (row-major, ldc).
  template <bool ARow, bool BRow, int N>
  __device__ void mma(float* c, int ldc, const float* a, int lda, const float* b, int ldb, int k, bool accumulate) const {
    accumulator acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (accumulate)
        nvcuda::wmma::load_matrix_sync(acc[j], c + 16 * j, static_cast<unsigned>(ldc), nvcuda::wmma::mem_row_major);
      else
        nvcuda::wmma::fill_fragment(acc[j], 0.0f);
    }
    mma_into<ARow, BRow, N>(acc, a, lda, b, ldb, k);
#pragma unroll
    for (int j = 0; j < N; ++j) nvcuda::wmma::store_matrix_sync(c + 16 * j, acc[j], static_cast<unsigned>(ldc), nvcuda::wmma::mem_row_major);
  }
  // host_exec's panels: each thread holds its warp's fragments, so w is the caller's own warp.
  template <int N>
  struct panel {
    accumulator acc[N];
  };
  template <int N>
  __device__ panel<N> make_panel() const {
    panel<N> p;
#pragma unroll
    for (int j = 0; j < N; ++j) nvcuda::wmma::fill_fragment(p.acc[j], 0.0f);
    return p;
  }
  template <bool ARow, bool BRow, int N>
  __device__ void mma_panel(panel<N>& p, int /*w*/, const float* a, int lda, const float* b, int ldb, int k) const {
    mma_into<ARow, BRow, N>(p.acc, a, lda, b, ldb, k);
  }
  template <int N>
  __device__ void store_panel(const panel<N>& p, int /*w*/, float* c, int ldc) const {
#pragma unroll
    for (int j = 0; j < N; ++j) nvcuda::wmma::store_matrix_sync(c + 16 * j, p.acc[j], static_cast<unsigned>(ldc), nvcuda::wmma::mem_row_major);
  }
#else
  // Not compiled for devices without TF32 tensor cores: flash_attention refuses them before
  // launching (check_device), so these only have to exist.
  template <int N>
  struct panel {};
  template <bool ARow, bool BRow, int N>
  __device__ void mma(float*, int, const float*, int, const float*, int, int, bool) const { __trap(); }
  template <int N>
  __device__ panel<N> make_panel() const { return {}; }
  template <bool ARow, bool BRow, int N>
  __device__ void mma_panel(panel<N>&, int, const float*, int, const float*, int, int) const { __trap(); }
  template <int N>
  __device__ void store_panel(const panel<N>&, int, float*, int) const { __trap(); }
#endif
};

template <int D>
__global__ void __launch_bounds__(flash::threads, 2) flash_forward_kernel(flash::problem p) {
  extern __shared__ __align__(128) float flash_smem[];
  flash_device_exec ex;
  // The last query tiles (the most key tiles) first, so that the grid's tail is short ones.
  flash::forward_block<D>(ex, p, flash_smem, static_cast<int>(gridDim.x - 1 - blockIdx.x), static_cast<int>(blockIdx.y));
}
template <int D>
__global__ void __launch_bounds__(flash::threads) flash_delta_kernel(flash::problem p) {
  flash_device_exec ex;
  flash::delta_rows<D>(ex, p, static_cast<std::size_t>(blockIdx.x) * flash::threads);
}
template <int D>
__global__ void __launch_bounds__(flash::threads, 2) flash_backward_kv_kernel(flash::problem p) {
  extern __shared__ __align__(128) float flash_smem[];
  flash_device_exec ex;
  flash::backward_kv_block<D>(ex, p, flash_smem, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
}
template <int D>
__global__ void __launch_bounds__(flash::threads, 2) flash_backward_q_kernel(flash::problem p) {
  extern __shared__ __align__(128) float flash_smem[];
  flash_device_exec ex;
  flash::backward_q_block<D>(ex, p, flash_smem, static_cast<int>(gridDim.x - 1 - blockIdx.x), static_cast<int>(blockIdx.y));
}

// Launch a kernel that takes `floats` of dynamic shared memory (over the default 48 KiB: the
// attribute is set on every call, which is cheap and keeps this header free of static state).
template <class Kernel>
void flash_launch(Kernel kernel, dim3 grid, std::size_t floats, cudaStream_t stream, const flash::problem& p) {
  const std::size_t bytes = floats * sizeof(float);
  TRIDENT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, flash::threads, bytes, stream>>>(p);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

//! Causal attention by tiles (FlashAttention-2's algorithm) on TF32 tensor cores; see the header.
struct flash_attention {
  std::size_t seq = 0;
  std::size_t batch = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  std::size_t qkv_size() const noexcept { return shape().qkv_size(); }
  std::size_t out_size() const noexcept { return shape().out_size(); }
  std::size_t lse_size() const noexcept { return batch * heads * seq; }

  //! out [seq, batch, heads, head_dim] and lse [batch, heads, seq] from qkv.
  void forward(cudaStream_t stream, device_span<const float> qkv, device_span<float> out, device_span<float> lse) const {
    const char* who = "cuda::flash_attention::forward";
    const flash::problem p = flash::forward_problem(who, shape(), qkv, out, lse);
    check_device(who);
    const dim3 grid(tiles(), static_cast<unsigned>(batch * heads));
    if (head_dim == 32)
      detail::flash_launch(detail::flash_forward_kernel<32>, grid, flash::layout<32>::forward_floats, stream, p);
    else
      detail::flash_launch(detail::flash_forward_kernel<64>, grid, flash::layout<64>::forward_floats, stream, p);
  }

  //! dqkv (overwritten) from forward's qkv, out and lse and the gradient dout; delta is scratch
  //! of lse_size() floats.
  void backward(cudaStream_t stream, device_span<const float> qkv, device_span<const float> out,
                device_span<const float> lse, device_span<const float> dout, device_span<float> delta,
                device_span<float> dqkv) const {
    const char* who = "cuda::flash_attention::backward";
    const flash::problem p = flash::backward_problem(who, shape(), qkv, out, lse, dout, delta, dqkv);
    check_device(who);
    const dim3 grid(tiles(), static_cast<unsigned>(batch * heads));
    const auto rows = static_cast<unsigned>((lse_size() + flash::threads - 1) / flash::threads);
    if (head_dim == 32) {
      detail::flash_delta_kernel<32><<<rows, flash::threads, 0, stream>>>(p);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      detail::flash_launch(detail::flash_backward_kv_kernel<32>, grid, flash::layout<32>::backward_floats, stream, p);
      detail::flash_launch(detail::flash_backward_q_kernel<32>, grid, flash::layout<32>::backward_floats, stream, p);
    } else {
      detail::flash_delta_kernel<64><<<rows, flash::threads, 0, stream>>>(p);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      detail::flash_launch(detail::flash_backward_kv_kernel<64>, grid, flash::layout<64>::backward_floats, stream, p);
      detail::flash_launch(detail::flash_backward_q_kernel<64>, grid, flash::layout<64>::backward_floats, stream, p);
    }
  }

 private:
  nn::causal_attention shape() const noexcept { return {seq, batch, heads, head_dim}; }
  unsigned tiles() const noexcept { return static_cast<unsigned>((seq + flash::tile - 1) / flash::tile); }

  // The device can run the tiles: TF32 tensor cores, and backward's shared memory.
  void check_device(const char* who) const {
    // The current device (the one the caller's stream belongs to, as for every kernel here).
    int device = 0, major = 0, optin = 0;
    TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    TRIDENT_EXPECT(major >= 8, who, ": needs TF32 tensor cores (compute capability 8.0 or newer); device ", device,
                   " has ", major, ".x; use nn::cuda::causal_attention there");
    // Both directions' needs, checked before forward: a backward that cannot launch must not
    // surface in the middle of a training step.
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const std::size_t needed = sizeof(float) * (head_dim == 32 ? flash::layout<32>::backward_floats : flash::layout<64>::backward_floats);
    TRIDENT_EXPECT(needed <= static_cast<std::size_t>(optin), who, ": backward's tiles need ", needed, " bytes of shared memory "
                   "per block at head_dim ", head_dim, "; device ", device, " allows ", optin,
                   "; use nn::cuda::causal_attention there");
  }
};

}  // namespace trident::nn::cuda
