// trident/nn/cuda/layers.cuh — the reference layers on the GPU: linear (cuBLAS), activations, losses.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda; device memory as device_span, work on `stream`)
//   struct linear { in_features, out_features;
//     void forward(blas_ref, cudaStream_t, batch, x, W, b, y) const        y = x W^T + b
//         (x float; or bf16 under gemm_math::bf16, rounded by its producer: backward's x alike)
//     void backward(blas_ref, cudaStream_t, batch, x, W, dy, dx, dW, db) const
//                                                   dx = dy W (empty: skipped), dW += dy^T x, db += sum dy
//         (dy float; or bf16 under gemm_math::bf16, rounded by its producer, with no db) }
//   void activation_forward<Act>(x, y, stream)       Act = nn::relu or nn::gelu; y float, or bf16 (rounded)
//   void activation_backward<Act>(x, dy, dx, stream)
//   void add_to(x, y, stream)                        y += x element-wise (residual connections)
//     under gemm_math::bf16, backward's parts (dy rounded once for both GEMMs):
//     rounded_operands round_for_backward(blas_ref, stream, batch, x, W, dy) const
//     void input_gradient(blas_ref, stream, batch, rounded, dx) const    dx = dy W
//     void weight_gradient(blas_ref, stream, batch, rounded, dW) const   dW += dy^T x
//     void bias_gradient(stream, batch, dy, db) const                    db += column sums of dy
//   void round_to_bf16(in, out, count, stream)       out = bf16(in): gemm_math::bf16's rounding
//   void use_bf16_gemm(cublas_handle&)               the handle's GEMMs on bf16 operands from now on
//   void mse_loss_forward(pred, target, device_span<float> loss, stream)          loss[0] = mean (pred - t)^2
//   void mse_loss_backward(pred, target, dpred, float dloss, stream)
//   void softmax_cross_entropy_forward(batch, classes, logits, targets, device_span<float> loss, stream)
//   void softmax_cross_entropy_backward(batch, classes, logits, targets, dlogits, float dloss, stream)
//
// The same contracts, layouts, shape checks and accumulation semantics as the host layers
// (nn/linear.hpp, nn/activation.hpp, nn/loss.hpp), whose element functions the kernels reuse.
// Everything is asynchronous on `stream`; the loss forwards write their value into device memory
// (one float) so a training step never synchronises. A target outside [0, classes) cannot be
// thrown from a kernel: it makes that row's loss and gradients NaN.
//
// Deterministic: GEMMs are cuBLAS SGEMM in FP32 unless the blas_ref asks for tensor cores (see
// nn/cuda/cublas.hpp); bias gradients sum the rows in double over a fixed tree, 8 x 128 threads
// per tile of 8 columns (the host sums in row order in float: equal to rounding); the loss
// reductions run in one block over a fixed tree, in double. No atomics.
#pragma once

#if !defined(__CUDACC__)
#error "trident/nn/cuda/layers.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda/convert.cuh"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/gemm.hpp"
#include "trident/nn/linear.hpp"
#include "trident/nn/loss.hpp"

namespace trident::nn::cuda {

namespace detail {

inline constexpr unsigned block_size = 256;

inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

template <class = void>  // a template so that several translation units may include this header
__global__ void add_bias_kernel(device_span<float> y, device_span<const float> b, std::size_t out) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < y.size();
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = __fadd_rn(y[i], b[i % out]);
}

// Column sums over every row (bias gradients here, the norms' parameter gradients in norm.cuh):
// a block per tile of param_tile columns, its param_rows rows of threads each summing every
// param_rows-th row in double, then a fixed tree over those partial sums. One thread per column,
// summing every row itself, left the GPU idle at GPT-2's sizes (768 threads for 16k rows:
// milliseconds per sum); this reads each row once from (columns / 8) x 1024 threads. Tiles of 8
// columns (a warp reads 4 rows x 32 bytes, whole sectors) rather than 32 give a 768-wide
// LayerNorm or bias 96 blocks instead of 24: with 24, 24 of an H200's 132 SMs did the sums.
// Deterministic (fixed order, no atomics); the host sums in row order in float, so the two
// agree to rounding.
inline constexpr unsigned param_tile = 8, param_rows = 128;

inline dim3 param_grid(std::size_t hidden) {
  TRIDENT_EXPECT(hidden / param_tile < 0x7fffffffu, "cuda column sums: ", hidden, " columns exceed the grid's limit");
  return dim3(static_cast<unsigned>((hidden + param_tile - 1) / param_tile));
}

// Sums column j's partials of every thread row of the block into row 0 (all threads call it).
template <class = void>
__device__ void param_tree(double (&s)[param_rows][param_tile + 1]) {
  for (unsigned half = param_rows / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.y < half) s[threadIdx.y][threadIdx.x] += s[threadIdx.y + half][threadIdx.x];
  }
  __syncthreads();
}

// db[o] += the column sum of dy over `batch` rows (param_tree's tiles: the host's sum to rounding).
template <class = void>  // a template so that several translation units may include this header
__global__ void bias_grad_kernel(device_span<const float> dy, device_span<float> db, std::size_t batch) {
  __shared__ double sb[param_rows][param_tile + 1];
  const std::size_t out = db.size();
  const std::size_t o = blockIdx.x * std::size_t{param_tile} + threadIdx.x;
  double b = 0;
  if (o < out)
    for (std::size_t r = threadIdx.y; r < batch; r += param_rows) b += dy[r * out + o];
  sb[threadIdx.y][threadIdx.x] = b;
  param_tree(sb);
  if (threadIdx.y == 0 && o < out) db[o] = static_cast<float>(static_cast<double>(db[o]) + sb[0][threadIdx.x]);
}

// The element-wise kernels read and write float4s where every pointer is 16-byte aligned (one
// 16-byte access per thread and iteration instead of four 4-byte ones: the scalar GELU forward
// reached half of an H100's copy bandwidth), then the last size % 4 elements one at a time.
// Each element's arithmetic is the scalar one's, so the results are the same bits either way;
// dx may alias dy and y may alias x (a thread reads its elements before writing them).
inline bool aligned16(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class = void>  // a template so that several translation units may include this header
__global__ void add_to_kernel(device_span<const float> x, device_span<float> y) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < x.size();
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}
struct add_to_quads {
  const float* x;
  float* y;
  __device__ void quad(std::size_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    float4 b = reinterpret_cast<float4*>(y)[i];
    b = make_float4(__fadd_rn(b.x, a.x), __fadd_rn(b.y, a.y), __fadd_rn(b.z, a.z), __fadd_rn(b.w, a.w));
    reinterpret_cast<float4*>(y)[i] = b;
  }
  __device__ void one(std::size_t i) const { y[i] = __fadd_rn(y[i], x[i]); }
};

// Out: float, or bf16 (the value rounded as bf16's constructor rounds).
template <class Act, class Out = float>
__global__ void activation_forward_kernel(device_span<const float> x, device_span<Out> y) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < x.size();
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = Out(Act::value(x[i]));
}
// Out as activation_forward_kernel's (bf16: 8-byte stores of four).
template <class Act, class Out = float>
struct forward_quads {
  const float* x;
  Out* y;
  __device__ void quad(std::size_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    if constexpr (std::is_same_v<Out, float>) {
      reinterpret_cast<float4*>(y)[i] = make_float4(Act::value(a.x), Act::value(a.y), Act::value(a.z), Act::value(a.w));
    } else {
      const auto bits = [](float v) { return static_cast<unsigned>(Out(v).bits()); };
      reinterpret_cast<uint2*>(y)[i] = uint2{bits(Act::value(a.x)) | (bits(Act::value(a.y)) << 16),
                                             bits(Act::value(a.z)) | (bits(Act::value(a.w)) << 16)};
    }
  }
  __device__ void one(std::size_t i) const { y[i] = Out(Act::value(x[i])); }
};

template <class Act>
__global__ void activation_backward_kernel(device_span<const float> x, device_span<const float> dy,
                                           device_span<float> dx) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < x.size();
       i += std::size_t{gridDim.x} * blockDim.x)
    dx[i] = Act::grad(x[i], dy[i]);
}
template <class Act>
struct backward_quads {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void quad(std::size_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i], g = reinterpret_cast<const float4*>(dy)[i];
    reinterpret_cast<float4*>(dx)[i] =
        make_float4(Act::grad(a.x, g.x), Act::grad(a.y, g.y), Act::grad(a.z, g.z), Act::grad(a.w, g.w));
  }
  __device__ void one(std::size_t i) const { dx[i] = Act::grad(x[i], dy[i]); }
};

// f.quad(i) for the float4s i < n / 4 of n elements, then f.one(i) for the last n % 4 elements.
template <class F>
__global__ void quads_kernel(std::size_t n, F f) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x, first = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  for (std::size_t i = first; i < n / 4; i += stride) f.quad(i);
  if (first < n % 4) f.one(n - n % 4 + first);
}

// A fixed pairwise tree over the block's shared values (blockDim.x == block_size, a power of 2):
// the same bits every run. Every thread returns the total.
template <class T, class Combine>
__device__ T block_reduce(T value, T* shared, Combine combine) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = block_size / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();  // shared may be reused right away
  return total;
}

struct max_op {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct add_op {
  __device__ double operator()(double a, double b) const { return a + b; }
};

template <class = void>  // a template so that several translation units may include this header
__global__ void mse_forward_kernel(device_span<const float> pred, device_span<const float> target,
                                   device_span<float> loss) {
  __shared__ double shared[block_size];
  double sum = 0;
  for (std::size_t i = threadIdx.x; i < pred.size(); i += block_size) {
    const double e = static_cast<double>(pred[i]) - target[i];
    sum += e * e;
  }
  sum = block_reduce(sum, shared, add_op{});
  if (threadIdx.x == 0) loss[0] = static_cast<float>(sum / static_cast<double>(pred.size()));
}

template <class = void>  // a template so that several translation units may include this header
__global__ void mse_backward_kernel(device_span<const float> pred, device_span<const float> target,
                                    device_span<float> dpred, float factor) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < pred.size();
       i += std::size_t{gridDim.x} * blockDim.x)
    dpred[i] = __fmul_rn(factor, __fsub_rn(pred[i], target[i]));  // no FMA: the host's rounding
}

struct row_stats {
  float max;
  double sum;
};

// The row's max and sum of exp(x - max), by the whole block.
__device__ inline row_stats block_row_stats(const float* row, std::size_t classes, float* fshared,
                                            double* dshared) {
  float max = -INFINITY;
  for (std::size_t c = threadIdx.x; c < classes; c += block_size) max = row[c] > max ? row[c] : max;
  max = block_reduce(max, fshared, max_op{});
  double sum = 0;
  for (std::size_t c = threadIdx.x; c < classes; c += block_size) sum += exp(static_cast<double>(row[c]) - max);
  sum = block_reduce(sum, dshared, add_op{});
  return {max, sum};
}

__device__ inline bool valid_target(std::int32_t t, std::size_t classes) {
  return t >= 0 && static_cast<std::size_t>(t) < classes;
}

// One block walks the rows in order: the mean is one fixed sum.
template <class = void>  // a template so that several translation units may include this header
__global__ void cross_entropy_forward_kernel(device_span<const float> logits, device_span<const std::int32_t> targets,
                                             std::size_t classes, device_span<float> loss) {
  __shared__ float fshared[block_size];
  __shared__ double dshared[block_size];
  double total = 0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    const float* row = logits.data() + r * classes;
    const row_stats s = block_row_stats(row, classes, fshared, dshared);
    const std::int32_t t = targets[r];
    total += valid_target(t, classes) ? (static_cast<double>(s.max) + log(s.sum)) - row[t] : NAN;
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(total / static_cast<double>(targets.size()));
}

// One block per row.
template <class = void>  // a template so that several translation units may include this header
__global__ void cross_entropy_backward_kernel(device_span<const float> logits, device_span<const std::int32_t> targets,
                                              std::size_t classes, device_span<float> dlogits, double scale) {
  __shared__ float fshared[block_size];
  __shared__ double dshared[block_size];
  const std::size_t r = blockIdx.x;
  const float* row = logits.data() + r * classes;
  const row_stats s = block_row_stats(row, classes, fshared, dshared);
  const std::int32_t t = targets[r];
  const bool valid = valid_target(t, classes);
  for (std::size_t c = threadIdx.x; c < classes; c += block_size) {
    const double p = exp(static_cast<double>(row[c]) - s.max) / s.sum;
    const double onehot = static_cast<std::int32_t>(c) == t ? 1.0 : 0.0;
    dlogits.data()[r * classes + c] = valid ? static_cast<float>(scale * (p - onehot)) : NAN;
  }
}

}  // namespace detail

//! out[i] = bf16(in[i]) for i < count on `stream`, rounded as core/half.hpp rounds (to nearest,
//! ties to even): the trident::nn::bf16_rounding that gemm_math::bf16 rounds its operands with,
//! core/cuda/convert.cuh's conversion (four at a time where aligned) under that signature.
inline void round_to_bf16(const float* in, bf16* out, std::size_t count, cudaStream_t stream) {
  trident::cuda::convert<float, bf16>(device_span<const float>(in, count), device_span<bf16>(out, count), stream);
}

//! The GEMMs through `blas` from now on round their float operands to bf16 and run on bf16
//! tensor cores with FP32 sums (gemm_math::bf16, nn/cuda/cublas.hpp), what PyTorch's autocast
//! to bf16 does to a matmul: about twice TF32's speed, and each operand's rounding error 2^-9
//! instead of TF32's 2^-11.
//!
//!   trident::nn::cublas_handle blas;
//!   trident::nn::cuda::use_bf16_gemm(blas);
//!   fc.forward(blas, stream, batch, x, w, b, y);     // x and w rounded to bf16, y in float
inline void use_bf16_gemm(cublas_handle& blas) { blas.set_math(gemm_math::bf16, &round_to_bf16); }

//! y = x W^T + b on the GPU (cuBLAS), PyTorch layouts; nn::linear's contract.
//!
//!   trident::nn::cublas_handle blas;
//!   trident::nn::cuda::linear fc{.in_features = 784, .out_features = 128};
//!   fc.forward(blas, stream, batch, x.device_handle(), w.device_handle(), b.device_handle(), y.device_handle());
struct linear {
  std::size_t in_features = 0;
  std::size_t out_features = 0;

  std::size_t weight_size() const noexcept { return in_features * out_features; }
  std::size_t bias_size() const noexcept { return out_features; }

  void forward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const float> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(handle, stream, batch, x, w, b, y);
  }
  //! forward with x already in bf16, under gemm_math::bf16 only (a producer wrote its output
  //! rounded: nothing rounds x again); W alone is rounded. The same bits as forward on the
  //! float x that rounds to this one when x is 256-byte aligned, as the rounded copies are (a
  //! buffer of its own is; cuBLASLt may choose another algorithm for a less aligned view).
  void forward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const bf16> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(handle, stream, batch, x, w, b, y);
  }

  //! dx = dy W (overwritten; skipped when empty, and then W may be empty), dW += dy^T x,
  //! db += column sums of dy (accumulated; db empty: no bias). Under gemm_math::bf16, dy is
  //! rounded once for both GEMMs (round_for_backward), not once per GEMM.
  void backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const float> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(handle, stream, batch, x, w, dy, dx, dw, db);
  }
  //! backward with x already in bf16 (as forward's overload): W and dy alone are rounded.
  void backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const bf16> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(handle, stream, batch, x, w, dy, dx, dw, db);
  }
  //! backward with dy already in bf16, under gemm_math::bf16 only: its producer wrote it rounded
  //! (as the vocabulary-parallel cross-entropy's backward does for the output head), so nothing
  //! reads or rounds a float dy. The same bits as backward on the float dy that rounds to this
  //! one, for a 256-byte aligned dy (a buffer of its own is). No bias gradient (db empty): its
  //! column sums are taken over the float dy. x float or bf16, as in the other overloads.
  void backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const float> x,
                device_span<const float> w, device_span<const bf16> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(handle, stream, batch, x, w, dy, dx, dw, db);
  }
  void backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const bf16> x,
                device_span<const float> w, device_span<const bf16> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(handle, stream, batch, x, w, dy, dx, dw, db);
  }

  //! backward's operands rounded to bf16 once, for gemm_math::bf16, into the handle's scratch:
  //! valid for GEMMs queued on the same stream until the next rounding through the same handle
  //! (on any stream). w may be empty (no input gradient wanted).
  struct rounded_operands {
    const bf16* x = nullptr;
    const bf16* w = nullptr;
    const bf16* dy = nullptr;
  };
  rounded_operands round_for_backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const float> x,
                                      device_span<const float> w, device_span<const float> dy) const {
    return round_impl(handle, stream, batch, x, w, dy);
  }
  //! The same with x already in bf16 (gemm_math::bf16 only): W and dy alone are rounded, and the
  //! copies hold x itself.
  rounded_operands round_for_backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const bf16> x,
                                      device_span<const float> w, device_span<const float> dy) const {
    return round_impl(handle, stream, batch, x, w, dy);
  }
  //! The same with dy already in bf16 (gemm_math::bf16 only; see backward): the copies hold dy
  //! itself, and x too when it is in bf16.
  rounded_operands round_for_backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const float> x,
                                      device_span<const float> w, device_span<const bf16> dy) const {
    return round_impl(handle, stream, batch, x, w, dy);
  }
  rounded_operands round_for_backward(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const bf16> x,
                                      device_span<const float> w, device_span<const bf16> dy) const {
    return round_impl(handle, stream, batch, x, w, dy);
  }
  //! dx = dy W (overwritten) from round_for_backward's copies (which must hold W).
  void input_gradient(blas_ref handle, cudaStream_t stream, std::size_t batch, const rounded_operands& r, device_span<float> dx) const {
    TRIDENT_EXPECT(dx.size() == batch * in_features, "cuda::linear::input_gradient: dx has ", dx.size(), " elements, expected [",
                   batch, ", ", in_features, "]");
    if (dx.empty()) return;
    if (out_features == 0) {  // an empty sum: dx = 0 (as gemm on floats does for k = 0)
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(dx.data(), 0, dx.size() * sizeof(float), stream));
      return;
    }
    TRIDENT_EXPECT(r.w != nullptr, "cuda::linear::input_gradient: the rounded operands hold no W (round_for_backward "
                   "was given none)");
    gemm(handle, stream, op::n, op::n, batch, in_features, out_features, 1.0f, r.dy, out_features, r.w, in_features, 0.0f,
         dx.data(), in_features);
  }
  //! dW += dy^T x from round_for_backward's copies.
  void weight_gradient(blas_ref handle, cudaStream_t stream, std::size_t batch, const rounded_operands& r, device_span<float> dw) const {
    TRIDENT_EXPECT(dw.size() == weight_size(), "cuda::linear::weight_gradient: dW has ", dw.size(), " elements, expected ",
                   weight_size());
    if (batch == 0) return;  // nothing to add (cuBLAS on bf16 refuses k = 0)
    gemm(handle, stream, op::t, op::n, out_features, in_features, batch, 1.0f, r.dy, out_features, r.x, in_features, 1.0f,
         dw.data(), in_features);
  }
  //! db += column sums of dy (db empty: nothing), in float.
  void bias_gradient(cudaStream_t stream, std::size_t batch, device_span<const float> dy, device_span<float> db) const {
    if (db.empty()) return;
    detail::bias_grad_kernel<><<<detail::param_grid(out_features), dim3(detail::param_tile, detail::param_rows), 0, stream>>>(
        dy, db, batch);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  template <class X>
  void forward_impl(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const X> x, device_span<const float> w,
                    device_span<const float> b, device_span<float> y) const {
    constexpr bool x_bf16 = std::is_same_v<X, bf16>;
    const std::size_t in = in_features, out = out_features;
    nn::detail::check_linear_forward("cuda::linear::forward", batch, in, out, x.size(), w.size(), b.size(), y.size());
    TRIDENT_EXPECT(!x_bf16 || handle.math == gemm_math::bf16, "cuda::linear::forward: x in bf16 needs gemm_math::bf16; the "
                   "blas_ref is in ", name(handle.math));
    // With a bias, one cuBLASLt call adds it in the GEMM's epilogue (a raw handle: a second pass).
    if (!b.empty() && gemm_bias(handle, stream, batch, out, in, x.data(), w.data(), b.data(), y.data())) return;
    if (y.empty()) return;
    if constexpr (!x_bf16) {
      gemm(handle, stream, op::n, op::t, batch, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out);
    } else if (in == 0) {  // an empty sum (cuBLAS on bf16 refuses k = 0; gemm on floats does this): y = 0
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(y.data(), 0, y.size() * sizeof(float), stream));
    } else {
      const bf16* w16 = detail::round_all<1>(handle, stream, {{{w.data(), w.size()}}})[0];
      gemm(handle, stream, op::n, op::t, batch, out, in, 1.0f, x.data(), in, w16, in, 0.0f, y.data(), out);
    }
    if (!b.empty()) {
      detail::add_bias_kernel<><<<detail::grid_for(y.size()), detail::block_size, 0, stream>>>(y, b, out);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
    }
  }
  template <class X, class Dy>
  void backward_impl(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const X> x, device_span<const float> w,
                     device_span<const Dy> dy, device_span<float> dx, device_span<float> dw, device_span<float> db) const {
    const std::size_t in = in_features, out = out_features;
    nn::detail::check_linear_backward("cuda::linear::backward", batch, in, out, x.size(), w.size(), dy.size(), dx.size(), dw.size(),
                                      db.size());
    if constexpr (std::is_same_v<Dy, bf16>) {
      TRIDENT_EXPECT(db.empty(), "cuda::linear::backward: dy in bf16 takes no bias gradient (db has ", db.size(),
                     " elements, expected none): the bias's column sums are taken over the float dy");
    }
    if constexpr (std::is_same_v<X, float> && std::is_same_v<Dy, float>) {
      if (handle.math != gemm_math::bf16) {
        if (!dx.empty()) gemm(handle, stream, op::n, op::n, batch, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx.data(), in);
        gemm(handle, stream, op::t, op::n, out, in, batch, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in);
        bias_gradient(stream, batch, dy, db);
        return;
      }
    }
    const auto r = round_for_backward(handle, stream, batch, x, dx.empty() ? device_span<const float>{} : w, dy);
    if (!dx.empty()) input_gradient(handle, stream, batch, r, dx);
    weight_gradient(handle, stream, batch, r, dw);
    if constexpr (std::is_same_v<Dy, float>) bias_gradient(stream, batch, dy, db);
  }
  // round_for_backward: the float operands among x, W and dy rounded into the handle's scratch
  // (in one reservation), the bf16 ones (a producer rounded them) used as they are.
  template <class X, class Dy>
  rounded_operands round_impl(blas_ref handle, cudaStream_t stream, std::size_t batch, device_span<const X> x,
                              device_span<const float> w, device_span<const Dy> dy) const {
    check_rounding(batch, x.size(), w.size(), dy.size());
    constexpr bool x16 = std::is_same_v<X, bf16>, dy16 = std::is_same_v<Dy, bf16>;
    if constexpr (x16 || dy16) {
      TRIDENT_EXPECT(handle.math == gemm_math::bf16, "cuda::linear::round_for_backward: ", x16 ? "x" : "dy",
                     " in bf16 needs gemm_math::bf16; the blas_ref is in ", name(handle.math));
    }
    const auto operand = [](auto span) -> std::pair<const float*, std::size_t> {
      if constexpr (std::is_same_v<decltype(span), device_span<const float>>) return {span.data(), span.size()};
      else return {nullptr, 0};  // in bf16 already: nothing to round
    };
    const auto r = detail::round_all<3>(handle, stream, {{operand(x), {w.data(), w.size()}, operand(dy)}});
    const auto kept = [](auto span, const bf16* rounded) -> const bf16* {
      if constexpr (std::is_same_v<decltype(span), device_span<const bf16>>) return span.empty() ? nullptr : span.data();
      else return rounded;
    };
    return {kept(x, r[0]), r[1], kept(dy, r[2])};
  }
  void check_rounding(std::size_t batch, std::size_t x, std::size_t w, std::size_t dy) const {
    TRIDENT_EXPECT(x == batch * in_features && dy == batch * out_features && (w == 0 || w == weight_size()),
                   "cuda::linear::round_for_backward: x, w, dy have ", x, ", ", w, ", ", dy, " elements, expected [", batch, ", ",
                   in_features, "], [", out_features, ", ", in_features, "] or none, [", batch, ", ", out_features, "]");
  }
};

//! y = Act::value(x) element-wise on `stream` (Act: nn::relu, nn::gelu); y may alias x.
template <class Act>
void activation_forward(device_span<const float> x, device_span<float> y, cudaStream_t stream = 0) {
  nn::detail::check_elementwise("cuda::activation_forward", x.size(), y.size());
  if (x.empty()) return;
  if (detail::aligned16(x.data()) && detail::aligned16(y.data()))
    detail::quads_kernel<<<detail::grid_for((x.size() + 3) / 4), detail::block_size, 0, stream>>>(
        x.size(), detail::forward_quads<Act>{x.data(), y.data()});
  else
    detail::activation_forward_kernel<Act><<<detail::grid_for(x.size()), detail::block_size, 0, stream>>>(x, y);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! y = Act::value(x) rounded to bf16 (as bf16's constructor rounds): an activation whose only
//! reader is a GEMM on bf16 operands (gemm_math::bf16) writes what that GEMM would round to.
template <class Act>
void activation_forward(device_span<const float> x, device_span<bf16> y, cudaStream_t stream = 0) {
  nn::detail::check_elementwise("cuda::activation_forward", x.size(), y.size());
  if (x.empty()) return;
  if (detail::aligned16(x.data()) && reinterpret_cast<std::uintptr_t>(y.data()) % 8 == 0)
    detail::quads_kernel<<<detail::grid_for((x.size() + 3) / 4), detail::block_size, 0, stream>>>(
        x.size(), detail::forward_quads<Act, bf16>{x.data(), y.data()});
  else
    detail::activation_forward_kernel<Act, bf16><<<detail::grid_for(x.size()), detail::block_size, 0, stream>>>(x, y);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! dx = Act::grad(x, dy) element-wise; x is the forward input; dx may alias dy.
template <class Act>
void activation_backward(device_span<const float> x, device_span<const float> dy, device_span<float> dx,
                         cudaStream_t stream = 0) {
  nn::detail::check_elementwise("cuda::activation_backward", x.size(), dy.size());
  nn::detail::check_elementwise("cuda::activation_backward", x.size(), dx.size());
  if (x.empty()) return;
  if (detail::aligned16(x.data()) && detail::aligned16(dy.data()) && detail::aligned16(dx.data()))
    detail::quads_kernel<<<detail::grid_for((x.size() + 3) / 4), detail::block_size, 0, stream>>>(
        x.size(), detail::backward_quads<Act>{x.data(), dy.data(), dx.data()});
  else
    detail::activation_backward_kernel<Act><<<detail::grid_for(x.size()), detail::block_size, 0, stream>>>(x, dy, dx);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! y += x element-wise on `stream` (a residual connection), bitwise the host's float additions.
inline void add_to(device_span<const float> x, device_span<float> y, cudaStream_t stream = 0) {
  nn::detail::check_elementwise("cuda::add_to", x.size(), y.size());
  if (x.empty()) return;
  if (detail::aligned16(x.data()) && detail::aligned16(y.data()))
    detail::quads_kernel<<<detail::grid_for((x.size() + 3) / 4), detail::block_size, 0, stream>>>(
        x.size(), detail::add_to_quads{x.data(), y.data()});
  else
    detail::add_to_kernel<><<<detail::grid_for(x.size()), detail::block_size, 0, stream>>>(x, y);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! loss[0] = mean((pred - target)^2), asynchronously (one block, double sums).
inline void mse_loss_forward(device_span<const float> pred, device_span<const float> target, device_span<float> loss,
                             cudaStream_t stream = 0) {
  nn::detail::check_mse("cuda::mse_loss_forward", pred.size(), target.size());
  TRIDENT_EXPECT(loss.size() == 1, "cuda::mse_loss_forward: loss has ", loss.size(), " elements, expected 1");
  detail::mse_forward_kernel<><<<1, detail::block_size, 0, stream>>>(pred, target, loss);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! dpred = dloss * 2 (pred - target) / N, bitwise the host's.
inline void mse_loss_backward(device_span<const float> pred, device_span<const float> target, device_span<float> dpred,
                              float dloss = 1.0f, cudaStream_t stream = 0) {
  nn::detail::check_mse("cuda::mse_loss_backward", pred.size(), target.size());
  nn::detail::check_mse("cuda::mse_loss_backward", pred.size(), dpred.size());
  const float factor = 2.0f * dloss / static_cast<float>(pred.size());
  detail::mse_backward_kernel<><<<detail::grid_for(pred.size()), detail::block_size, 0, stream>>>(pred, target, dpred,
                                                                                                  factor);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! loss[0] = mean over rows of logsumexp(row) - row[target], asynchronously.
inline void softmax_cross_entropy_forward(std::size_t batch, std::size_t classes, device_span<const float> logits,
                                          device_span<const std::int32_t> targets, device_span<float> loss,
                                          cudaStream_t stream = 0) {
  nn::detail::check_cross_entropy("cuda::softmax_cross_entropy_forward", batch, classes, logits.size(), targets.size());
  TRIDENT_EXPECT(loss.size() == 1, "cuda::softmax_cross_entropy_forward: loss has ", loss.size(),
                 " elements, expected 1");
  detail::cross_entropy_forward_kernel<><<<1, detail::block_size, 0, stream>>>(logits, targets, classes, loss);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! dlogits = dloss * (softmax(row) - onehot(target)) / batch.
inline void softmax_cross_entropy_backward(std::size_t batch, std::size_t classes, device_span<const float> logits,
                                           device_span<const std::int32_t> targets, device_span<float> dlogits,
                                           float dloss = 1.0f, cudaStream_t stream = 0) {
  const char* who = "cuda::softmax_cross_entropy_backward";
  nn::detail::check_cross_entropy(who, batch, classes, logits.size(), targets.size());
  TRIDENT_EXPECT(dlogits.size() == logits.size(), who, ": dlogits have ", dlogits.size(), " elements, expected [batch=",
                 batch, ", classes=", classes, "] = ", batch * classes);
  TRIDENT_EXPECT(batch <= 0x7fffffffu, who, ": batch ", batch, " exceeds the grid's limit");
  const double scale = static_cast<double>(dloss) / static_cast<double>(batch);
  detail::cross_entropy_backward_kernel<><<<static_cast<unsigned>(batch), detail::block_size, 0, stream>>>(
      logits, targets, classes, dlogits, scale);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trident::nn::cuda
