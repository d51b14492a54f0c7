// ZeRO stages 0-3 on NCCL: the MLP trained on every rank of mpirun (several ranks share GPU 0,
// told apart by NCCL_HOSTID), compared with single-rank training on the global batch computed
// in the same process on one thread rank. Forward and backward run on the host through a
// staging adapter (the model is tiny); what is under test is the optimizer's device path:
// bucket reductions on NCCL, the fused step, gradient statistics, stage-3 gathering.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "mlp.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/cuda/zero_engine.cuh"

namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

std::optional<trident::nccl_comm> world;
constexpr std::size_t global_batch = 24;

zero::zero_options small_buckets() {
  zero::zero_options o;
  o.bucket_bytes = 700 * sizeof(float);
  o.first_bucket_bytes = 150 * sizeof(float);
  o.persistence_threshold = 0;
  return o;
}

template <int Stage, class Opt, class Precision, class Comm>
std::vector<float> by_name(Comm& comm, Opt opt, int steps) {
  const mlp::dims d;
  const auto spec = mlp::spec(d);
  zero::zero_optimizer<Stage, Opt, Comm, Precision> z(comm, spec, opt, small_buckets());
  mlp::initialise(z, d);
  const std::size_t rows = global_batch / static_cast<std::size_t>(comm.size());
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
    if constexpr (std::is_same_v<typename Comm::space, trident::cuda_space>) {
      mlp::host_staged<decltype(z)> staged{z, {}, {}};
      mlp::train_step(staged, d, first, rows, rows, z.loss_scale());
    } else {
      mlp::train_step(z, d, first, rows, rows, z.loss_scale());
    }
    z.step();
  }
  const auto full = z.full_master();
  std::vector<float> out;
  for (const auto& t : spec.tensors()) {
    const auto& p = z.layout().find(t.name);
    out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset), full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }
  return out;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

template <class Precision, class Opt>
void check(Opt opt, const char* name, double tolerance) {
  const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) { return by_name<0, Opt, Precision>(c, opt, 20); })[0];
  auto& comm = *world;
  const std::vector<float> results[] = {by_name<0, Opt, Precision>(comm, opt, 20), by_name<1, Opt, Precision>(comm, opt, 20),
                                        by_name<2, Opt, Precision>(comm, opt, 20), by_name<3, Opt, Precision>(comm, opt, 20)};
  for (int stage = 0; stage < 4; ++stage) {
    INFO(name, " stage ", stage, " on ", comm.size(), " NCCL ranks");
    CHECK(relative_difference(results[stage], serial) <= tolerance);
  }
}

}  // namespace

TEST_CASE("zero over NCCL: stages 0-3 = one rank on the global batch (SGD momentum, AdamW, fp32)") {
  optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  check<zero::full_precision>(sgd, "sgd", 1e-5);
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  check<zero::full_precision>(adamw, "adamw", 1e-5);
}

TEST_CASE("zero over NCCL: bf16 mixed precision stays close to the host's bf16 run") {
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  // NCCL sums bf16 in its own order and precision, so this is a closeness check, not 1e-5.
  check<zero::mixed_precision<trident::bf16>>(adamw, "adamw bf16", 2e-2);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int devices = trident::cuda_device_count();
  int fewest = 0;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (rank == 0) std::printf("SKIPPED: no CUDA device is visible to every rank (no GPU or no driver)\n");
    MPI_Finalize();
    return 77;
  }
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  int failed = 0;
  try {
    TRIDENT_CUDA_CHECK(cudaSetDevice(0));  // every rank on GPU 0, on purpose
    world.emplace(trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.host_id_per_rank = true}));
    doctest::Context context(argc, argv);
    failed = context.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    failed = 1;
  }
  world.reset();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}
