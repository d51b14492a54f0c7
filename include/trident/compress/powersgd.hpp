#pragma once
// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): each gradient matrix M (rows x cols)
// is sent as two thin factors P (rows x r) and Q (cols x r), with error feedback and a warm
// start, the way PyTorch's DDP hook does it (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py, `powerSGD_hook` with PowerSGDState):
//
//   before start_iter calls for a bucket: the plain all-reduce;
//   then, per bucket:
//     M += error                               (error feedback: what compression lost last time)
//     tensors with r (rows + cols) * min_compression_rate >= rows * cols, 1-D ones among them,
//       are all-reduced whole and averaged ("uncompressed");
//     the others: Q from the last step (warm start; random normal the first time), orthogonalised;
//       P = M Q, all-reduced (summed); P orthogonalised; Q = M^T P, all-reduced and averaged;
//       M = P Q^T
//     error = (M + old error) - what the bucket now holds
//
// Three all-reduces per bucket (uncompressed tensors, every P, every Q). Orthogonalisation is
// PyTorch's choice: modified Gram-Schmidt for r <= 2 (a column whose norm is 0 becomes 0, where
// PyTorch would divide by zero and advises orthogonalization_epsilon), a Householder QR above
// (LAPACK's, behind torch.linalg.qr, may choose other signs for the columns; they cancel in
// P Q^T).
// The random start is a normal draw from a counter-based generator keyed by (seed, bucket,
// tensor, element): the same on every rank without communication. From that start on, the
// reduced buckets equal PyTorch's hook's within 2.3e-6 over four compressed steps on two ranks
// (tests/fixtures/torch_powersgd.txt, recorded from torch's powerSGD_hook with trident's start).
//
//   trident::compress::powersgd_options o;
//   o.rank = 4;
//   o.start_iter = 10;
//   auto r = std::make_shared<trident::compress::powersgd>(o);
//   zero.reduce_gradients_with(r);
//   r->numel_after() / double(r->numel_before());   // the compression (PyTorch's statistics)
//
// On device memory (nccl_comm) the same algorithm runs in kernels on the communicator's stream:
// include <trident/compress/cuda/powersgd.cuh> (nvcc), which specialises powersgd_engine<cuda_space>.
#include <cmath>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numbers>
#include <span>
#include <vector>

#include "trident/compress/reducer.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/model/init.hpp"

namespace trident::compress {

//! PyTorch's PowerSGDState fields, with its defaults.
struct powersgd_options {
  std::size_t rank = 1;               // matrix_approximation_rank: r
  std::int64_t start_iter = 1000;     // start_powerSGD_iter: plain all-reduces before this many calls
  double min_compression_rate = 2.0;  // compress a matrix only if r (rows + cols) * this < rows * cols
  bool error_feedback = true;         // use_error_feedback
  bool warm_start = true;             // warm_start: reuse last step's Q
  float orthogonalization_epsilon = 0.0f;
  std::uint64_t seed = 0;             // random_seed: the first Q
  //! A rank above a matrix's smaller side (a matrix, not a vector: both sides > 1): false, a
  //! usage error naming it; true, PyTorch's silent min(rows, cols, rank).
  bool clamp_rank = false;
};

namespace detail {

using trident::detail::splitmix64;  // model/init.hpp's, which draws the initial weights too
//! A standard normal value for `key` (Box-Muller on two 53-bit uniforms in (0, 1]).
TRIDENT_HOST_DEVICE inline float normal(std::uint64_t key) noexcept {
  const double u1 = (static_cast<double>(splitmix64(2 * key) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(splitmix64(2 * key + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

//! A compressed tensor of a bucket: where it sits, its rank r, and where its factors sit in the
//! arrays of every P (rows x r) and every Q (cols x r). `index` is its place among the tensors.
struct powersgd_matrix {
  std::size_t offset = 0, rows = 0, cols = 0, r = 0, p_at = 0, q_at = 0, index = 0;
  friend bool operator==(const powersgd_matrix&, const powersgd_matrix&) = default;
};
//! A tensor all-reduced whole: where it sits in the bucket and in the array sent.
struct powersgd_whole {
  std::size_t offset = 0, n = 0, u_at = 0;
  friend bool operator==(const powersgd_whole&, const powersgd_whole&) = default;
};
//! Which tensors of a bucket are compressed, where everything goes, and PyTorch's statistics.
struct powersgd_layout {
  std::vector<powersgd_matrix> compressed;
  std::vector<powersgd_whole> whole;
  std::size_t p_size = 0, q_size = 0, u_size = 0;
  std::uint64_t before = 0, after = 0;  // elements uncompressed, and sent
};

inline powersgd_layout powersgd_layout_of(std::span<const tensor_part> tensors, const powersgd_options& o) {
  powersgd_layout l;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const tensor_part& t = tensors[i];
    TRIDENT_EXPECT(o.clamp_rank || t.rows == 1 || t.cols == 1 || o.rank <= std::min(t.rows, t.cols), "compress::powersgd: rank ",
                   o.rank, " is above the smaller side of tensor '", t.name, "' (", t.rows, " x ", t.cols,
                   "); expected a rank <= ", std::min(t.rows, t.cols), ", or clamp_rank = true (PyTorch's min(rows, cols, rank))");
    const std::size_t r = std::min({t.rows, t.cols, o.rank});
    l.before += t.numel();
    if (static_cast<double>((t.rows + t.cols) * r) * o.min_compression_rate < static_cast<double>(t.numel())) {
      l.compressed.push_back({t.offset, t.rows, t.cols, r, l.p_size, l.q_size, i});
      l.p_size += t.rows * r;
      l.q_size += t.cols * r;
      l.after += (t.rows + t.cols) * r;
    } else {
      l.whole.push_back({t.offset, t.numel(), l.u_size});
      l.u_size += t.numel();
      l.after += t.numel();
    }
  }
  return l;
}

//! Where the random start of tensor `index` of bucket `bucket` begins in the generator's
//! sequence (element e is normal(key + e)); `draw` is 0 with warm starts, else the step.
TRIDENT_HOST_DEVICE constexpr std::uint64_t start_key(std::uint64_t seed, std::uint64_t bucket, std::uint64_t index,
                                                    std::uint64_t draw) noexcept {
  return splitmix64(splitmix64(splitmix64(seed ^ (bucket << 32)) ^ index) ^ draw) << 24;
}

//! Orthonormalises the columns of a rows x r row-major matrix in place, as PyTorch's
//! _orthogonalize does: modified Gram-Schmidt for r <= 2 (a column whose norm is 0 becomes 0),
//! and above that the Q of a QR factorisation (Householder, as LAPACK's geqrf/orgqr behind
//! torch.linalg.qr), which stays orthonormal when the matrix is rank-deficient, as gradients
//! with dead units are: P P^T is then a projection that keeps the whole range of P.
inline void orthogonalize(float* a, std::size_t rows, std::size_t r, float epsilon) {
  if (r <= 2) {
    for (std::size_t j = 0; j < r; ++j) {
      double norm = 0;
      for (std::size_t i = 0; i < rows; ++i) norm += static_cast<double>(a[i * r + j]) * a[i * r + j];
      const float d = static_cast<float>(std::sqrt(norm)) + epsilon;
      for (std::size_t i = 0; i < rows; ++i) a[i * r + j] = d == 0.0f ? 0.0f : a[i * r + j] / d;
      for (std::size_t k = j + 1; k < r; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * r + j]) * a[i * r + k];
        for (std::size_t i = 0; i < rows; ++i) a[i * r + k] -= static_cast<float>(dot) * a[i * r + j];
      }
    }
    return;
  }
  // Householder: R = H_{r-1} ... H_0 A, then Q = H_0 ... H_{r-1} [I; 0], in double.
  std::vector<double> m(a, a + rows * r), v(rows * r, 0.0);
  for (std::size_t k = 0; k < r && k < rows; ++k) {
    double norm = 0;
    for (std::size_t i = k; i < rows; ++i) norm += m[i * r + k] * m[i * r + k];
    norm = std::sqrt(norm);
    if (norm == 0) continue;  // nothing to reflect: H_k = I
    const double alpha = m[k * r + k] > 0 ? -norm : norm;
    double vnorm = 0;
    for (std::size_t i = k; i < rows; ++i) {
      v[i * r + k] = m[i * r + k] - (i == k ? alpha : 0.0);
      vnorm += v[i * r + k] * v[i * r + k];
    }
    vnorm = std::sqrt(vnorm);
    if (vnorm == 0) continue;
    for (std::size_t i = k; i < rows; ++i) v[i * r + k] /= vnorm;
    for (std::size_t j = k; j < r; ++j) {
      double dot = 0;
      for (std::size_t i = k; i < rows; ++i) dot += v[i * r + k] * m[i * r + j];
      for (std::size_t i = k; i < rows; ++i) m[i * r + j] -= 2 * dot * v[i * r + k];
    }
  }
  std::vector<double> q(rows * r, 0.0);
  for (std::size_t j = 0; j < r && j < rows; ++j) q[j * r + j] = 1.0;
  for (std::size_t k = std::min(r, rows); k-- > 0;) {
    for (std::size_t j = 0; j < r; ++j) {
      double dot = 0;
      for (std::size_t i = k; i < rows; ++i) dot += v[i * r + k] * q[i * r + j];
      for (std::size_t i = k; i < rows; ++i) q[i * r + j] -= 2 * dot * v[i * r + k];
    }
  }
  for (std::size_t e = 0; e < rows * r; ++e) a[e] = static_cast<float>(q[e]);
}

}  // namespace detail

//! Where powersgd's compressed steps run for a memory space the host cannot read: specialised in
//! compress/cuda/powersgd.cuh for cuda_space (the same algorithm in kernels).
template <memory_space Space>
struct powersgd_engine;

class powersgd {
 public:
  explicit powersgd(powersgd_options o = {}) : o_(o) {
    TRIDENT_EXPECT(o_.rank >= 1, "compress::powersgd: rank ", o_.rank, "; expected at least 1");
    TRIDENT_EXPECT(o_.start_iter >= 0, "compress::powersgd: start_iter ", o_.start_iter, "; expected >= 0");
    TRIDENT_EXPECT(o_.min_compression_rate >= 0, "compress::powersgd: min_compression_rate ", o_.min_compression_rate,
                   "; expected >= 0");
    TRIDENT_EXPECT(o_.orthogonalization_epsilon >= 0, "compress::powersgd: orthogonalization_epsilon ",
                   o_.orthogonalization_epsilon, "; expected >= 0");
  }
  const powersgd_options& options() const noexcept { return o_; }
  //! Elements that compressed calls would have sent uncompressed, and what they sent (PyTorch's
  //! total_numel_before_compression / total_numel_after_compression).
  std::uint64_t numel_before() const noexcept { return before_; }
  std::uint64_t numel_after() const noexcept { return after_; }

  //! The optimizer skipped this step (an inf/NaN gradient on some rank): every bucket starts
  //! afresh, its error feedback 0 and its Q the random start again, as after a change of layout.
  //! Kept, the non-finite values would be in every later step's M and Q.
  template <class Comm>
  void step_skipped(Comm&) {
    for (bucket& s : buckets_) {
      s.error.clear();
      s.q.clear();
      s.compressed.clear();
      s.whole.clear();
      s.device.reset();  // the device engine's buffers: made again, zeroed, at the next reduction
    }
  }

  template <class Comm, class T>
  void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b) {
    using space = typename Comm::space;
    if constexpr (!space::host_accessible)
      static_assert(requires { sizeof(powersgd_engine<space>); },
                    "trident::compress::powersgd on device memory: include <trident/compress/cuda/powersgd.cuh> (compiled by nvcc)");
    detail::check_bucket(b, "compress::powersgd");
    bucket& s = state(b.index);
    if ((b.step > 0 ? b.step - 1 : s.iter) < o_.start_iter) {  // steps before this one (or calls)
      ++s.iter;
      space_span<T, space> data = b.data;
      comm.all_reduce(data, b.op);
      return;
    }
    ++s.iter;
    const detail::powersgd_layout layout = detail::powersgd_layout_of(b.tensors, o_);
    before_ += layout.before;
    after_ += layout.after;
    if constexpr (!space::host_accessible) powersgd_engine<space>::all_reduce(comm, b, o_, layout, s.iter, s.device);
    else host_all_reduce(comm, b, layout, s);
  }

 private:
  struct bucket {
    std::int64_t iter = 0;
    std::vector<float> error, q;
    std::vector<detail::powersgd_matrix> compressed;  // the layout error and q are for
    std::vector<detail::powersgd_whole> whole;
    std::shared_ptr<void> device;  // on a device: the engine's buffers (error, Q, factors, tables)
  };

  template <class Comm, class T>
  void host_all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b, const detail::powersgd_layout& layout,
                       bucket& s) {
    const bool avg = b.op == reduce_op::avg;
    const float ranks = static_cast<float>(comm.size());
    std::vector<float> m = detail::floats_of(b);
    if (s.compressed != layout.compressed || s.whole != layout.whole) {
      // A new layout of tensors (or the first compressed call): the error and Q of another
      // layout would land on other elements; start afresh, as the device engine does.
      s.compressed = layout.compressed;
      s.whole = layout.whole;
      s.error.clear();
      s.q.clear();
    }
    if (o_.error_feedback) {
      if (s.error.size() != m.size()) s.error.assign(m.size(), 0.0f);
      for (std::size_t i = 0; i < m.size(); ++i) m[i] += s.error[i];
    }
    // Uncompressed tensors, all-reduced as they are.
    std::vector<float> u;
    u.reserve(layout.u_size);
    for (const detail::powersgd_whole& t : layout.whole)
      u.insert(u.end(), m.begin() + static_cast<std::ptrdiff_t>(t.offset), m.begin() + static_cast<std::ptrdiff_t>(t.offset + t.n));
    comm.all_reduce(u, reduce_op::sum);
    if (avg)
      for (float& x : u) x /= ranks;
    // Q: last step's (warm start) or a random start, orthogonalised either way.
    const bool fresh = !o_.warm_start || s.q.size() != layout.q_size;
    if (fresh) s.q.assign(layout.q_size, 0.0f);
    for (const detail::powersgd_matrix& x : layout.compressed) {
      float* q = s.q.data() + x.q_at;
      if (fresh) {
        // Without warm starts PyTorch draws a new start every step: the step goes into the key.
        const std::uint64_t key = detail::start_key(o_.seed, b.index, x.index, o_.warm_start ? 0 : static_cast<std::uint64_t>(s.iter));
        for (std::size_t e = 0; e < x.cols * x.r; ++e) q[e] = detail::normal(key + e);
      }
      detail::orthogonalize(q, x.cols, x.r, o_.orthogonalization_epsilon);
    }
    // P = M Q, summed over ranks, orthogonalised.
    std::vector<float> p(layout.p_size);
    for (const detail::powersgd_matrix& x : layout.compressed) {
      const float* a = m.data() + x.offset;
      const float* q = s.q.data() + x.q_at;
      float* out = p.data() + x.p_at;
      for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t j = 0; j < x.r; ++j) {
          double acc = 0;
          for (std::size_t k = 0; k < x.cols; ++k) acc += static_cast<double>(a[i * x.cols + k]) * q[k * x.r + j];
          out[i * x.r + j] = static_cast<float>(acc);
        }
    }
    comm.all_reduce(p, reduce_op::sum);
    for (const detail::powersgd_matrix& x : layout.compressed)
      detail::orthogonalize(p.data() + x.p_at, x.rows, x.r, o_.orthogonalization_epsilon);
    // Q = M^T P, averaged over ranks.
    for (const detail::powersgd_matrix& x : layout.compressed) {
      const float* a = m.data() + x.offset;
      const float* pp = p.data() + x.p_at;
      float* q = s.q.data() + x.q_at;
      for (std::size_t k = 0; k < x.cols; ++k)
        for (std::size_t j = 0; j < x.r; ++j) {
          double acc = 0;
          for (std::size_t i = 0; i < x.rows; ++i) acc += static_cast<double>(a[i * x.cols + k]) * pp[i * x.r + j];
          q[k * x.r + j] = static_cast<float>(acc);
        }
    }
    comm.all_reduce(s.q, reduce_op::sum);
    if (avg)
      for (float& x : s.q) x /= ranks;
    // The bucket: P Q^T for compressed tensors, the reduced values for the others, 0 in padding.
    std::vector<float> out(m.size(), 0.0f);
    for (const detail::powersgd_matrix& x : layout.compressed) {
      const float* pp = p.data() + x.p_at;
      const float* q = s.q.data() + x.q_at;
      float* o = out.data() + x.offset;
      for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t k = 0; k < x.cols; ++k) {
          double acc = 0;
          for (std::size_t j = 0; j < x.r; ++j) acc += static_cast<double>(pp[i * x.r + j]) * q[k * x.r + j];
          o[i * x.cols + k] = static_cast<float>(acc);
        }
    }
    for (const detail::powersgd_whole& t : layout.whole)
      std::copy(u.begin() + static_cast<std::ptrdiff_t>(t.u_at), u.begin() + static_cast<std::ptrdiff_t>(t.u_at + t.n),
                out.begin() + static_cast<std::ptrdiff_t>(t.offset));
    // The error is this rank's input less its share of the result: the average itself, or a
    // sum's 1/ranks.
    if (o_.error_feedback) {
      const float share = avg ? 1.0f : 1.0f / ranks;
      for (std::size_t i = 0; i < m.size(); ++i) s.error[i] = m[i] - out[i] * share;
    }
    if (!o_.warm_start) s.q.clear();
    detail::store(b, out);
  }

  bucket& state(std::size_t index) {
    if (index >= buckets_.size()) buckets_.resize(index + 1);
    return buckets_[index];
  }

  powersgd_options o_;
  std::vector<bucket> buckets_;
  std::uint64_t before_ = 0, after_ = 0;
};

}  // namespace trident::compress
