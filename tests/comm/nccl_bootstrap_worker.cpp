// One process of a job started by test_nccl_bootstrap without mpirun: it reads who it is from
// the launcher variables the test set (torchrun's or Slurm's), gets the NCCL unique id through
// the shared file, and writes what it saw to <dir>/rank<R>.txt for the test to compare. With a
// GPU it also creates the NCCL communicator from that id (the ranks share GPU 0 through
// NCCL_HOSTID) and all-reduces, so the id is shown to work, not only to be equal.
//
//   nccl_bootstrap_worker DIR        (environment: RANK/WORLD_SIZE/... or SLURM_*;
//                                     TRIDENT_TEST_BOOTSTRAP_TIMEOUT_MS, default 60000)
// Exit status 0 on success; 1 with the error on stderr otherwise.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/comm/nccl.hpp"
#include "trident/core/buffer.hpp"

int main(int argc, char** argv) {
  try {
    TRIDENT_EXPECT(argc == 2, "usage: nccl_bootstrap_worker DIR");
    const std::filesystem::path dir = argv[1];
    const auto env = trident::launch_env::require();
    const char* timeout_text = std::getenv("TRIDENT_TEST_BOOTSTRAP_TIMEOUT_MS");
    const std::chrono::milliseconds timeout(timeout_text != nullptr ? std::atoll(timeout_text) : 60000);

    const bool gpu = trident::cuda_device_count() > 0;
    // Before the first NCCL call (ncclGetUniqueId on rank 0): each rank claims a host of its own.
    if (gpu) trident::detail::set_nccl_host_id();
    const ncclUniqueId id = trident::nccl_unique_id_from_file(dir / "nccl.id", env.rank, timeout);

    std::string report = trident::detail::concat("source ", env.source, "\nrank ", env.rank, " size ", env.size,
                                                 " local_rank ", env.local_rank, " local_size ", env.local_size,
                                                 "\nid ");
    static constexpr char hex[] = "0123456789abcdef";
    for (const char c : id.internal) {
      const auto b = static_cast<unsigned char>(c);
      report += hex[b >> 4];
      report += hex[b & 15];
    }
    if (gpu) {
      trident::select_device(env);
      auto comm = trident::nccl_comm::init(id, env.rank, env.size, {.timeout = timeout});
      std::vector<float> mine(1000, static_cast<float>(env.rank + 1));
      trident::buffer<float, trident::cuda_space> x(mine.size());
      trident::copy(std::span<const float>(mine), x);
      comm.all_reduce(x);
      comm.synchronize();
      const auto sum = trident::to_vector(x);
      report += trident::detail::concat("\nall_reduce ", sum.front(), " ", sum.back());
    } else {
      report += "\nall_reduce none (no CUDA device)";
    }
    report += "\n";
    trident::publish_file(dir / trident::detail::concat("rank", env.rank, ".txt"), std::as_bytes(std::span(report)));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bootstrap_worker: %s\n", e.what());
    return 1;
  }
}
