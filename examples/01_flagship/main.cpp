// trident's flagship example, communicators edition: ranks as threads of one process (the
// embedded default: no GPU, no launcher) arranged in a process grid, each holding a
// mixed-precision model's state the way a ZeRO-0 data-parallel rank does (fp32 master weights,
// bf16 working weights and gradients, two fp32 Adam moments), every byte charged to the rank's
// own ledger. The ranks average their gradients with a ring all-reduce over the grid's
// data-parallel communicator and check the result. It grows with the library: ZeRO comes next.
//
//   ./flagship [ranks] [parameters] [tensor-parallel size]
#include <trident/comm/local.hpp>
#include <trident/comm/process_grid.hpp>
#include <trident/trident.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct rank_state {
  trident::buffer<float> master;            // fp32 master weights
  trident::buffer<trident::bf16> working;   // bf16 copy used by forward and backward
  trident::buffer<trident::bf16> gradients;
  trident::buffer<float> exp_avg;           // Adam's first moment
  trident::buffer<float> exp_avg_sq;        // Adam's second moment

  explicit rank_state(std::size_t n)
      : master(n, trident::mem_category::parameters),
        working(n, trident::mem_category::parameters),
        gradients(n, trident::mem_category::gradients),
        exp_avg(n, trident::mem_category::optimizer_state),
        exp_avg_sq(n, trident::mem_category::optimizer_state) {}
};

struct rank_report {
  std::string memory;
  double bytes_per_parameter = 0;
  double max_error = 0;
  int tensor = 0, data = 0, pipeline = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
    const std::size_t parameters = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1'000'000;
    const int tensor = argc > 3 ? std::atoi(argv[3]) : 1;
    TRIDENT_EXPECT(ranks >= 1, "flagship: expected at least one rank, got ", ranks);

    std::printf("trident %s: %d thread ranks, %zu parameters per replica (cuda=%d nccl=%d mpi=%d)\n",
                trident::version_string, ranks, parameters, int{trident::has_cuda}, int{trident::has_nccl},
                int{trident::has_mpi});

    const auto start = std::chrono::steady_clock::now();
    const auto reports = trident::local_world::run(ranks, [&](trident::local_comm& world) {
      auto ledger = std::make_shared<trident::memory_ledger>("rank " + std::to_string(world.rank()));
      trident::scoped_ledger use{ledger};
      trident::process_grid grid(world, tensor, /*pipeline=*/1);
      rank_state state(parameters);

      // Every data-parallel replica starts from the same weights; each computes its own
      // gradient (here: a rank-dependent stand-in for backward) in bf16.
      const int dp_rank = grid.coordinate(trident::grid_axis::data);
      for (std::size_t i = 0; i < parameters; ++i) {
        state.master[i] = std::sin(static_cast<float>(i) * 1e-3f);
        state.working[i] = trident::bf16{state.master[i]};
        state.gradients[i] = trident::bf16{static_cast<float>((i + static_cast<std::size_t>(dp_rank)) % 8)};
      }
      trident::fill_zero(state.exp_avg);
      trident::fill_zero(state.exp_avg_sq);

      // Data parallelism: average the gradients over the replicas.
      grid.data().all_reduce(state.gradients, trident::reduce_op::avg);

      rank_report r;
      const int dp = grid.data_size();
      for (std::size_t i = 0; i < parameters; i += 97) {
        double want = 0;
        for (int d = 0; d < dp; ++d) want += static_cast<double>((i + static_cast<std::size_t>(d)) % 8);
        r.max_error = std::max(r.max_error, std::fabs(static_cast<double>(static_cast<float>(state.gradients[i])) - want / dp));
      }
      r.memory = ledger->report();
      r.bytes_per_parameter = static_cast<double>(ledger->bytes(trident::space_kind::host, trident::mem_category::parameters) +
                                                  ledger->bytes(trident::space_kind::host, trident::mem_category::gradients) +
                                                  ledger->bytes(trident::space_kind::host, trident::mem_category::optimizer_state)) /
                              static_cast<double>(parameters);
      r.tensor = grid.coordinate(trident::grid_axis::tensor);
      r.data = dp_rank;
      r.pipeline = grid.coordinate(trident::grid_axis::pipeline);
      return r;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    double worst = 0;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      const auto& rep = reports[r];
      std::printf("%s", rep.memory.c_str());
      std::printf("  grid (tensor %d, data %d, pipeline %d); parameters + gradients + optimizer state: %.1f bytes/parameter "
                  "(ZeRO stage 0, mixed-precision Adam: 16)\n",
                  rep.tensor, rep.data, rep.pipeline, rep.bytes_per_parameter);
      worst = std::max(worst, rep.max_error);
    }
    std::printf("gradient all-reduce (avg, bf16) over the data-parallel group: max error %.3g (bf16 rounding: <= 0.0313), %.2f s\n",
                worst, seconds);
    if (worst > 0.0313) {
      std::fprintf(stderr, "flagship: the averaged gradients are wrong\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flagship: %s\n", e.what());
    return 1;
  }
}
