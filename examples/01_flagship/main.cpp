// trident's flagship example, foundation edition: four ranks as threads of one process, each
// holding a mixed-precision model's state the way a ZeRO-0 data-parallel rank does (fp32 master
// weights, bf16 working weights and gradients, two fp32 Adam moments), with every byte charged
// to the rank's own ledger. It grows with the library: the communicators come next.
//
//   ./flagship [ranks] [parameters]
#include <trident/trident.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
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

}  // namespace

int main(int argc, char** argv) {
  try {
    const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
    const std::size_t parameters = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1'000'000;
    TRIDENT_EXPECT(ranks >= 1, "flagship: expected at least one rank, got ", ranks);

    std::printf("trident %s: %d thread ranks, %zu parameters per replica (cuda=%d nccl=%d mpi=%d)\n",
                trident::version_string, ranks, parameters, int{trident::has_cuda}, int{trident::has_nccl},
                int{trident::has_mpi});

    std::vector<std::shared_ptr<trident::memory_ledger>> ledgers;
    std::vector<double> max_rounding_error(static_cast<std::size_t>(ranks));
    std::vector<std::string> reports(static_cast<std::size_t>(ranks));  // taken while the state is alive
    for (int r = 0; r < ranks; ++r) ledgers.push_back(std::make_shared<trident::memory_ledger>("rank " + std::to_string(r)));

    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        trident::scoped_ledger use{ledgers[static_cast<std::size_t>(r)]};
        rank_state state(parameters);
        double worst = 0.0;
        for (std::size_t i = 0; i < parameters; ++i) {
          state.master[i] = std::sin(static_cast<float>(i) * 1e-3f);
          state.working[i] = trident::bf16{state.master[i]};  // the cast mixed precision does each step
          worst = std::max(worst, std::fabs(static_cast<double>(state.working[i]) - state.master[i]));
        }
        trident::fill_zero(state.gradients);
        trident::fill_zero(state.exp_avg);
        trident::fill_zero(state.exp_avg_sq);
        max_rounding_error[static_cast<std::size_t>(r)] = worst;
        reports[static_cast<std::size_t>(r)] = ledgers[static_cast<std::size_t>(r)]->report();
      });
    }
    for (auto& t : threads) t.join();

    // Mixed-precision Adam, no sharding: 4 + 2 + 2 + 4 + 4 = 16 bytes per parameter per rank,
    // the ZeRO paper's stage-0 figure.
    for (int r = 0; r < ranks; ++r) {
      const auto& ledger = *ledgers[static_cast<std::size_t>(r)];
      std::printf("%s", reports[static_cast<std::size_t>(r)].c_str());
      const double per_parameter = static_cast<double>(ledger.peak(trident::space_kind::host)) / static_cast<double>(parameters);
      std::printf("  peak %.1f bytes/parameter (ZeRO stage 0, mixed-precision Adam: 16), bf16 rounding error <= %.3g\n",
                  per_parameter, max_rounding_error[static_cast<std::size_t>(r)]);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flagship: %s\n", e.what());
    return 1;
  }
}
