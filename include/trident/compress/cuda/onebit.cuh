// trident/compress/cuda/onebit.cuh — compress::onebit on device memory (nccl_comm).
// trident-requires: nvcc
//
// Synopsis (namespace trident::compress)
//   template <> struct onebit_engine<cuda_space>   what compress::onebit uses on a device:
//                                                  include this header (from a .cu file) to use
//                                                  onebit with nccl_comm
//
// The host's algorithm (compress/onebit.hpp: DeepSpeed's compressed all-reduce, worker and
// server error feedback, 1-bit Adam's momentum mode) in kernels on the communicator's stream,
// with the same bits: every float operation is an explicitly rounded intrinsic in the host's
// order, and the two RMS scales sum their squares in detail::rms's fixed order (lanes, then a
// halving tree per block, then over the blocks). The compressed rounds' collectives carry no
// arithmetic (an all_to_all of packed signs, all_gathers of signs and scales), so they do not
// depend on NCCL's order either: bit for bit the host's, on any number of ranks (the warm-up's
// plain all-reduce is NCCL's sum, the host's on two ranks). The host must not contract its float
// arithmetic into FMA (g++ does not on x86-64 without -mfma; -ffp-contract=off elsewhere). A bucket's buffers (its
// errors, its momentum and the scratch of one reduction) are allocated at its first reduction
// (mem_category::communication) and kept; nothing is read back, allocated or waited for after.
//
// The scales are reduced by one grid of detail::rms_blocks x detail::rms_block threads, whatever
// the bucket's size: fine for the buckets of this library's tests and models; a bucket of
// hundreds of millions of elements would want more lanes (and the host the same order).
#pragma once

#if !defined(__CUDACC__)
#error "trident/compress/cuda/onebit.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/compress/onebit.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/cuda/convert.cuh"

namespace trident::compress {

namespace onebit_detail {

__device__ inline float sign_at(const std::uint8_t* packed, std::size_t i) {
  return (packed[i / 8] >> (7 - i % 8) & 1) != 0 ? 1.0f : -1.0f;
}

#define TRIDENT_ONEBIT_FOR_EACH(i, n)                                                                   \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n);  \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// x[i] = float(data[i]), or 1-bit Adam's momentum beta m + (1 - beta) float(data[i]).
template <class T>
__global__ void prepare_kernel(const T* __restrict__ data, const float* __restrict__ m, float* __restrict__ x, std::size_t n,
                               float beta, bool momentum) {
  TRIDENT_ONEBIT_FOR_EACH(i, n) {
    const float g = static_cast<float>(data[i]);
    x[i] = momentum ? __fadd_rn(__fmul_rn(beta, m[i]), __fmul_rn(__fsub_rn(1.0f, beta), g)) : g;
  }
}

// The warm-up's momentum: m = beta m + (1 - beta) g, g the all-reduced gradient.
template <class T>
__global__ void follow_momentum_kernel(const T* __restrict__ data, float* __restrict__ m, std::size_t n, float beta) {
  TRIDENT_ONEBIT_FOR_EACH(i, n) {
    m[i] = __fadd_rn(__fmul_rn(beta, m[i]), __fmul_rn(__fsub_rn(1.0f, beta), static_cast<float>(data[i])));
  }
}

template <class = void>
__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ e, std::size_t n) {
  TRIDENT_ONEBIT_FOR_EACH(i, n) x[i] = __fadd_rn(x[i], e[i]);
}

// detail::rms's first two levels: lane l = blockIdx.x * rms_block + threadIdx.x sums x[l],
// x[l + lanes], ... in double, then the block's lanes by a halving tree into sums[blockIdx.x].
template <class = void>
__global__ void rms_lanes_kernel(const float* __restrict__ x, std::size_t n, double* __restrict__ sums) {
  __shared__ double lane[detail::rms_block];
  const std::size_t l = static_cast<std::size_t>(blockIdx.x) * detail::rms_block + threadIdx.x;
  double s = 0;
  for (std::size_t i = l; i < n; i += detail::rms_lanes) {
    const double v = static_cast<double>(x[i]);
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  lane[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = detail::rms_block / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] = __dadd_rn(lane[threadIdx.x], lane[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = lane[0];
}

// The blocks' halving tree and the scale, in one thread (rms_blocks values).
template <class = void>
__global__ void rms_finish_kernel(double* __restrict__ sums, std::size_t n, float* __restrict__ scale) {
  for (std::size_t half = detail::rms_blocks / 2; half > 0; half /= 2)
    for (std::size_t t = 0; t < half; ++t) sums[t] = __dadd_rn(sums[t], sums[t + half]);
  *scale = n == 0 ? 0.0f : static_cast<float>(__ddiv_rn(::sqrt(sums[0]), ::sqrt(static_cast<double>(n))));
}

// Signs packed 8 to a byte (first element in the highest bit, NaN as +) and, with error
// feedback, error[i] = x[i] - scale * sign(i).
template <class = void>
__global__ void pack_kernel(const float* __restrict__ x, std::size_t bytes, std::uint8_t* __restrict__ signs,
                            const float* __restrict__ scale, float* __restrict__ error) {
  TRIDENT_ONEBIT_FOR_EACH(byte, bytes) {
    unsigned v = 0;
    for (std::size_t bit = 0; bit < 8; ++bit) v = v << 1 | (x[byte * 8 + bit] < 0.0f ? 0u : 1u);
    signs[byte] = static_cast<std::uint8_t>(v);
    if (error != nullptr) {
      const float s = *scale;
      for (std::size_t bit = 0; bit < 8; ++bit) {
        const std::size_t i = byte * 8 + bit;
        const float sign = (v >> (7 - bit) & 1u) != 0 ? 1.0f : -1.0f;
        error[i] = __fsub_rn(x[i], __fmul_rn(s, sign));
      }
    }
  }
}

// The chunk owner's average: y[i] = sum over ranks j (in order) of sign_j(i) * (scale_j / ranks),
// plus the server error.
template <class = void>
__global__ void average_kernel(const std::uint8_t* __restrict__ theirs, const float* __restrict__ scales, int ranks,
                               std::size_t chunk, const float* __restrict__ server, float* __restrict__ y) {
  const float inv = __fdiv_rn(1.0f, static_cast<float>(ranks));
  TRIDENT_ONEBIT_FOR_EACH(i, chunk) {
    float acc = 0.0f;
    for (int j = 0; j < ranks; ++j) {
      const float w = __fmul_rn(scales[j], inv);
      acc = __fadd_rn(acc, __fmul_rn(sign_at(theirs + static_cast<std::size_t>(j) * chunk / 8, i), w));
    }
    if (server != nullptr) acc = __fadd_rn(acc, server[i]);
    y[i] = acc;
  }
}

// The decompressed average of the tensor elements: r[i] = sign(i) * the scale of i's chunk.
template <class = void>
__global__ void unpack_kernel(const std::uint8_t* __restrict__ signs, const float* __restrict__ scales, std::size_t chunk,
                              std::size_t n, float* __restrict__ r) {
  TRIDENT_ONEBIT_FOR_EACH(i, n) r[i] = __fmul_rn(sign_at(signs, i), scales[i / chunk]);
}

// Back into the bucket: times the ranks for sum; in momentum mode the "gradient" that turns the
// optimizer's first moment into the average, m = beta m_last + (1 - beta) g, and m kept.
template <class T>
__global__ void finish_kernel(const float* __restrict__ out, float* __restrict__ m, T* __restrict__ data, std::size_t n,
                              float ranks, bool sum, float beta, bool momentum) {
  TRIDENT_ONEBIT_FOR_EACH(i, n) {
    float v = out[i];
    if (sum) v = __fmul_rn(v, ranks);
    if (momentum) {
      const float avg = v;
      v = __fdiv_rn(__fsub_rn(avg, __fmul_rn(beta, m[i])), __fsub_rn(1.0f, beta));
      m[i] = avg;
    }
    data[i] = static_cast<T>(v);
  }
}

#undef TRIDENT_ONEBIT_FOR_EACH

// The kernels and copies go where the communicator's collectives go, or nothing orders them.
template <class Comm>
cudaStream_t stream_of(Comm& comm) {
  static_assert(requires { comm.stream(); }, "compress::onebit on a device: the communicator must have a stream()");
  return comm.stream();
}

// One bucket's device state: its errors and momentum (kept across steps, zero at first) and the
// scratch of one reduction.
struct bucket_state {
  std::size_t size = 0, n = 0, padded = 0, chunk = 0;
  int ranks = 0;
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [bucket offset, elements) of tensor data, merged
  buffer<float, cuda_space> worker, server, m, x, y, out, scale, scales, server_scale, server_scales;
  buffer<float, cuda_space> m_before;  // momentum mode: m as the last step found it (step_skipped)
  buffer<std::uint8_t, cuda_space> signs, theirs, server_signs, all_signs;
  buffer<double, cuda_space> sums;
};

}  // namespace onebit_detail

template <>
struct onebit_engine<cuda_space> {
  template <class Comm, class T>
  static void all_reduce(Comm& comm, const bucket_view<T, cuda_space>& b, const onebit_options& o, bool warming,
                         std::shared_ptr<void>& held) {
    namespace od = onebit_detail;
    const cudaStream_t stream = od::stream_of(comm);
    od::bucket_state& s = state(comm, b, held, stream);
    const bool momentum = o.momentum > 0.0f;
    constexpr int block = 256;
    auto grid = [](std::size_t n) { return cuda::grid_for(n == 0 ? 1 : n, block); };
    const std::size_t size = s.size;
    if (momentum) {  // kept for step_skipped: a skipped step's momentum is undone
      if (s.m_before.size() != size) s.m_before = buffer<float, cuda_space>(size == 0 ? 1 : size, mem_category::communication);
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s.m_before.data(), s.m.data(), size * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    if (warming) {
      space_span<T, cuda_space> data = b.data;
      comm.all_reduce(data, b.op);
      if (momentum) {
        od::follow_momentum_kernel<<<grid(size), block, 0, stream>>>(b.data.data(), s.m.data(), size, o.momentum);
        TRIDENT_CUDA_CHECK(cudaGetLastError());
      }
      return;
    }
    // The tensors' elements, momentum applied, gathered into x (padding out), plus the worker error.
    od::prepare_kernel<<<grid(size), block, 0, stream>>>(b.data.data(), s.m.data(), s.out.data(), size, o.momentum, momentum);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    std::size_t at = 0;
    for (const auto& [offset, count] : s.runs) {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s.x.data() + at, s.out.data() + offset, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      at += count;
    }
    if (s.padded > s.n) TRIDENT_CUDA_CHECK(cudaMemsetAsync(s.x.data() + s.n, 0, (s.padded - s.n) * sizeof(float), stream));
    if (o.error_feedback) {
      od::add_kernel<><<<grid(s.padded), block, 0, stream>>>(s.x.data(), s.worker.data(), s.padded);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
    }
    // Worker compression; phase 1: my chunk's signs from every rank, every rank's scale.
    rms(s.x.data(), s.padded, s.sums.data(), s.scale.data(), stream);
    od::pack_kernel<><<<grid(s.padded / 8), block, 0, stream>>>(s.x.data(), s.padded / 8, s.signs.data(), s.scale.data(),
                                                                 o.error_feedback ? s.worker.data() : nullptr);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    comm.all_to_all(space_span<const std::uint8_t, cuda_space>(s.signs.data(), s.padded / 8),
                    space_span<std::uint8_t, cuda_space>(s.theirs.data(), s.padded / 8));
    comm.all_gather(space_span<const float, cuda_space>(s.scale.data(), 1),
                    space_span<float, cuda_space>(s.scales.data(), static_cast<std::size_t>(s.ranks)));
    od::average_kernel<><<<grid(s.chunk), block, 0, stream>>>(s.theirs.data(), s.scales.data(), s.ranks, s.chunk,
                                                               o.error_feedback ? s.server.data() : nullptr, s.y.data());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    // Server compression of my chunk; phase 2: every chunk's signs and scale.
    rms(s.y.data(), s.chunk, s.sums.data(), s.server_scale.data(), stream);
    od::pack_kernel<><<<grid(s.chunk / 8), block, 0, stream>>>(s.y.data(), s.chunk / 8, s.server_signs.data(),
                                                                s.server_scale.data(), o.error_feedback ? s.server.data() : nullptr);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    comm.all_gather(space_span<const std::uint8_t, cuda_space>(s.server_signs.data(), s.chunk / 8),
                    space_span<std::uint8_t, cuda_space>(s.all_signs.data(), s.padded / 8));
    comm.all_gather(space_span<const float, cuda_space>(s.server_scale.data(), 1),
                    space_span<float, cuda_space>(s.server_scales.data(), static_cast<std::size_t>(s.ranks)));
    // Decompressed into x, scattered back to the tensors' places (padding 0), finished into the bucket.
    od::unpack_kernel<><<<grid(s.n), block, 0, stream>>>(s.all_signs.data(), s.server_scales.data(), s.chunk, s.n, s.x.data());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(s.out.data(), 0, size * sizeof(float), stream));
    at = 0;
    for (const auto& [offset, count] : s.runs) {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s.out.data() + offset, s.x.data() + at, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      at += count;
    }
    od::finish_kernel<<<grid(size), block, 0, stream>>>(s.out.data(), s.m.data(), b.data.data(), size,
                                                        static_cast<float>(s.ranks), b.op == reduce_op::sum, o.momentum, momentum);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! compress::onebit::step_skipped on a device: the errors back to 0 and the momentum back to
  //! what it was before the step, on the communicator's stream.
  template <class Comm>
  static void step_skipped(Comm& comm, const onebit_options& o, std::shared_ptr<void>& held) {
    auto* s = static_cast<onebit_detail::bucket_state*>(held.get());
    if (s == nullptr) return;
    const cudaStream_t stream = onebit_detail::stream_of(comm);
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(s->worker.data(), 0, s->worker.size() * sizeof(float), stream));
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(s->server.data(), 0, s->server.size() * sizeof(float), stream));
    if (o.momentum > 0.0f && s->m_before.size() == s->m.size())
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s->m.data(), s->m_before.data(), s->size * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }

 private:
  static void rms(const float* x, std::size_t n, double* sums, float* scale, cudaStream_t stream) {
    onebit_detail::rms_lanes_kernel<><<<detail::rms_blocks, detail::rms_block, 0, stream>>>(x, n, sums);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    onebit_detail::rms_finish_kernel<><<<1, 1, 0, stream>>>(sums, n, scale);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  // The bucket's buffers, made at its first reduction: zeroed on the stream, so the errors and
  // the momentum start at 0 as the host's.
  template <class Comm, class T>
  static onebit_detail::bucket_state& state(Comm& comm, const bucket_view<T, cuda_space>& b, std::shared_ptr<void>& held,
                                            cudaStream_t stream) {
    // The tensors' runs (adjacent tensors merged), recomputed each call: a bucket whose layout
    // changed starts afresh, as the host's errors do when their size changes.
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    std::size_t n = 0;
    for (const tensor_part& t : b.tensors) {
      if (t.numel() == 0) continue;
      if (!runs.empty() && runs.back().first + runs.back().second == t.offset) runs.back().second += t.numel();
      else runs.emplace_back(t.offset, t.numel());
      n += t.numel();
    }
    auto* s = static_cast<onebit_detail::bucket_state*>(held.get());
    if (s != nullptr && s->size == b.data.size() && s->ranks == comm.size() && s->runs == runs) return *s;
    auto fresh = std::make_shared<onebit_detail::bucket_state>();
    s = fresh.get();
    s->size = b.data.size();
    s->ranks = comm.size();
    s->runs = std::move(runs);
    s->n = n;
    const std::size_t unit = 8 * static_cast<std::size_t>(s->ranks);
    s->padded = (s->n + unit - 1) / unit * unit;
    s->chunk = s->padded / static_cast<std::size_t>(s->ranks);
    auto make = [&](auto& buf, std::size_t count) {
      using B = std::remove_reference_t<decltype(buf)>;
      buf = B(count == 0 ? 1 : count, mem_category::communication);
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.size() * sizeof(*buf.data()), stream));
    };
    const auto ranks = static_cast<std::size_t>(s->ranks);
    make(s->worker, s->padded);
    make(s->server, s->chunk);
    make(s->m, s->size);
    make(s->x, s->padded);
    make(s->y, s->chunk);
    make(s->out, s->size);
    make(s->scale, 1);
    make(s->scales, ranks);
    make(s->server_scale, 1);
    make(s->server_scales, ranks);
    make(s->signs, s->padded / 8);
    make(s->theirs, s->padded / 8);
    make(s->server_signs, s->chunk / 8);
    make(s->all_signs, s->padded / 8);
    make(s->sums, detail::rms_blocks);
    held = std::move(fresh);
    return *s;
  }
};

}  // namespace trident::compress
