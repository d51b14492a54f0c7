// The MPI training that tests/checkpoint/elastic.sh kills and restarts with fewer ranks:
//
//   elastic_tool <root> <steps> <log>
//
// Every rank writes its pid to <root>/pid.<rank> (for the killer). Resumes from the newest good
// checkpoint under <root> (any earlier world size: the load reshards), then trains ZeRO-2 AdamW
// on a global batch of 12 samples split over the ranks, saving after every step, and rank 0
// appends "<step> <loss> <world size>" to <log>. The loss of step s is taken before its update:
// the mean over the batch of sum_i (0.15 (1 + s mod 3) p_i^2 + n_i(s, sample) p_i), whose
// gradient the ranks reduce. The same global batch for any world size, so every world size
// follows the same curve (up to rounding).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/mpi.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

float noise(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 1) * 0xC2B2AE3D27D4EB4Full ^ (c + 3) * 0x165667B19E3779F9ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

}  // namespace

int main(int argc, char** argv) {
  trident::mpi_environment env(argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <root> <steps> <log>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const std::int64_t steps = std::atoll(argv[2]);
  auto comm = trident::mpi_comm::world();
  constexpr int batch = 12;
  TRIDENT_EXPECT(batch % comm.size() == 0, "elastic_tool: ", comm.size(), " ranks do not divide the batch of ", batch);
  std::filesystem::create_directories(root);
  std::ofstream(root / ("pid." + std::to_string(comm.rank()))) << ::getpid() << "\n";

  trident::model_spec spec;
  for (int l = 0; l < 4; ++l) spec.add("layer" + std::to_string(l), {4096}, l);
  trident::optim::adamw opt;
  opt.opt.lr = 1e-2f;
  trident::zero::zero_options options;
  options.bucket_bytes = 16384;
  trident::zero::zero_optimizer<2, trident::optim::adamw, trident::mpi_comm> z(comm, spec, opt, options);
  std::vector<float> init(4096);
  for (int l = 0; l < 4; ++l) {
    for (std::size_t i = 0; i < init.size(); ++i) init[i] = noise(0, static_cast<std::uint64_t>(l), i);
    z.set_parameter("layer" + std::to_string(l), init);
  }
  std::int64_t start = 0;
  if (auto r = trident::checkpoint::load_latest(comm, z, root)) start = r->step;
  if (comm.rank() == 0) std::printf("elastic_tool: %d ranks, starting at step %lld\n", comm.size(), static_cast<long long>(start));
  const int per_rank = batch / comm.size();
  for (std::int64_t s = start; s < steps; ++s) {
    double local_loss = 0;
    for (int l = 3; l >= 0; --l) {
      const auto h = z.handle("layer" + std::to_string(l));
      const float* p = z.parameters(h).data();
      auto g = z.gradients(h);
      const float a = 0.15f * static_cast<float>(1 + s % 3);
      for (std::size_t i = 0; i < g.size(); ++i) {
        float sum = 0;
        for (int k = comm.rank() * per_rank; k < (comm.rank() + 1) * per_rank; ++k) {
          const float n = noise(static_cast<std::uint64_t>(s) + 1, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(l) * 4096 + i);
          sum += 2 * a * p[i] + n;
          local_loss += a * p[i] * p[i] + n * p[i];
        }
        g.data()[i] = sum / static_cast<float>(per_rank);
      }
      z.grad_ready(l);
    }
    double loss = local_loss / batch;
    comm.all_reduce(std::span<double>(&loss, 1));
    z.step();
    // Logged before the save: a kill in between makes the restart log this step again, never skip it.
    if (comm.rank() == 0) std::ofstream(argv[3], std::ios::app) << s << " " << std::hexfloat << loss << " " << comm.size() << "\n";
    trident::checkpoint::save(comm, z, root, s + 1, {.metadata = {}, .keep = 2, .sync = true, .timeout = std::chrono::minutes(1)});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // room for the killer to land mid-run
  }
  return 0;
}
