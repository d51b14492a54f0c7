// ZeRO-2 with bf16 mixed precision: an MLP trained data-parallel, each rank holding only its
// shard of the gradients, the fp32 master weights and the AdamW states. Prints the loss,
// samples per second and each rank's memory by category.
//
//   ./zero_mlp [steps] [stage 0-3]                        4 thread ranks (no launcher, no GPU)
//   mpirun -np 4 ./zero_mlp --backend mpi [steps] [stage] one MPI process per rank
//   mpirun -np 2 ./zero_mlp --backend nccl [steps] [stage] NCCL on the GPU (built when NCCL and MPI
//                                                           are found; add --share-gpu to put every
//                                                           rank on GPU 0, for testing)
// With NCCL the optimizer state lives on the GPU; the tiny MLP's forward and backward still run
// on the host (mlp::host_staged copies parameters and gradients), so samples/s is not a GPU figure.
#ifndef TRIDENT_EXAMPLE_NCCL
#define TRIDENT_EXAMPLE_NCCL 0
#endif
#include <trident/comm/local.hpp>
#include <trident/parallel/data/zero_optimizer.hpp>
#if TRIDENT_HAS_MPI
#include <trident/comm/mpi.hpp>
#endif
#if TRIDENT_EXAMPLE_NCCL
#include <trident/comm/nccl.hpp>
#include <trident/parallel/data/cuda/zero_engine.cuh>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "mlp.hpp"

namespace {

namespace zero = trident::zero;

struct settings {
  std::string backend = "local";
  int ranks = 4;
  int steps = 300;
  int stage = 2;
  bool share_gpu = false;
};

template <int Stage, class Comm>
void train(Comm& comm, const settings& s) {
  const mlp::dims d{64, 256, 16};
  auto ledger = std::make_shared<trident::memory_ledger>("rank " + std::to_string(comm.rank()));
  trident::scoped_ledger use{ledger};
  trident::optim::adamw adamw;
  adamw.opt.lr = 2e-3f;
  zero::zero_options options;
  options.max_grad_norm = 1.0f;
  zero::zero_optimizer<Stage, trident::optim::adamw, Comm, trident::mixed_precision<trident::bf16>> z(comm, mlp::spec(d), adamw, options);
  mlp::initialise(z, d);

  const std::size_t global_batch = 64;
  const std::size_t rows = global_batch / static_cast<std::size_t>(comm.size());
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < s.steps; ++step) {
    const std::size_t first = static_cast<std::size_t>(step % 50) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
    double local_loss = 0;
    if constexpr (std::is_same_v<typename Comm::space, trident::host_space>) {
      local_loss = mlp::train_step(z, d, first, rows, rows, z.loss_scale());
    } else {
      mlp::host_staged<decltype(z)> staged{z, {}, {}};
      local_loss = mlp::train_step(staged, d, first, rows, rows, z.loss_scale());
    }
    trident::buffer<double, typename Comm::space> loss(1, trident::mem_category::other);
    trident::copy(std::span<const double>(&local_loss, 1), loss);
    const auto result = z.step();
    comm.all_reduce(loss, trident::reduce_op::avg);
    comm.synchronize();
    if (comm.rank() == 0 && (step % 50 == 0 || step + 1 == s.steps))
      std::printf("step %4d  loss %.5f  grad norm %.4f%s\n", step, trident::to_vector(loss)[0], result.grad_norm,
                  result.applied ? "" : "  (skipped)");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (comm.rank() == 0)
    std::printf("ZeRO-%d, bf16, %d ranks: %.0f samples/s (%d steps of %zu samples in %.2f s); %zu parameters (+%zu padding)\n", Stage,
                comm.size(), static_cast<double>(s.steps) * global_batch / seconds, s.steps, global_batch, seconds,
                z.layout().parameters(), z.layout().padding());
  // Each rank's memory, in rank order.
  for (int r = 0; r < comm.size(); ++r) {
    comm.barrier();
    if (r == comm.rank()) {
      using trident::mem_category;
      using trident::space_kind;
      constexpr space_kind where = std::is_same_v<typename Comm::space, trident::host_space> ? space_kind::host : space_kind::cuda;
      const double held = static_cast<double>(ledger->bytes(where, mem_category::parameters) +
                                              ledger->bytes(where, mem_category::gradients) +
                                              ledger->bytes(where, mem_category::optimizer_state));
      const double psi = static_cast<double>(z.layout().full_size()), n = comm.size();
      const double paper[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
      std::printf("%s  parameters + gradients + optimizer states: %.0f bytes = %.3f bytes/parameter (ZeRO paper: %.3f)\n",
                  ledger->report().c_str(), held, held / psi, paper[Stage] / psi);
      std::fflush(stdout);
    }
  }
  comm.barrier();
}

template <class Comm>
void dispatch(Comm& comm, const settings& s) {
  switch (s.stage) {
    case 0: train<0>(comm, s); break;
    case 1: train<1>(comm, s); break;
    case 2: train<2>(comm, s); break;
    case 3: train<3>(comm, s); break;
    default: throw trident::usage_error("zero_mlp: the stage must be 0, 1, 2 or 3, got " + std::to_string(s.stage));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    settings s;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--backend" && i + 1 < argc) s.backend = argv[++i];
      else if (a == "--ranks" && i + 1 < argc) s.ranks = std::atoi(argv[++i]);
      else if (a == "--share-gpu") s.share_gpu = true;
      else positional.push_back(a);
    }
    if (positional.size() > 0) s.steps = std::atoi(positional[0].c_str());
    if (positional.size() > 1) s.stage = std::atoi(positional[1].c_str());
    TRIDENT_EXPECT(s.steps >= 1, "zero_mlp: expected at least one step, got ", s.steps);
    TRIDENT_EXPECT(64 % s.ranks == 0, "zero_mlp: the global batch of 64 must divide by the number of ranks (", s.ranks, ")");
    if (s.backend == "local") {
      trident::local_world::run(s.ranks, [&](trident::local_comm& comm) { dispatch(comm, s); });
      return 0;
    }
#if TRIDENT_HAS_MPI
    if (s.backend == "mpi") {
      trident::mpi_environment env(argc, argv);
      auto comm = trident::mpi_comm::world();
      TRIDENT_EXPECT(64 % comm.size() == 0, "zero_mlp: the global batch of 64 must divide by the number of ranks (", comm.size(), ")");
      dispatch(comm, s);
      return 0;
    }
#endif
#if TRIDENT_EXAMPLE_NCCL
    if (s.backend == "nccl") {
      trident::mpi_environment env(argc, argv);
      const auto launch = trident::launch_env::detect();
      if (s.share_gpu) TRIDENT_CUDA_CHECK(cudaSetDevice(0));
      else trident::select_device(launch);
      trident::nccl_options options;
      options.host_id_per_rank = s.share_gpu;
      auto comm = trident::nccl_comm::from_mpi(MPI_COMM_WORLD, options);
      TRIDENT_EXPECT(64 % comm.size() == 0, "zero_mlp: the global batch of 64 must divide by the number of ranks (", comm.size(), ")");
      dispatch(comm, s);
      return 0;
    }
#endif
    throw trident::usage_error("zero_mlp: --backend " + s.backend + " is not available in this build (local" +
                               std::string(trident::has_mpi ? ", mpi" : "") +
                               std::string(TRIDENT_EXAMPLE_NCCL ? ", nccl" : "") + ")");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_mlp: %s\n", e.what());
    return 1;
  }
}
