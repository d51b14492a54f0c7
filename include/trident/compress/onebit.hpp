#pragma once
// One bit per element on the wire, with error feedback on both sides: the compressed
// all-reduce of 1-bit Adam (Tang et al., ICML 2021; DeepSpeed's NcclBackend.compressed_allreduce
// in deepspeed/runtime/comm/nccl.py), applied to a gradient bucket after `warmup` plain
// all-reduces of it.
//
//   x = gradients (+ worker error)            padded with zeros to a multiple of 8 x ranks
//   worker: scale s = ||x|| / sqrt(len(x)), signs b = (x >= 0), worker error = x - s (2b - 1)
//   phase 1: all_to_all of the packed signs (rank j gets chunk j of every rank's), all_gather of
//            the scales; chunk owner: y = sum over ranks i of s_i (2 b_i - 1) / ranks (+ server error)
//   server: scale t = ||y|| / sqrt(len(y)), signs c = (y >= 0), server error = y - t (2c - 1)
//   phase 2: all_gather of the packed server signs and scales; every rank: x = t_j (2 c - 1)
//
// Per rank about 2 (ranks - 1) / ranks x elements / 8 bytes cross the wire (two rounds of one bit
// per element), against 2 (ranks - 1) / ranks x 4 x elements for an fp32 ring all-reduce: 32x
// fewer (16x against bf16 gradients). Without error feedback (error_feedback = false) what the
// signs lose is lost for good; the tests and the slow-link study show the difference.
//
// What is compressed: the gradients (momentum = 0: error-feedback sign compression as in 1-bit
// SGD, which pairs with SGD with momentum), or, as 1-bit Adam does, Adam's first moment
// (momentum = beta1, with compress::onebit_adam below: the variance frozen after the warm-up,
// each rank's momentum beta1 m + (1 - beta1) g compressed and averaged, and handed to the
// optimizer as the gradient that makes its first moment that average). Adam fed compressed
// gradients instead sees their noise in its second moment, and error feedback then hurts
// (bench/RESULTS.md, "Less communication").
//
// On device memory (nccl_comm) include <trident/compress/cuda/onebit.cuh> (nvcc): the same
// algorithm in kernels, bit for bit this one (the RMS scales sum in detail::rms's fixed order).
//
//   trident::compress::onebit_options o;
//   o.warmup = 50;
//   zero.reduce_gradients_with(std::make_shared<trident::compress::onebit>(o));
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <vector>

#include "trident/compress/reducer.hpp"
#include "trident/core/error.hpp"
#include "trident/optim/optimizers.hpp"

namespace trident::compress {

struct onebit_options {
  std::int64_t warmup = 100;  // plain all-reduces of a bucket before compression starts
  bool error_feedback = true;
  //! 0: compress the gradients. beta1 in (0, 1): 1-bit Adam, with compress::onebit_adam of the
  //! same beta1 and freeze_step = warmup: compress this rank's first moment instead.
  float momentum = 0.0f;
};

namespace detail {

//! Signs (x >= 0, NaN counted as +, as DeepSpeed's sign().add_(1).bool()) packed 8 to a byte,
//! first element in the highest bit (numpy's packbits order).
inline void pack_signs(const float* x, std::size_t n, std::uint8_t* out) noexcept {
  for (std::size_t byte = 0; byte < n / 8; ++byte) {
    std::uint8_t v = 0;
    for (std::size_t bit = 0; bit < 8; ++bit) v = static_cast<std::uint8_t>(v << 1 | (x[byte * 8 + bit] < 0.0f ? 0 : 1));
    out[byte] = v;
  }
}
inline float sign_at(const std::uint8_t* packed, std::size_t i) noexcept {
  return (packed[i / 8] >> (7 - i % 8) & 1) != 0 ? 1.0f : -1.0f;
}
//! The order rms() sums its squares in, which the device's two kernels (compress/cuda/onebit.cuh)
//! follow, so that host and device scales, and so every sign and error, are the same bits: lane
//! l of rms_lanes sums x[l], x[l + rms_lanes], ... in order (in double); the lanes of each block of
//! rms_block are added by a halving tree (lane t + half into lane t), then the blocks' sums by
//! another.
inline constexpr std::size_t rms_block = 256;
inline constexpr std::size_t rms_blocks = 64;
inline constexpr std::size_t rms_lanes = rms_block * rms_blocks;

//! A halving tree over n (a power of two) doubles, in place: v[0] ends as the sum.
inline void halving_tree(double* v, std::size_t n) noexcept {
  for (std::size_t half = n / 2; half > 0; half /= 2)
    for (std::size_t t = 0; t < half; ++t) v[t] += v[t + half];
}

//! sqrt(sum of x^2 / n) in the order above (0 for no elements), rounded to float once.
inline float rms_of_sum(double sum_squares, std::size_t n) noexcept {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sum_squares) / std::sqrt(static_cast<double>(n)));
}
inline float rms(const float* x, std::size_t n) {
  std::vector<double> lanes(rms_lanes, 0.0);
  for (std::size_t l = 0; l < rms_lanes && l < n; ++l) {
    double s = 0;
    for (std::size_t i = l; i < n; i += rms_lanes) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    lanes[l] = s;
  }
  std::vector<double> blocks(rms_blocks);
  for (std::size_t b = 0; b < rms_blocks; ++b) {
    halving_tree(lanes.data() + b * rms_block, rms_block);
    blocks[b] = lanes[b * rms_block];
  }
  halving_tree(blocks.data(), rms_blocks);
  return rms_of_sum(blocks[0], n);
}

}  // namespace detail

//! Where onebit's compressed path runs for a memory space the host cannot read: specialised in
//! compress/cuda/onebit.cuh for cuda_space (the same arithmetic, the same bits, in kernels).
template <memory_space Space>
struct onebit_engine;

class onebit {
 public:
  explicit onebit(onebit_options o = {}) : o_(o) {
    TRIDENT_EXPECT(o_.warmup >= 0, "compress::onebit: warmup ", o_.warmup, "; expected >= 0");
    TRIDENT_EXPECT(o_.momentum >= 0.0f && o_.momentum < 1.0f, "compress::onebit: momentum ", o_.momentum,
                   "; expected 0 (compress the gradients) or a beta1 in (0, 1) (1-bit Adam)");
  }
  const onebit_options& options() const noexcept { return o_; }

  //! The optimizer skipped this step (an inf/NaN gradient on some rank): the error feedback goes
  //! back to 0 and 1-bit Adam's momentum to what it was before the step (the optimizer's first
  //! moment did not move either), so that the step may come again. Kept, one inf would be in every
  //! later step's errors and momentum.
  template <class Comm>
  void step_skipped(Comm& comm) {
    using space = typename Comm::space;
    for (bucket& s : buckets_) {
      if constexpr (!space::host_accessible) {
        if constexpr (requires { sizeof(onebit_engine<space>); }) onebit_engine<space>::step_skipped(comm, o_, s.device);
      } else {
        std::fill(s.worker.begin(), s.worker.end(), 0.0f);
        std::fill(s.server.begin(), s.server.end(), 0.0f);
        if (o_.momentum > 0.0f) s.m = s.m_before;
      }
      s.last_step = 0;
    }
  }

  template <class Comm, class T>
  void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b) {
    using space = typename Comm::space;
    if constexpr (!space::host_accessible)
      static_assert(requires { sizeof(onebit_engine<space>); },
                    "trident::compress::onebit on device memory: include <trident/compress/cuda/onebit.cuh> (compiled by nvcc)");
    detail::check_bucket(b, "compress::onebit");
    bucket& s = state(b.index);
    const bool momentum = o_.momentum > 0.0f;
    TRIDENT_EXPECT(!momentum || b.op == reduce_op::avg, "compress::onebit: 1-bit Adam's momentum is an average; the optimizer "
                   "sums gradients (zero_options::average = false)");
    TRIDENT_EXPECT(!momentum || b.step == 0 || b.step != s.last_step, "compress::onebit: bucket ", b.index, " came twice for step ",
                   b.step, "; 1-bit Adam's momentum advances once per step (ZeRO stages 2-3 reduce every micro-batch: use stage "
                   "0 or 1 with gradient accumulation)");
    s.last_step = b.step;
    const bool warming = (b.step > 0 ? b.step - 1 : s.iter) < o_.warmup;  // steps before this one (or calls)
    ++s.iter;
    if constexpr (!space::host_accessible) onebit_engine<space>::all_reduce(comm, b, o_, warming, s.device);
    else host_all_reduce(comm, b, s, warming);
  }

 private:
  struct bucket {
    std::int64_t iter = 0, last_step = 0;
    std::vector<float> worker, server, m;
    std::vector<float> m_before;    // momentum mode: m as the last step found it (step_skipped)
    std::shared_ptr<void> device;  // on a device: the engine's buffers (errors, momentum, scratch)
  };

  template <class Comm, class T>
  void host_all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b, bucket& s, bool warming) {
    const bool momentum = o_.momentum > 0.0f;
    if (momentum) s.m_before = s.m;
    if (warming) {
      space_span<T, typename Comm::space> data = b.data;
      comm.all_reduce(data, b.op);
      if (momentum) {  // the optimizer's first moment, followed to hand over at the freeze
        const std::vector<float> g = detail::floats_of(b);
        if (s.m.size() != g.size()) s.m.assign(g.size(), 0.0f);
        for (std::size_t i = 0; i < g.size(); ++i) s.m[i] = o_.momentum * s.m[i] + (1.0f - o_.momentum) * g[i];
      }
      return;
    }
    const std::vector<float> all = detail::floats_of(b);
    std::vector<float> x = all;
    if (momentum) {
      // 1-bit Adam: this rank's momentum from the last averaged one, compressed and averaged.
      if (s.m.size() != x.size()) s.m.assign(x.size(), 0.0f);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = o_.momentum * s.m[i] + (1.0f - o_.momentum) * all[i];
    }
    std::vector<float> out = compressed_average(comm, s, x, b.tensors);
    if (b.op == reduce_op::sum)
      for (float& v : out) v *= static_cast<float>(comm.size());
    if (momentum) {
      // Handed to the optimizer as the "gradient" that turns its first moment into the average:
      // m = beta1 m_last + (1 - beta1) g.
      for (std::size_t i = 0; i < out.size(); ++i) {
        const float m = out[i];
        out[i] = (m - o_.momentum * s.m[i]) / (1.0f - o_.momentum);
        s.m[i] = m;
      }
    }
    detail::store(b, out);
  }

  bucket& state(std::size_t index) {
    if (index >= buckets_.size()) buckets_.resize(index + 1);
    return buckets_[index];
  }

  // DeepSpeed's compressed_allreduce of the bucket's tensor elements (the padding stays out and
  // comes back 0): the average over ranks, on every rank alike.
  template <class Comm>
  std::vector<float> compressed_average(Comm& comm, bucket& s, const std::vector<float>& all, std::span<const tensor_part> tensors) {
    std::vector<float> x;
    for (const tensor_part& t : tensors)
      x.insert(x.end(), all.begin() + static_cast<std::ptrdiff_t>(t.offset), all.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
    const std::size_t ranks = static_cast<std::size_t>(comm.size()), n = x.size();
    const std::size_t unit = 8 * ranks, padded = (n + unit - 1) / unit * unit, chunk = padded / ranks;
    x.resize(padded, 0.0f);
    if (o_.error_feedback) {
      if (s.worker.size() != padded) s.worker.assign(padded, 0.0f);
      for (std::size_t i = 0; i < padded; ++i) x[i] += s.worker[i];
    }
    // Worker compression.
    const float scale = detail::rms(x.data(), padded);
    std::vector<std::uint8_t> signs(padded / 8);
    detail::pack_signs(x.data(), padded, signs.data());
    if (o_.error_feedback)
      for (std::size_t i = 0; i < padded; ++i) s.worker[i] = x[i] - scale * detail::sign_at(signs.data(), i);
    // Phase 1: my chunk's signs from every rank, every rank's scale.
    std::vector<std::uint8_t> theirs(padded / 8);
    comm.all_to_all(signs, theirs);
    std::vector<float> scales(ranks);
    comm.all_gather(std::span<const float>(&scale, 1), scales);
    std::vector<float> y(chunk, 0.0f);
    const float inv = 1.0f / static_cast<float>(ranks);
    for (std::size_t j = 0; j < ranks; ++j) {
      const std::uint8_t* from = theirs.data() + j * chunk / 8;
      const float w = scales[j] * inv;
      for (std::size_t i = 0; i < chunk; ++i) y[i] += detail::sign_at(from, i) * w;
    }
    if (o_.error_feedback) {
      if (s.server.size() != chunk) s.server.assign(chunk, 0.0f);
      for (std::size_t i = 0; i < chunk; ++i) y[i] += s.server[i];
    }
    // Server compression of my chunk, then phase 2: every chunk's signs and scale.
    const float server_scale = detail::rms(y.data(), chunk);
    std::vector<std::uint8_t> server_signs(chunk / 8);
    detail::pack_signs(y.data(), chunk, server_signs.data());
    if (o_.error_feedback)
      for (std::size_t i = 0; i < chunk; ++i) s.server[i] = y[i] - server_scale * detail::sign_at(server_signs.data(), i);
    std::vector<std::uint8_t> all_signs(padded / 8);
    comm.all_gather(server_signs, all_signs);
    std::vector<float> server_scales(ranks);
    comm.all_gather(std::span<const float>(&server_scale, 1), server_scales);
    std::vector<float> out(all.size(), 0.0f);
    std::size_t i = 0;
    for (const tensor_part& t : tensors)
      for (std::size_t e = 0; e < t.numel(); ++e, ++i) out[t.offset + e] = detail::sign_at(all_signs.data(), i) * server_scales[i / chunk];
    return out;
  }

  onebit_options o_;
  std::vector<bucket> buckets_;
};

//! 1-bit Adam's optimizer (DeepSpeed's OnebitAdam): Adam whose second moment stops changing
//! after `freeze_step` steps, with decoupled weight decay. Unlike DeepSpeed's it keeps Adam's
//! bias corrections (the second moment's as of the freeze): DeepSpeed's warm-ups of thousands
//! of steps make them 1, but after a short one the uncorrected second moment is far too small
//! and the steps blow up (seen: NaN after a warm-up of 4 steps). A second moment still 0 at the
//! freeze keeps learning until it is not (else a unit's first gradient after the freeze would
//! move it by lr x m / eps: seen on the test MLP, whose dead units revive). Paired with compress::onebit{{.warmup = freeze_step, .momentum = beta1}}, which
//! from then on averages the first moment itself (compressed) and hands it over: the frozen
//! variance keeps the compression noise out of the step's scale. After the freeze the gradient
//! multiplier (clipping, loss-scale) is not applied: what arrives is the averaged momentum.
//! A plain host loop (no CUDA step).
//!
//!   compress::onebit_adam adam{{.lr = 1e-3f, .freeze_step = 100}};
//!   zero::zero_optimizer<0, compress::onebit_adam, Comm> z(comm, spec, adam);
//!   z.reduce_gradients_with(std::make_shared<compress::onebit>(compress::onebit_options{.warmup = 100, .momentum = 0.9f}));
struct onebit_adam {
  struct options {
    float lr = 1e-3f;
    float beta1 = 0.9f, beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
    std::int64_t freeze_step = 100;
  };
  options opt;
  static constexpr std::size_t state_count = 2;  // exp_avg, exp_avg_sq

  template <class Grad, class Working = float>
  void step(std::span<float> params, std::span<const Grad> grads, std::array<std::span<float>, state_count> state,
            std::int64_t step_number, float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    TRIDENT_EXPECT(opt.lr >= 0 && opt.eps >= 0 && opt.weight_decay >= 0 && opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 &&
                       opt.beta2 < 1 && opt.freeze_step >= 0,
                   "compress::onebit_adam: lr ", opt.lr, ", betas (", opt.beta1, ", ", opt.beta2, "), eps ", opt.eps, ", weight_decay ",
                   opt.weight_decay, ", freeze_step ", opt.freeze_step, "; expected lr, eps, weight_decay >= 0, betas in [0, 1)");
    // The sizes (and no overlap between the arrays written), as every optimizer checks them.
    optim::detail::check_step<Grad, Working, state_count>("compress::onebit_adam", params.data(), params.size(), grads.data(),
                                                          grads.size(), {state[0].data(), state[1].data()},
                                                          {state[0].size(), state[1].size()}, state_count, working_copy.data(),
                                                          working_copy.size(), step_number);
    const bool frozen = step_number > opt.freeze_step;
    const float multiplier = frozen ? 1.0f : grad_multiplier;
    const std::int64_t v_steps = std::min(step_number, opt.freeze_step);
    const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(opt.beta1), static_cast<double>(step_number)));
    const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(opt.beta2), static_cast<double>(std::max<std::int64_t>(v_steps, 1))));
    float* m = state[0].data();
    float* v = state[1].data();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const float g = static_cast<float>(grads[i]) * multiplier;
      m[i] = opt.beta1 * m[i] + (1.0f - opt.beta1) * g;
      // A second moment still 0 at the freeze (the gradient was 0 until then: a dead unit, an
      // unseen token) is not frozen until it has seen one: frozen at 0, the first nonzero
      // gradient would take a step of m / eps.
      if (!frozen || v[i] == 0.0f) v[i] = opt.beta2 * v[i] + (1.0f - opt.beta2) * g * g;
      const float update = (m[i] / c1) / (std::sqrt(v[i] / c2) + opt.eps) + opt.weight_decay * params[i];
      params[i] -= opt.lr * update;
      if (!working_copy.empty()) working_copy[i] = static_cast<Working>(params[i]);
    }
  }
  template <class Grads, class Working = float>
    requires std::ranges::contiguous_range<Grads>
  void step(std::span<float> params, const Grads& grads, std::array<std::span<float>, state_count> state, std::int64_t step_number,
            float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    step(params, std::span<const std::ranges::range_value_t<Grads>>(grads), state, step_number, grad_multiplier, working_copy);
  }
};

}  // namespace trident::compress
