// trident/nn/cuda/flash_bf16.cuh — causal attention on bf16 tensor cores with the scores in
// registers: nn/flash_bf16.hpp's warp programs run by GPU threads.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda)
//   struct flash_attention_bf16 { std::size_t seq, batch, heads, head_dim;     head_dim 32 or 64
//     std::size_t qkv_size() const, out_size() const, lse_size() const
//     void forward(stream, qkv, out, lse) const                  out, and lse [batch, heads, seq]
//     void backward(stream, qkv, out, lse, dout, delta, dqkv) const   delta: scratch, lse_size() }
//
// nn::cuda::flash_attention's forward contract (float qkv in, float out and lse out), computed
// as nn/flash_bf16.hpp says: q, k, v and P rounded to bf16, products on the tensor cores
// (mma.sync.m16n8k16, float accumulators), the softmax on the accumulators in registers, a row's
// statistics combined over its 4 lanes by __shfl_xor_sync. The algorithm and the fragment
// bookkeeping are the header's, tested on the host (nn.host) against the exact attention of the
// rounded inputs; this file adds only the device's side of the Exec: a thread's registers as the
// lane state, the mma instruction, the shuffles, the barriers. Backward in two deterministic
// passes as nn::cuda::flash_attention's (dk and dv per key tile, dq per query tile), with dout, P
// and dS rounded to bf16 too. Needs compute capability 8.0 or newer (bf16 mma.sync, ldmatrix); 18.5 KiB of
// shared memory per block at head_dim 64.
//
//   trident::nn::cuda::flash_attention_bf16 fa{.seq = 1024, .batch = 16, .heads = 12, .head_dim = 64};
//   fa.forward(stream, qkv, out, lse);
//   fa.backward(stream, qkv, out, lse, dout, delta, dqkv);
#pragma once

#if !defined(__CUDACC__)
#error "trident/nn/cuda/flash_bf16.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_bf16.hpp"

namespace trident::nn::cuda {

namespace detail {

// nn::flash_bf16's block execution on the GPU (host_exec's counterpart).
struct flash_bf16_device_exec {
  // A lane's state is the thread's own (registers, once the loops over fragments are unrolled).
  template <class T>
  struct lanes_of {
    T value;
    __device__ T& at(int /*w*/, int /*lane*/) { return value; }
  };
  template <class T>
  __device__ lanes_of<T> state() const {
    return {};
  }
  template <class F>
  __device__ void each(F&& f) const {
    f(static_cast<int>(threadIdx.x));
  }
  template <class F>
  __device__ void warps(F&& f) const {
    f(static_cast<int>(threadIdx.x) / 32);  // all 32 threads of a warp: mma.sync is collective
  }
  template <class G>
  __device__ void lanes(G&& g) const {
    g(static_cast<int>(threadIdx.x) % 32);
  }
  __device__ void sync() const { __syncthreads(); }

  template <class C, class A, class B>
  __device__ void mma(C&& c, A&& a, B&& b) const {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    flash_bf16::frag_c& d = c(lane);
    const flash_bf16::frag_a fa = a(lane);
    const flash_bf16::frag_b fb = b(lane);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d.v[0]), "+f"(d.v[1]), "+f"(d.v[2]), "+f"(d.v[3])
        : "r"(fa.r[0]), "r"(fa.r[1]), "r"(fa.r[2]), "r"(fa.r[3]), "r"(fb.r[0]), "r"(fb.r[1]));
#else
    // Not compiled for devices without bf16 tensor cores: flash_attention_bf16 refuses them
    // before launching.
    (void)d;
    (void)fa;
    (void)fb;
    __trap();
#endif
  }
  // host_exec::quad_max / quad_sum: x op x(lane ^ 1), then op x(lane ^ 2).
  template <class F>
  __device__ void quad_max(F&& f) const {
    float& x = f(static_cast<int>(threadIdx.x) % 32);
    float y = __shfl_xor_sync(0xffffffffu, x, 1);
    x = y > x ? y : x;
    y = __shfl_xor_sync(0xffffffffu, x, 2);
    x = y > x ? y : x;
  }
  template <class F>
  __device__ void quad_sum(F&& f) const {
    float& x = f(static_cast<int>(threadIdx.x) % 32);
    x = x + __shfl_xor_sync(0xffffffffu, x, 1);
    x = x + __shfl_xor_sync(0xffffffffu, x, 2);
  }
};

template <int D>
__global__ void __launch_bounds__(flash::threads) flash_bf16_forward_kernel(flash::problem p) {
  extern __shared__ __align__(16) std::uint16_t flash_bf16_smem[];
  flash_bf16_device_exec ex;
  // The last query tiles (the most key tiles) first, so that the grid's tail is short ones.
  flash_bf16::forward_block<D>(ex, p, flash_bf16_smem, static_cast<int>(gridDim.x - 1 - blockIdx.x),
                               static_cast<int>(blockIdx.y));
}

template <int D>
__global__ void __launch_bounds__(flash::threads) flash_bf16_delta_kernel(flash::problem p) {
  flash_bf16_device_exec ex;
  flash::delta_rows<D>(ex, p, static_cast<std::size_t>(blockIdx.x) * flash::threads);
}
template <int D>
__global__ void __launch_bounds__(flash::threads) flash_bf16_backward_kv_kernel(flash::problem p) {
  extern __shared__ __align__(16) std::uint16_t flash_bf16_smem[];
  flash_bf16_device_exec ex;
  // The first key tiles (the most query tiles) first.
  flash_bf16::backward_kv_block<D>(ex, p, flash_bf16_smem, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
}
template <int D>
__global__ void __launch_bounds__(flash::threads) flash_bf16_backward_q_kernel(flash::problem p) {
  extern __shared__ __align__(16) std::uint16_t flash_bf16_smem[];
  flash_bf16_device_exec ex;
  flash_bf16::backward_q_block<D>(ex, p, flash_bf16_smem, static_cast<int>(gridDim.x - 1 - blockIdx.x),
                                  static_cast<int>(blockIdx.y));
}

}  // namespace detail

//! Causal attention by tiles on bf16 tensor cores, scores in registers; see the header.
struct flash_attention_bf16 {
  std::size_t seq = 0;
  std::size_t batch = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  std::size_t qkv_size() const noexcept { return shape().qkv_size(); }
  std::size_t out_size() const noexcept { return shape().out_size(); }
  std::size_t lse_size() const noexcept { return batch * heads * seq; }

  //! out [seq, batch, heads, head_dim] and lse [batch, heads, seq] from qkv.
  void forward(cudaStream_t stream, device_span<const float> qkv, device_span<float> out, device_span<float> lse) const {
    const char* who = "cuda::flash_attention_bf16::forward";
    const flash::problem p = flash::forward_problem(who, shape(), qkv, out, lse);
    check_device(who);
    const dim3 grid(static_cast<unsigned>((seq + flash::tile - 1) / flash::tile), static_cast<unsigned>(batch * heads));
    if (head_dim == 32)
      launch(detail::flash_bf16_forward_kernel<32>, grid, flash_bf16::layout<32>::forward_bytes, stream, p);
    else
      launch(detail::flash_bf16_forward_kernel<64>, grid, flash_bf16::layout<64>::forward_bytes, stream, p);
  }

  //! dqkv (overwritten) from forward's qkv, out and lse and the gradient dout; delta is scratch
  //! of lse_size() floats. Two passes (dk and dv per key tile, dq per query tile): no atomics.
  void backward(cudaStream_t stream, device_span<const float> qkv, device_span<const float> out,
                device_span<const float> lse, device_span<const float> dout, device_span<float> delta,
                device_span<float> dqkv) const {
    const char* who = "cuda::flash_attention_bf16::backward";
    const flash::problem p = flash::backward_problem(who, shape(), qkv, out, lse, dout, delta, dqkv);
    check_device(who);
    const dim3 grid(static_cast<unsigned>((seq + flash::tile - 1) / flash::tile), static_cast<unsigned>(batch * heads));
    const auto rows = static_cast<unsigned>((lse_size() + flash::threads - 1) / flash::threads);
    if (head_dim == 32) {
      launch(detail::flash_bf16_delta_kernel<32>, dim3(rows), 0, stream, p);
      launch(detail::flash_bf16_backward_kv_kernel<32>, grid, flash_bf16::layout<32>::backward_bytes, stream, p);
      launch(detail::flash_bf16_backward_q_kernel<32>, grid, flash_bf16::layout<32>::backward_bytes, stream, p);
    } else {
      launch(detail::flash_bf16_delta_kernel<64>, dim3(rows), 0, stream, p);
      launch(detail::flash_bf16_backward_kv_kernel<64>, grid, flash_bf16::layout<64>::backward_bytes, stream, p);
      launch(detail::flash_bf16_backward_q_kernel<64>, grid, flash_bf16::layout<64>::backward_bytes, stream, p);
    }
  }

 private:
  nn::causal_attention shape() const noexcept { return {seq, batch, heads, head_dim}; }

  template <class Kernel>
  static void launch(Kernel kernel, dim3 grid, std::size_t bytes, cudaStream_t stream, const flash::problem& p) {
    static_assert(flash_bf16::layout<64>::backward_bytes <= 48 * 1024, "within the default 48 KiB of shared memory");
    kernel<<<grid, flash::threads, bytes, stream>>>(p);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  static void check_device(const char* who) {
    int device = 0, major = 0;
    TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    TRIDENT_EXPECT(major >= 8, who, ": needs bf16 tensor cores (compute capability 8.0 or newer); device ", device,
                   " has ", major, ".x; use nn::cuda::causal_attention there");
  }
};

}  // namespace trident::nn::cuda
