// trident/compress/cuda/powersgd.cuh — compress::powersgd on device memory (nccl_comm).
// trident-requires: nvcc
//
// Synopsis (namespace trident::compress)
//   template <> struct powersgd_engine<cuda_space>   what compress::powersgd uses on a device:
//                                                    include this header (from a .cu file) to
//                                                    use powersgd with nccl_comm
//
// The host's algorithm (compress/powersgd.hpp: PyTorch's powerSGD_hook) in kernels on the
// communicator's stream, step for step: the error added, the uncompressed tensors gathered and
// all-reduced, Q's random start (the host's generator, keyed the same way) or last step's Q,
// orthogonalised; P = M Q all-reduced and orthogonalised; Q = M^T P all-reduced (and averaged);
// the bucket P Q^T, the error what this rank's share of it missed. The products accumulate in
// double as the host's do, in a fixed order (a warp per row of P; M^T P in chunks of 128 rows,
// then over the chunks), so a run is the same bits every time on one GPU and within float
// rounding of the host's. Orthogonalisation is one thread block per matrix: Gram-Schmidt for
// r <= 2, Householder QR in double above (the host's steps, with block-wide sums in a fixed
// tree); that is O(rows r^2) work with r^2 block-wide sums per matrix, fine for PowerSGD's small
// ranks and slow for r in the hundreds.
//
// A bucket's buffers are made at its first compressed reduction (mem_category::communication)
// and kept: two floats per bucket element (the error and the reduced values), a float per
// element sent whole, P and Q (r (rows + cols) floats per matrix), M^T P's partial sums (r cols
// doubles per 128 rows: about numel r / 16 bytes) and the QR's scratch (three doubles per
// element of the larger of P and Q). A warm step allocates nothing, reads nothing back and waits
// for nothing. A bucket whose layout of tensors changes starts afresh (error 0, a new random
// start), as the host's does.
//
//   #include <trident/comm/nccl.hpp>
//   #include <trident/compress/cuda/powersgd.cuh>
//   zero.reduce_gradients_with(std::make_shared<trident::compress::powersgd>(options));
#pragma once

#if !defined(__CUDACC__)
#error "trident/compress/cuda/powersgd.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "trident/compress/powersgd.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/cuda/convert.cuh"

namespace trident::compress {

namespace powersgd_detail {

constexpr unsigned block = 256;
constexpr unsigned warps = block / 32;
constexpr std::size_t chunk_rows = 128;  // rows per partial sum of M^T P
constexpr unsigned max_grid_yz = 65535;

// A compressed tensor as the kernels read it: the host's powersgd_matrix, and where its partial
// sums of M^T P go (chunks x cols x r doubles).
struct matrix {
  std::size_t offset, rows, cols, r, p_at, q_at, index, part_at;
};
using whole = detail::powersgd_whole;

#define TRIDENT_POWERSGD_FOR_EACH(i, n)                                                            \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// The block's threads' values summed by a halving tree (the same order every run). Every thread
// of the block must call it; it returns the sum to all of them.
__device__ inline double block_sum(double v, double* lane) {
  lane[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = block / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] = __dadd_rn(lane[threadIdx.x], lane[threadIdx.x + half]);
    __syncthreads();
  }
  const double sum = lane[0];
  __syncthreads();  // before the next call overwrites lane[0]
  return sum;
}

// m = float(data) (+ m, the error kept from the last step, with error feedback).
template <class T>
__global__ void input_kernel(const T* __restrict__ data, float* __restrict__ m, std::size_t n, bool feedback) {
  TRIDENT_POWERSGD_FOR_EACH(i, n) {
    const float g = static_cast<float>(data[i]);
    m[i] = feedback ? __fadd_rn(g, m[i]) : g;
  }
}

// The uncompressed tensors (blockIdx.y) gathered into u, one after another.
template <class = void>
__global__ void gather_kernel(const float* __restrict__ m, float* __restrict__ u, const whole* __restrict__ table) {
  const whole t = table[blockIdx.y];
  TRIDENT_POWERSGD_FOR_EACH(e, t.n) u[t.u_at + e] = m[t.offset + e];
}

// Q's random start for matrix blockIdx.y: the host's draw (detail::start_key, detail::normal).
template <class = void>
__global__ void random_kernel(float* __restrict__ q, const matrix* __restrict__ table, std::uint64_t seed, std::uint64_t bucket,
                              std::uint64_t draw) {
  const matrix x = table[blockIdx.y];
  const std::uint64_t key = detail::start_key(seed, bucket, x.index, draw);
  TRIDENT_POWERSGD_FOR_EACH(e, x.cols * x.r) q[x.q_at + e] = detail::normal(key + e);
}

// detail::orthogonalize on P (factor_q false: rows x r at p_at) or Q (cols x r at q_at) of
// matrix blockIdx.x, in one block. Householder's double copies live in scratch: the matrix,
// the reflectors and the product, each `total` long (the P or Q array's size), at the factor's
// place.
template <class = void>
__global__ void __launch_bounds__(block) orthogonalize_kernel(float* __restrict__ a_all, const matrix* __restrict__ table,
                                                               bool factor_q, double* __restrict__ scratch, std::size_t total,
                                                               float epsilon) {
  __shared__ double lane[block];
  const matrix x = table[blockIdx.x];
  const std::size_t rows = factor_q ? x.cols : x.rows, r = x.r, at = factor_q ? x.q_at : x.p_at;
  float* a = a_all + at;
  const unsigned tid = threadIdx.x;
  if (r <= 2) {  // modified Gram-Schmidt in float, its sums in double (a column of norm 0 becomes 0)
    for (std::size_t j = 0; j < r; ++j) {
      double part = 0;
      for (std::size_t i = tid; i < rows; i += block) {
        const double v = static_cast<double>(a[i * r + j]);
        part = __dadd_rn(part, __dmul_rn(v, v));
      }
      const double norm = block_sum(part, lane);
      const float d = __fadd_rn(static_cast<float>(::sqrt(norm)), epsilon);
      for (std::size_t i = tid; i < rows; i += block) a[i * r + j] = d == 0.0f ? 0.0f : __fdiv_rn(a[i * r + j], d);
      for (std::size_t k = j + 1; k < r; ++k) {
        double dp = 0;
        for (std::size_t i = tid; i < rows; i += block)
          dp = __dadd_rn(dp, __dmul_rn(static_cast<double>(a[i * r + j]), static_cast<double>(a[i * r + k])));
        const float dot = static_cast<float>(block_sum(dp, lane));
        for (std::size_t i = tid; i < rows; i += block) a[i * r + k] = __fsub_rn(a[i * r + k], __fmul_rn(dot, a[i * r + j]));
      }
      __syncthreads();
    }
    return;
  }
  // Householder: R = H_{r-1} ... H_0 A, then Q = H_0 ... H_{r-1} [I; 0], in double.
  double* m = scratch + at;
  double* v = scratch + total + at;
  double* q = scratch + 2 * total + at;
  for (std::size_t e = tid; e < rows * r; e += block) {
    m[e] = static_cast<double>(a[e]);
    v[e] = 0.0;
    q[e] = e / r == e % r ? 1.0 : 0.0;
  }
  __syncthreads();
  const std::size_t steps = r < rows ? r : rows;
  for (std::size_t k = 0; k < steps; ++k) {
    double part = 0;
    for (std::size_t i = k + tid; i < rows; i += block) part = __dadd_rn(part, __dmul_rn(m[i * r + k], m[i * r + k]));
    const double norm = ::sqrt(block_sum(part, lane));
    if (norm == 0) continue;  // nothing to reflect: H_k = I (the same on every thread)
    const double alpha = m[k * r + k] > 0 ? -norm : norm;
    part = 0;
    for (std::size_t i = k + tid; i < rows; i += block) {
      const double w = __dsub_rn(m[i * r + k], i == k ? alpha : 0.0);
      v[i * r + k] = w;
      part = __dadd_rn(part, __dmul_rn(w, w));
    }
    const double vnorm = ::sqrt(block_sum(part, lane));
    if (vnorm == 0) continue;
    for (std::size_t i = k + tid; i < rows; i += block) v[i * r + k] = __ddiv_rn(v[i * r + k], vnorm);
    for (std::size_t j = k; j < r; ++j) {
      part = 0;
      for (std::size_t i = k + tid; i < rows; i += block) part = __dadd_rn(part, __dmul_rn(v[i * r + k], m[i * r + j]));
      const double dot2 = __dmul_rn(2.0, block_sum(part, lane));
      for (std::size_t i = k + tid; i < rows; i += block) m[i * r + j] = __dsub_rn(m[i * r + j], __dmul_rn(dot2, v[i * r + k]));
    }
    __syncthreads();  // m[(k + 1), (k + 1)] is read by every thread next
  }
  for (std::size_t k = steps; k-- > 0;) {
    for (std::size_t j = 0; j < r; ++j) {
      double part = 0;
      for (std::size_t i = k + tid; i < rows; i += block) part = __dadd_rn(part, __dmul_rn(v[i * r + k], q[i * r + j]));
      const double dot2 = __dmul_rn(2.0, block_sum(part, lane));
      for (std::size_t i = k + tid; i < rows; i += block) q[i * r + j] = __dsub_rn(q[i * r + j], __dmul_rn(dot2, v[i * r + k]));
    }
  }
  __syncthreads();
  for (std::size_t e = tid; e < rows * r; e += block) a[e] = static_cast<float>(q[e]);
}

// P = M Q for matrix blockIdx.y: a warp per row of P, its lanes over M's row in double, then
// summed by a fixed butterfly.
template <class = void>
__global__ void __launch_bounds__(block) mq_kernel(const float* __restrict__ m, const float* __restrict__ q, float* __restrict__ p,
                                                   const matrix* __restrict__ table) {
  const matrix x = table[blockIdx.y];
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (i >= x.rows) return;  // the whole warp
  const float* row = m + x.offset + i * x.cols;
  for (std::size_t j = 0; j < x.r; ++j) {
    double acc = 0;
    for (std::size_t k = lane; k < x.cols; k += 32)
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(row[k]), static_cast<double>(q[x.q_at + k * x.r + j])));
    for (unsigned off = 16; off > 0; off /= 2) acc = __dadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, off));
    if (lane == 0) p[x.p_at + i * x.r + j] = static_cast<float>(acc);
  }
}

// M^T P for matrix blockIdx.z, first stage: column k = a thread, rows in chunks of chunk_rows
// (blockIdx.y, striding), each chunk's r sums into part.
template <class = void>
__global__ void mtp_partial_kernel(const float* __restrict__ m, const float* __restrict__ p, double* __restrict__ part,
                                   const matrix* __restrict__ table) {
  const matrix x = table[blockIdx.z];
  const std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= x.cols) return;
  const std::size_t chunks = (x.rows + chunk_rows - 1) / chunk_rows;
  for (std::size_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const std::size_t end = (c + 1) * chunk_rows < x.rows ? (c + 1) * chunk_rows : x.rows;
    for (std::size_t j = 0; j < x.r; ++j) {
      double acc = 0;
      for (std::size_t i = c * chunk_rows; i < end; ++i)
        acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(m[x.offset + i * x.cols + k]), static_cast<double>(p[x.p_at + i * x.r + j])));
      part[x.part_at + (c * x.cols + k) * x.r + j] = acc;
    }
  }
}

// Second stage: Q[k, j] = the chunks' sums added in chunk order.
template <class = void>
__global__ void mtp_finish_kernel(const double* __restrict__ part, float* __restrict__ q, const matrix* __restrict__ table) {
  const matrix x = table[blockIdx.y];
  const std::size_t chunks = (x.rows + chunk_rows - 1) / chunk_rows;
  TRIDENT_POWERSGD_FOR_EACH(e, x.cols * x.r) {
    double acc = 0;
    for (std::size_t c = 0; c < chunks; ++c) acc = __dadd_rn(acc, part[x.part_at + c * x.cols * x.r + e]);
    q[x.q_at + e] = static_cast<float>(acc);
  }
}

template <class = void>
__global__ void divide_kernel(float* __restrict__ x, std::size_t n, float ranks) {
  TRIDENT_POWERSGD_FOR_EACH(i, n) x[i] = __fdiv_rn(x[i], ranks);
}

// The bucket's compressed tensors (matrix blockIdx.y): out = P Q^T, in double over r.
template <class = void>
__global__ void pqt_kernel(const float* __restrict__ p, const float* __restrict__ q, float* __restrict__ out,
                           const matrix* __restrict__ table) {
  const matrix x = table[blockIdx.y];
  TRIDENT_POWERSGD_FOR_EACH(e, x.rows * x.cols) {
    const std::size_t i = e / x.cols, k = e % x.cols;
    double acc = 0;
    for (std::size_t j = 0; j < x.r; ++j)
      acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(p[x.p_at + i * x.r + j]), static_cast<double>(q[x.q_at + k * x.r + j])));
    out[x.offset + e] = static_cast<float>(acc);
  }
}

// The uncompressed tensors (blockIdx.y) back in their places, averaged if asked.
template <class = void>
__global__ void scatter_kernel(const float* __restrict__ u, float* __restrict__ out, const whole* __restrict__ table, float ranks,
                               bool average) {
  const whole t = table[blockIdx.y];
  TRIDENT_POWERSGD_FOR_EACH(e, t.n) out[t.offset + e] = average ? __fdiv_rn(u[t.u_at + e], ranks) : u[t.u_at + e];
}

// With error feedback, m (the input) becomes the error: m - share * out; the bucket gets out.
template <class T>
__global__ void finish_kernel(const float* __restrict__ out, float* __restrict__ m, T* __restrict__ data, std::size_t n, float share,
                              bool feedback) {
  TRIDENT_POWERSGD_FOR_EACH(i, n) {
    if (feedback) m[i] = __fsub_rn(m[i], __fmul_rn(out[i], share));
    data[i] = static_cast<T>(out[i]);
  }
}

#undef TRIDENT_POWERSGD_FOR_EACH

// One bucket's buffers on the device.
struct bucket_state {
  std::size_t size = 0;
  std::vector<detail::powersgd_matrix> compressed;  // the layout these buffers were made for
  std::vector<whole> wholes;
  std::vector<matrix> table_host;  // kept alive for the asynchronous upload
  buffer<matrix, cuda_space> table;
  buffer<whole, cuda_space> whole_table;
  buffer<float, cuda_space> m, out, u, p, q;
  buffer<double, cuda_space> part, scratch;
  std::size_t max_rows = 0, max_cols = 0, max_chunks = 0, max_factor = 0, max_whole = 0;
  bool q_valid = false;
};

}  // namespace powersgd_detail

template <>
struct powersgd_engine<cuda_space> {
  template <class Comm, class T>
  static void all_reduce(Comm& comm, const bucket_view<T, cuda_space>& b, const powersgd_options& o,
                         const detail::powersgd_layout& layout, std::int64_t iter, std::shared_ptr<void>& held) {
    namespace pd = powersgd_detail;
    static_assert(requires { comm.stream(); }, "compress::powersgd on a device: the communicator must have a stream()");
    const cudaStream_t stream = comm.stream();
    pd::bucket_state& s = state(b, layout, held, stream);
    const std::size_t n = s.size;
    if (n == 0) return;
    const bool avg = b.op == reduce_op::avg;
    const float ranks = static_cast<float>(comm.size());
    const auto count = [](std::size_t c) { return static_cast<unsigned>(c); };
    const auto grid = [](std::size_t n_, std::size_t y = 1) {
      dim3 g = cuda::grid_for(n_ == 0 ? 1 : n_, static_cast<int>(pd::block));
      g.y = static_cast<unsigned>(y);
      return g;
    };
    const std::size_t matrices = s.compressed.size(), wholes = s.wholes.size();
    pd::input_kernel<<<grid(n), pd::block, 0, stream>>>(b.data.data(), s.m.data(), n, o.error_feedback);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    // Uncompressed tensors, all-reduced as they are.
    if (wholes > 0) {
      pd::gather_kernel<><<<grid(s.max_whole, wholes), pd::block, 0, stream>>>(s.m.data(), s.u.data(), s.whole_table.data());
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      space_span<float, cuda_space> u(s.u.data(), layout.u_size);
      comm.all_reduce(u, reduce_op::sum);
    }
    if (matrices > 0) {
      // Q: last step's (warm start) or a random start, orthogonalised either way.
      if (!o.warm_start || !s.q_valid) {
        const std::uint64_t draw = o.warm_start ? 0 : static_cast<std::uint64_t>(iter);
        pd::random_kernel<><<<grid(s.max_cols * s.max_factor, matrices), pd::block, 0, stream>>>(s.q.data(), s.table.data(), o.seed,
                                                                                                 b.index, draw);
        TRIDENT_CUDA_CHECK(cudaGetLastError());
      }
      pd::orthogonalize_kernel<><<<count(matrices), pd::block, 0, stream>>>(s.q.data(), s.table.data(), true, s.scratch.data(),
                                                                            layout.q_size, o.orthogonalization_epsilon);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      // P = M Q, summed over ranks, orthogonalised.
      pd::mq_kernel<><<<dim3(count((s.max_rows + pd::warps - 1) / pd::warps), count(matrices)), pd::block, 0, stream>>>(
          s.m.data(), s.q.data(), s.p.data(), s.table.data());
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      space_span<float, cuda_space> p(s.p.data(), layout.p_size);
      comm.all_reduce(p, reduce_op::sum);
      pd::orthogonalize_kernel<><<<count(matrices), pd::block, 0, stream>>>(s.p.data(), s.table.data(), false, s.scratch.data(),
                                                                            layout.p_size, o.orthogonalization_epsilon);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      // Q = M^T P, averaged over ranks.
      pd::mtp_partial_kernel<><<<dim3(count((s.max_cols + pd::block - 1) / pd::block),
                                      count(std::min<std::size_t>(s.max_chunks, pd::max_grid_yz)), count(matrices)),
                                 pd::block, 0, stream>>>(s.m.data(), s.p.data(), s.part.data(), s.table.data());
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      pd::mtp_finish_kernel<><<<grid(s.max_cols * s.max_factor, matrices), pd::block, 0, stream>>>(s.part.data(), s.q.data(),
                                                                                                    s.table.data());
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      space_span<float, cuda_space> q(s.q.data(), layout.q_size);
      comm.all_reduce(q, reduce_op::sum);
      if (avg) {
        pd::divide_kernel<><<<grid(layout.q_size), pd::block, 0, stream>>>(s.q.data(), layout.q_size, ranks);
        TRIDENT_CUDA_CHECK(cudaGetLastError());
      }
    }
    // The bucket: P Q^T for compressed tensors, the reduced values for the others, 0 in padding.
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(s.out.data(), 0, n * sizeof(float), stream));
    if (matrices > 0) {
      pd::pqt_kernel<><<<grid(s.max_rows * s.max_cols, matrices), pd::block, 0, stream>>>(s.p.data(), s.q.data(), s.out.data(),
                                                                                          s.table.data());
      TRIDENT_CUDA_CHECK(cudaGetLastError());
    }
    if (wholes > 0) {
      pd::scatter_kernel<><<<grid(s.max_whole, wholes), pd::block, 0, stream>>>(s.u.data(), s.out.data(), s.whole_table.data(), ranks,
                                                                               avg);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
    }
    // The error is this rank's input less its share of the result: the average itself, or a
    // sum's 1/ranks.
    pd::finish_kernel<<<grid(n), pd::block, 0, stream>>>(s.out.data(), s.m.data(), b.data.data(), n, avg ? 1.0f : 1.0f / ranks,
                                                         o.error_feedback);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    s.q_valid = o.warm_start;
  }

 private:
  // The bucket's buffers, made at its first compressed reduction, or again when its layout
  // changed; the error starts at 0 on the stream, as the host's.
  template <class T>
  static powersgd_detail::bucket_state& state(const bucket_view<T, cuda_space>& b, const detail::powersgd_layout& layout,
                                              std::shared_ptr<void>& held, cudaStream_t stream) {
    namespace pd = powersgd_detail;
    auto* s = static_cast<pd::bucket_state*>(held.get());
    if (s != nullptr && s->size == b.data.size() && s->compressed == layout.compressed && s->wholes == layout.whole) return *s;
    // A new layout: the old state's kernels may still run on the stream; its buffers are freed by
    // cudaFree, which waits for the device.
    auto fresh = std::make_shared<pd::bucket_state>();
    s = fresh.get();
    s->size = b.data.size();
    s->compressed = layout.compressed;
    s->wholes = layout.whole;
    std::size_t part_size = 0;
    for (const detail::powersgd_matrix& x : layout.compressed) {
      const std::size_t chunks = (x.rows + pd::chunk_rows - 1) / pd::chunk_rows;
      s->table_host.push_back({x.offset, x.rows, x.cols, x.r, x.p_at, x.q_at, x.index, part_size});
      part_size += chunks * x.cols * x.r;
      s->max_rows = std::max(s->max_rows, x.rows);
      s->max_cols = std::max(s->max_cols, x.cols);
      s->max_chunks = std::max(s->max_chunks, chunks);
      s->max_factor = std::max(s->max_factor, x.r);
    }
    for (const pd::whole& t : layout.whole) s->max_whole = std::max(s->max_whole, t.n);
    TRIDENT_EXPECT(s->table_host.size() <= pd::max_grid_yz && layout.whole.size() <= pd::max_grid_yz, "compress::powersgd: bucket ",
                   b.index, " holds ", s->table_host.size(), " compressed and ", layout.whole.size(),
                   " uncompressed tensors; the device engine takes at most ", pd::max_grid_yz, " of each per bucket");
    auto make = [&](auto& buf, std::size_t count) {
      using B = std::remove_reference_t<decltype(buf)>;
      buf = B(count == 0 ? 1 : count, mem_category::communication);
    };
    make(s->m, s->size);
    make(s->out, s->size);
    make(s->u, layout.u_size);
    make(s->p, layout.p_size);
    make(s->q, layout.q_size);
    make(s->part, part_size);
    make(s->scratch, 3 * std::max(layout.p_size, layout.q_size));
    make(s->table, s->table_host.size());
    make(s->whole_table, s->wholes.size());
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(s->m.data(), 0, s->m.size() * sizeof(float), stream));
    if (!s->table_host.empty())
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s->table.data(), s->table_host.data(), s->table_host.size() * sizeof(pd::matrix),
                                         cudaMemcpyHostToDevice, stream));
    if (!s->wholes.empty())
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s->whole_table.data(), s->wholes.data(), s->wholes.size() * sizeof(pd::whole),
                                         cudaMemcpyHostToDevice, stream));
    held = std::move(fresh);
    return *s;
  }
};

}  // namespace trident::compress
