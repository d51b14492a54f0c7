// Gradient compression on NCCL ranks sharing GPU 0 (issue 16):
//   - compress::cast<fp16/bf16> on device buffers (compress/cuda/cast.cuh) against the host's
//     arithmetic computed here from every rank's inputs, and through zero_optimizer against the
//     same training on thread ranks. With two ranks NCCL's sum in Half is one rounded addition,
//     as the host's, so both are bit for bit; with more, NCCL adds in its own order (a tolerance
//     of a few Half roundings).
//   - compress::onebit (compress/cuda/onebit.cuh) against the host reducer run on as many thread
//     ranks with the same inputs: its compressed rounds bit for bit on any number of ranks (their
//     collectives carry no arithmetic), the warm-up's plain all-reduce too on two ranks, with and without error feedback, in
//     gradient and 1-bit Adam momentum mode, fp32 and bf16 buckets; and through zero_optimizer.
//   - compress::powersgd (compress/cuda/powersgd.cuh) against the host reducer run on as many
//     thread ranks with the same inputs, every round within float rounding (its products sum in
//     double on both, in different orders): ranks 1 and 2 (Gram-Schmidt), 3 and 5 (Householder
//     QR), without warm starts, without error feedback, sum and avg, fp32 and bf16 buckets; a
//     warm round allocates nothing; and through zero_optimizer, stages 0 and 2.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "support/nccl_mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/compress/cuda/cast.cuh"
#include "trident/compress/cuda/onebit.cuh"
#include "trident/compress/cuda/powersgd.cuh"
#include "trident/parallel/data/cuda/zero_engine.cuh"
#include "zero/zero_training.hpp"

namespace compress = trident::compress;
namespace toy = zero_training::toy;

namespace {

std::optional<trident::nccl_comm> world;

// Rank r's gradient i: magnitudes from 1e-6 to 1e3, both signs, some already exact in Half.
float input(int rank, std::size_t i) {
  const std::uint32_t h = static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(rank * 40503u + 17u);
  const float mantissa = static_cast<float>(h % 100003u) / 100003.0f + 0.5f;
  const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>(h % 10u)) - 6.0f);
  return (h & 0x100u ? -1.0f : 1.0f) * mantissa * scale;
}

template <class Half>
void check_cast(trident::nccl_comm& comm, trident::reduce_op op) {
  const std::size_t n = 4099;  // not a multiple of the block
  const int ranks = comm.size();
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = input(comm.rank(), i);
  trident::buffer<float, trident::cuda_space> grads(n);
  const trident::space_span<float, trident::cuda_space> on_device(grads.data(), n);
  const trident::space_span<const float, trident::host_space> from_host(mine.data(), n);
  trident::copy(from_host, on_device);
  compress::cast<Half> reducer;
  const std::vector<compress::tensor_part> parts = {{"g", 0, n, 1}};
  for (int round = 0; round < 2; ++round) {  // the second reuses the bucket's Half buffer
    if (round == 1) trident::copy(from_host, on_device);
    const auto ledger = trident::current_ledger();
    const auto allocations = ledger->allocations(trident::space_kind::cuda);
    reducer.all_reduce(comm, compress::bucket_view<float, trident::cuda_space>{0, on_device, parts, op, 1});
    if (round == 1) CHECK(ledger->allocations(trident::space_kind::cuda) == allocations);
  }
  comm.synchronize();
  const auto got = trident::to_vector(grads);
  // The host's arithmetic (compress/cast.hpp), the ranks added in rank order. Beyond two ranks
  // NCCL adds in its own order: each of its ranks - 1 roundings is within half an ulp (of Half)
  // of the largest partial sum, so the bound is in units of the largest operand's ulp.
  const double eps = std::is_same_v<Half, trident::bf16> ? 1.0 / 128 : 1.0 / 1024;
  std::size_t differ = 0, beyond = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Half sum{};
    double largest = 0;
    for (int r = 0; r < ranks; ++r) {
      Half h = static_cast<Half>(input(r, i));
      if (op == trident::reduce_op::avg) h = static_cast<Half>(static_cast<float>(h) / static_cast<float>(ranks));
      sum = r == 0 ? h : static_cast<Half>(static_cast<float>(sum) + static_cast<float>(h));
      largest = std::max(largest, std::fabs(static_cast<double>(static_cast<float>(h))));
    }
    const float want = static_cast<float>(sum);
    if (got[i] != want) ++differ;
    if (std::fabs(static_cast<double>(got[i]) - want) > 2.0 * (ranks - 1) * ranks * largest * eps) ++beyond;
  }
  INFO(ranks, " ranks, op ", static_cast<int>(op), ": ", differ, " of ", n, " elements differ from the host's rank-order sum, ",
       beyond, " beyond the rounding bound");
  if (ranks <= 2) CHECK(differ == 0);
  else CHECK(beyond == 0);
}

// The toy model trained 6 steps, ZeRO stage Stage, gradients reduced through cast<Half>.
template <int Stage, class Half, class Comm>
std::vector<float> train_cast(Comm& comm) {
  trident::model_spec spec;
  spec.add("a", {40}, 0).add("b", {6, 5}, 0).add("c", {70}, 1);
  trident::zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = 64 * sizeof(float);
  o.persistence_threshold = 0;
  trident::optim::sgd sgd;
  sgd.opt.lr = 0.1f;
  sgd.opt.momentum = 0.9f;
  trident::zero::zero_optimizer<Stage, trident::optim::sgd, Comm> z(comm, spec, sgd, o);
  z.reduce_gradients_with(std::make_shared<compress::cast<Half>>());
  toy::initialise(z, spec);
  for (int s = 0; s < 6; ++s) {
    toy::step_samples(comm, z, spec, s);
    CHECK(z.step().applied);
  }
  return toy::parameters(z, spec);
}

template <int Stage, class Half>
void check_training(trident::nccl_comm& comm) {
  const auto host = trident::local_world::run(comm.size(), [](trident::local_comm& c) { return train_cast<Stage, Half>(c); });
  const auto got = train_cast<Stage, Half>(comm);
  const auto& want = host[static_cast<std::size_t>(comm.rank())];
  REQUIRE(got.size() == want.size());
  double worst = 0;  // relative to the parameters' scale (they start in [-0.5, 0.5])
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(static_cast<double>(want[i])) + 0.1);
    if (!(d <= worst)) worst = d;
  }
  INFO("stage ", Stage, ", ", comm.size(), " NCCL ranks against thread ranks: largest relative difference ", worst);
  if (comm.size() <= 2) CHECK(got == want);
  else CHECK(worst <= 1e-2);
}

// A bucket of three tensors with gaps of padding between them and at the end.
inline std::vector<compress::tensor_part> onebit_parts() {
  return {{"a", 0, 1000, 1}, {"b", 1000, 37, 11}, {"c", 1500, 900, 1}};
}
constexpr std::size_t onebit_bucket = 2500;

template <class T>
std::vector<T> onebit_input(int rank, int round) {
  std::vector<T> v(onebit_bucket, T(0.0f));
  for (const auto& t : onebit_parts())
    for (std::size_t e = 0; e < t.numel(); ++e) v[t.offset + e] = T(input(rank * 7 + round, t.offset + e));
  return v;
}

// `rounds` rounds of one bucket through `reducer` (round k's input: input(k), the bucket's
// size), this rank's bucket after each, as floats; with `allocations`, the device allocations
// each round made (the ledger's count).
template <class T, class Comm, class Reducer, class Input>
std::vector<std::vector<float>> reduce_rounds(Comm& comm, Reducer& reducer, const std::vector<compress::tensor_part>& parts,
                                              trident::reduce_op op, int rounds, Input input,
                                              std::vector<std::size_t>* allocations = nullptr) {
  using space = typename Comm::space;
  std::vector<std::vector<float>> out;
  trident::buffer<T, space> data;
  for (int round = 0; round < rounds; ++round) {
    const std::vector<T> in = input(round);
    if (data.size() != in.size()) data = trident::buffer<T, space>(in.size());  // once: the bucket keeps its size
    const trident::space_span<T, space> span(data.data(), data.size());
    trident::copy(trident::space_span<const T, trident::host_space>(in.data(), in.size()), span);
    const auto ledger = trident::current_ledger();
    const auto before = ledger->allocations(trident::space_kind::cuda);
    reducer.all_reduce(comm, compress::bucket_view<T, space>{0, span, parts, op, round + 1});
    if (allocations != nullptr) allocations->push_back(ledger->allocations(trident::space_kind::cuda) - before);
    comm.synchronize();
    std::vector<T> back(in.size());
    trident::copy(trident::space_span<const T, space>(span), trident::space_span<T, trident::host_space>(back.data(), back.size()));
    out.emplace_back(back.begin(), back.end());
  }
  return out;
}

// Five rounds of one bucket through onebit (warm-up 2), this rank's bucket after each, as floats.
template <class T, class Comm>
std::vector<std::vector<float>> onebit_rounds(Comm& comm, compress::onebit_options o, trident::reduce_op op) {
  compress::onebit reducer(o);
  return reduce_rounds<T>(comm, reducer, onebit_parts(), op, 5, [&](int round) { return onebit_input<T>(comm.rank(), round); });
}

template <class T>
void check_onebit(trident::nccl_comm& comm, compress::onebit_options o, trident::reduce_op op) {
  o.warmup = 2;
  const auto host = trident::local_world::run(comm.size(), [&](trident::local_comm& c) { return onebit_rounds<T>(c, o, op); });
  const auto got = onebit_rounds<T>(comm, o, op);
  const auto& want = host[static_cast<std::size_t>(comm.rank())];
  // The compressed rounds' collectives carry no arithmetic, so they are the host's bits on any
  // number of ranks. The warm-up's plain all-reduce is NCCL's sum, in its own order beyond two
  // ranks (within float rounding of the host's), and the momentum carries that into every round.
  const bool exact_warmup = comm.size() <= 2;
  for (std::size_t round = 0; round < got.size(); ++round) {
    const bool warming = round < 2;
    if (!exact_warmup && o.momentum > 0.0f && !warming) continue;
    std::size_t differ = 0;
    double worst = 0;
    for (std::size_t i = 0; i < got[round].size(); ++i) {
      if (!(got[round][i] == want[round][i])) ++differ;
      const double d = std::fabs(static_cast<double>(got[round][i]) - want[round][i]) / (std::fabs(want[round][i]) + 1e-3);
      if (!(d <= worst)) worst = d;
    }
    INFO("round ", round, " (warm-up 2), error feedback ", o.error_feedback, ", momentum ", o.momentum, ", op ",
         static_cast<int>(op), ", ", sizeof(T), "-byte elements, rank ", comm.rank(), "/", comm.size(), ": ", differ, " of ",
         got[round].size(), " differ from the host's, largest relative difference ", worst);
    if (warming && !exact_warmup) CHECK(worst <= (sizeof(T) == 2 ? 1e-2 : 1e-5));
    else CHECK(differ == 0);
  }
  // Compressed: the padding between and after the tensors comes back 0.
  for (std::size_t i = 1407; i < 1500; ++i) CHECK(got.back()[i] == 0.0f);
  for (std::size_t i = 2400; i < onebit_bucket; ++i) CHECK(got.back()[i] == 0.0f);
}

// The toy model (two buckets), ZeRO stage Stage, 1-bit gradients after 2 plain steps.
template <int Stage, class Comm>
std::vector<float> train_onebit(Comm& comm) {
  trident::model_spec spec;
  spec.add("a", {40}, 0).add("b", {6, 5}, 0).add("c", {70}, 1);
  trident::zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = 64 * sizeof(float);
  o.persistence_threshold = 0;
  trident::optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  trident::zero::zero_optimizer<Stage, trident::optim::sgd, Comm> z(comm, spec, sgd, o);
  z.reduce_gradients_with(std::make_shared<compress::onebit>(compress::onebit_options{.warmup = 2}));
  toy::initialise(z, spec);
  for (int s = 0; s < 6; ++s) {
    toy::step_samples(comm, z, spec, s);
    CHECK(z.step().applied);
  }
  return toy::parameters(z, spec);
}

// A PowerSGD bucket: matrices compressed at ranks up to 5 (one of 300 rows, so that M^T P takes
// three chunks and the QR's loops stride past a block; one of 300 columns, so that a warp's
// lanes and Q's orthogonalisation stride past theirs; one all zero, every rank, for the
// zero-norm paths), a vector and a 3 x 3 matrix always sent whole (at rank 5 "w2", "wide" and
// "zero" too), padding between tensors and at the end.
inline std::vector<compress::tensor_part> powersgd_parts() {
  return {{"w1", 0, 40, 30},     {"b1", 1200, 30, 1},    {"w2", 1250, 37, 11},   {"w3", 1700, 64, 12},
          {"tiny", 2500, 3, 3},  {"emb", 2600, 300, 20}, {"wide", 8700, 8, 300}, {"zero", 11100, 20, 20}};
}
constexpr std::size_t powersgd_bucket = 11600;

// Rank r's gradients in round k: smooth in [-1, 1], different on every rank and round.
float smooth_input(int rank, int round, std::size_t i) {
  const std::uint32_t h = static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>((rank * 31 + round) * 40503u + 7u);
  return static_cast<float>(h % 200003u) / 100001.5f - 1.0f;
}

// Six rounds of one bucket through powersgd, this rank's bucket after each; the device's
// allocations made by each round (ledger count) in `allocations`.
template <class T, class Comm>
std::vector<std::vector<float>> powersgd_rounds(Comm& comm, compress::powersgd_options o, trident::reduce_op op,
                                                std::vector<std::size_t>* allocations = nullptr) {
  compress::powersgd reducer(o);
  const auto parts = powersgd_parts();
  auto input = [&](int round) {
    std::vector<T> in(powersgd_bucket, T(0.0f));
    for (const auto& t : parts)
      if (t.name != "zero")
        for (std::size_t e = 0; e < t.numel(); ++e) in[t.offset + e] = T(smooth_input(comm.rank(), round, t.offset + e));
    return in;
  };
  return reduce_rounds<T>(comm, reducer, parts, op, 6, input, allocations);
}

template <class T>
void check_powersgd(trident::nccl_comm& comm, compress::powersgd_options o, trident::reduce_op op) {
  o.start_iter = 2;
  const auto host = trident::local_world::run(comm.size(), [&](trident::local_comm& c) { return powersgd_rounds<T>(c, o, op); });
  std::vector<std::size_t> allocations;
  const auto got = powersgd_rounds<T>(comm, o, op, &allocations);
  const auto& want = host[static_cast<std::size_t>(comm.rank())];
  // fp32: the device's double sums differ from the host's in order only, so float rounding; bf16:
  // a value on either side of a bf16 rounding boundary is one bf16 ulp apart.
  const double tolerance = sizeof(T) == 2 ? 1.0 / 128 : 1e-5;
  for (std::size_t round = 0; round < got.size(); ++round) {
    double worst = 0;
    std::size_t beyond = 0;
    for (std::size_t i = 0; i < got[round].size(); ++i) {
      const double d = std::fabs(static_cast<double>(got[round][i]) - want[round][i]) / (1.0 + std::fabs(want[round][i]));
      if (!(d <= worst)) worst = d;
      if (!(d <= tolerance)) ++beyond;
    }
    INFO("round ", round, " (start_iter 2), PowerSGD rank ", o.rank, ", warm start ", o.warm_start, ", error feedback ", o.error_feedback,
         ", op ", static_cast<int>(op), ", ", sizeof(T), "-byte elements, rank ", comm.rank(), "/", comm.size(), ": largest difference ",
         worst, " x (1 + |x|) from the host's, ", beyond, " beyond ", tolerance);
    CHECK(beyond == 0);
  }
  // The compressed rounds changed the values (not a plain all-reduce), the padding stayed 0, and
  // after the first compressed round nothing was allocated.
  const auto plain = trident::local_world::run(comm.size(), [&](trident::local_comm& c) {
    return powersgd_rounds<T>(c, {.start_iter = 100}, op);
  })[static_cast<std::size_t>(comm.rank())];
  CHECK(std::fabs(got.back()[0] - plain.back()[0]) + std::fabs(got.back()[2700] - plain.back()[2700]) > 1e-4);
  for (std::size_t i = 1230; i < 1250; ++i) CHECK(got.back()[i] == 0.0f);
  for (std::size_t i = 11500; i < powersgd_bucket; ++i) CHECK(got.back()[i] == 0.0f);
  for (std::size_t i = 11100; i < 11500; ++i) CHECK(got.back()[i] == 0.0f);  // "zero" stays 0
  CHECK(allocations[2] > 0);
  for (std::size_t round = 3; round < allocations.size(); ++round) CHECK(allocations[round] == 0);
}

// The toy model (two buckets), ZeRO stage Stage, PowerSGD rank 2 after 2 plain steps.
template <int Stage, class Comm>
std::vector<float> train_powersgd(Comm& comm) {
  trident::model_spec spec;
  spec.add("a", {40}, 0).add("b", {6, 5}, 0).add("c", {70}, 1).add("d", {12, 10}, 1);
  trident::zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = 256 * sizeof(float);
  o.persistence_threshold = 0;
  trident::optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  trident::zero::zero_optimizer<Stage, trident::optim::sgd, Comm> z(comm, spec, sgd, o);
  z.reduce_gradients_with(std::make_shared<compress::powersgd>(compress::powersgd_options{.rank = 2, .start_iter = 2}));
  toy::initialise(z, spec);
  for (int s = 0; s < 6; ++s) {
    toy::step_samples(comm, z, spec, s);
    CHECK(z.step().applied);
  }
  return toy::parameters(z, spec);
}

template <int Stage>
void check_powersgd_training(trident::nccl_comm& comm) {
  const auto host = trident::local_world::run(comm.size(), [](trident::local_comm& c) { return train_powersgd<Stage>(c); });
  const auto got = train_powersgd<Stage>(comm);
  const auto& want = host[static_cast<std::size_t>(comm.rank())];
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(static_cast<double>(want[i])) + 0.1);
    if (!(d <= worst)) worst = d;
  }
  INFO("stage ", Stage, ", PowerSGD rank 2, ", comm.size(), " NCCL ranks against thread ranks: largest relative difference ", worst);
  CHECK(worst <= 1e-4);
}

}  // namespace

TEST_CASE("compress.nccl: powersgd on device buffers is the host's within float rounding") {
  auto& comm = *world;
  using trident::reduce_op;
  check_powersgd<float>(comm, {.rank = 1}, reduce_op::avg);
  check_powersgd<float>(comm, {.rank = 2}, reduce_op::avg);
  check_powersgd<float>(comm, {.rank = 3}, reduce_op::avg);
  check_powersgd<float>(comm, {.rank = 5, .clamp_rank = true}, reduce_op::sum);  // "tiny" is 3 x 3
  check_powersgd<float>(comm, {.rank = 2, .warm_start = false}, reduce_op::avg);
  check_powersgd<float>(comm, {.rank = 3, .error_feedback = false}, reduce_op::avg);
  check_powersgd<trident::bf16>(comm, {.rank = 2}, reduce_op::avg);
}

TEST_CASE("compress.nccl: ZeRO with PowerSGD on NCCL trains as on thread ranks (stages 0 and 2)") {
  auto& comm = *world;
  check_powersgd_training<0>(comm);
  check_powersgd_training<2>(comm);
}

TEST_CASE("compress.nccl: onebit on device buffers is the host's, bit for bit") {
  auto& comm = *world;
  using trident::reduce_op;
  check_onebit<float>(comm, {}, reduce_op::avg);
  check_onebit<float>(comm, {}, reduce_op::sum);
  check_onebit<float>(comm, {.error_feedback = false}, reduce_op::avg);
  check_onebit<float>(comm, {.momentum = 0.9f}, reduce_op::avg);
  check_onebit<trident::bf16>(comm, {}, reduce_op::avg);
}

// onebit through a step the optimizer skipped: rounds 1 and 2, round 3 with an inf on rank 0,
// step_skipped, round 3 again and round 4. This rank's bucket after the last two.
template <class Comm>
std::vector<std::vector<float>> onebit_skip_rounds(Comm& comm, compress::onebit_options o) {
  using space = typename Comm::space;
  compress::onebit reducer(o);
  trident::buffer<float, space> data(onebit_bucket);
  const trident::space_span<float, space> span(data.data(), data.size());
  std::vector<std::vector<float>> out;
  const std::int64_t steps[] = {1, 2, 3, 3, 4};
  for (int round = 0; round < 5; ++round) {
    std::vector<float> in = onebit_input<float>(comm.rank(), round);
    if (round == 2 && comm.rank() == 0) in[5] = std::numeric_limits<float>::infinity();
    trident::copy(trident::space_span<const float, trident::host_space>(in.data(), in.size()), span);
    reducer.all_reduce(comm, compress::bucket_view<float, space>{0, span, onebit_parts(), trident::reduce_op::avg, steps[round]});
    if (round == 2) reducer.step_skipped(comm);
    comm.synchronize();
    if (round < 3) continue;
    std::vector<float> back(in.size());
    trident::copy(trident::space_span<const float, space>(span), trident::space_span<float, trident::host_space>(back.data(), back.size()));
    out.push_back(std::move(back));
  }
  return out;
}

TEST_CASE("compress.nccl: onebit forgets a skipped step on a device as on the host") {
  auto& comm = *world;
  if (comm.size() > 2) return;  // the warm-up's plain all-reduce is the host's bits on two ranks only
  for (const compress::onebit_options o : {compress::onebit_options{.warmup = 1},
                                           compress::onebit_options{.warmup = 1, .error_feedback = false, .momentum = 0.9f}}) {
    const auto host = trident::local_world::run(comm.size(), [&](trident::local_comm& c) { return onebit_skip_rounds(c, o); });
    const auto got = onebit_skip_rounds(comm, o);
    INFO("momentum ", o.momentum, ", rank ", comm.rank(), "/", comm.size());
    CHECK(got == host[static_cast<std::size_t>(comm.rank())]);
    bool finite = true;
    for (const auto& r : got)
      for (float x : r) finite = finite && std::isfinite(x);
    CHECK(finite);
  }
}

// On two ranks bit for bit; beyond, the warm-up's plain all-reduces add in NCCL's order.
static void check_close(const std::vector<float>& got, const std::vector<float>& want, int ranks, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(static_cast<double>(want[i])) + 0.1);
    if (!(d <= worst)) worst = d;
  }
  INFO(what, ", ", ranks, " NCCL ranks against thread ranks: largest relative difference ", worst);
  if (ranks <= 2) CHECK(got == want);
  else CHECK(worst <= 1e-3);
}

TEST_CASE("compress.nccl: ZeRO with 1-bit gradients on NCCL trains as on thread ranks, bit for bit on 2 (stages 0 and 2)") {
  auto& comm = *world;
  const auto rank = static_cast<std::size_t>(comm.rank());
  const auto host0 = trident::local_world::run(comm.size(), [](trident::local_comm& c) { return train_onebit<0>(c); });
  check_close(train_onebit<0>(comm), host0[rank], comm.size(), "stage 0");
  const auto host2 = trident::local_world::run(comm.size(), [](trident::local_comm& c) { return train_onebit<2>(c); });
  check_close(train_onebit<2>(comm), host2[rank], comm.size(), "stage 2");
}

TEST_CASE("compress.nccl: cast<fp16> and cast<bf16> on device buffers are the host's arithmetic") {
  auto& comm = *world;
  check_cast<trident::bf16>(comm, trident::reduce_op::avg);
  check_cast<trident::bf16>(comm, trident::reduce_op::sum);
  check_cast<trident::fp16>(comm, trident::reduce_op::avg);
  check_cast<trident::fp16>(comm, trident::reduce_op::sum);
}

TEST_CASE("compress.nccl: ZeRO with the cast reducer on NCCL trains as on thread ranks (stages 0-3)") {
  auto& comm = *world;
  check_training<0, trident::bf16>(comm);
  check_training<1, trident::fp16>(comm);
  check_training<2, trident::bf16>(comm);
  check_training<3, trident::bf16>(comm);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
