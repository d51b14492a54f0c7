// Checkpoint speed (issue 15): the synchronous save and the load of a ZeRO-1 AdamW optimizer in
// bytes per second, and how long an asynchronous save stalls training, in one run. The disk's
// own sequential bandwidth comes from fio beside it (bench/checkpoint_io.sh runs both and keeps
// the figures for bench/RESULTS.md).
//
//   checkpoint_io <dir> <parameters> [ranks] [repeats]
//
// Each figure is the best of `repeats`. Saves fsync every file (save_options::sync); before each
// load the files' pages are dropped from the page cache (posix_fadvise DONTNEED on clean pages,
// which needs no privilege), so a load reads the disk, as fio's reads do (--invalidate=1).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/local.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using zero_t = trident::zero::zero_optimizer<1, trident::optim::adamw, trident::local_comm>;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

std::uint64_t drop_cached(const std::filesystem::path& dir) {
  std::uint64_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    bytes += e.file_size();
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return bytes;
}

// A forward/backward stand-in: `n` dependent multiply-adds on a few registers (CPU work that
// touches no memory, so what slows it is only the cores being shared).
double busy_work(std::size_t n) {
  double a = 1.0, b = 0.5, c = 0.25, d = 0.125;
  for (std::size_t i = 0; i < n; ++i) {
    a = a * 0.999999 + 1e-9;
    b = b * 0.999999 + 2e-9;
    c = c * 0.999999 + 3e-9;
    d = d * 0.999999 + 4e-9;
  }
  return a + b + c + d;
}
constexpr std::size_t forward_backward_work = 100'000'000;  // about 0.2 s on one core of the CI VM

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <dir> <parameters> [ranks] [repeats]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const std::size_t parameters = std::strtoull(argv[2], nullptr, 10) / 256 * 256;
  const int ranks = argc > 3 ? std::atoi(argv[3]) : 1;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  std::filesystem::remove_all(dir);
  double save_s = 1e30, load_s = 1e30, iteration_s = 1e30, iteration_with_save_s = 1e30, blocked_at_once_s = 1e30,
         blocked_after_work_s = 1e30, async_total_s = 1e30;
  std::uint64_t bytes = 0;
  std::atomic<double> sink{0};
  trident::local_world::run(ranks, [&](trident::local_comm& comm) {
    trident::model_spec spec;
    for (int l = 0; l < 8; ++l) spec.add("layer" + std::to_string(l), {parameters / 8}, l);
    trident::optim::adamw opt;
    zero_t z(comm, spec, opt);
    for (auto& f : z.state_fields())  // something other than zeros
      for (const auto& r : f.held)
        for (std::size_t i = 0; i < r.count; ++i) static_cast<float*>(f.data)[r.at + i] = 1e-3f * static_cast<float>((r.begin + i) % 1000);
    trident::checkpoint::pending_save pending;
    for (int rep = 0; rep < repeats; ++rep) {
      comm.barrier();
      auto t = clock_type::now();
      trident::checkpoint::save(comm, z, dir / "sync", rep);
      comm.barrier();
      if (comm.rank() == 0) save_s = std::min(save_s, seconds_since(t));
      if (comm.rank() == 0) bytes = drop_cached(dir / "sync" / trident::checkpoint::detail::step_name(rep));
      comm.barrier();
      t = clock_type::now();
      trident::checkpoint::load(comm, z, dir / "sync" / trident::checkpoint::detail::step_name(rep));
      comm.barrier();
      if (comm.rank() == 0) load_s = std::min(load_s, seconds_since(t));
      comm.barrier();
      if (comm.rank() == 0) std::filesystem::remove_all(dir / "sync" / trident::checkpoint::detail::step_name(rep));

      // The asynchronous save against a training iteration: a forward/backward stand-in (fixed
      // CPU work), the gradients' reduction, the update. Measured on rank 0:
      //  - blocked: save_async's return plus the wait for its copy at the next change of the
      //    state, when that comes at once (no forward/backward first: the worst case), and when
      //    it comes after the forward/backward;
      //  - the iteration alone and with a save started at its beginning: the difference is all
      //    the save costs training, its background copy and write competing for the cores.
      auto reduce_and_update = [&] {
        for (int l = 0; l < 8; ++l) z.grad_ready(l);
        z.step();
      };
      auto forward_backward = [&] { sink += busy_work(forward_backward_work); };
      const auto async_dir = dir / "async" / trident::checkpoint::detail::step_name(rep);
      comm.barrier();
      t = clock_type::now();
      forward_backward();
      reduce_and_update();
      comm.barrier();
      if (comm.rank() == 0) iteration_s = std::min(iteration_s, seconds_since(t));
      for (const bool with_work : {false, true}) {
        comm.barrier();
        t = clock_type::now();
        // From the second save on, the previous save's memory is reused, as a training loop would.
        pending = trident::checkpoint::save_async(comm, z, dir / "async", rep, {}, std::move(pending));
        const double returned = seconds_since(t);
        if (with_work) forward_backward();
        const auto before_update = clock_type::now();
        (void)z.state_fields();  // waits for the save's copy, as the update would
        const double blocked = returned + seconds_since(before_update);
        reduce_and_update();
        comm.barrier();
        const double iteration = seconds_since(t);
        pending.wait();
        comm.barrier();
        if (comm.rank() == 0) {
          (with_work ? blocked_after_work_s : blocked_at_once_s) = std::min(with_work ? blocked_after_work_s : blocked_at_once_s, blocked);
          if (with_work) iteration_with_save_s = std::min(iteration_with_save_s, iteration);
          async_total_s = std::min(async_total_s, seconds_since(t));
          std::filesystem::remove_all(async_dir);
        }
        comm.barrier();
      }
    }
  });
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("checkpoint_io: %zu parameters (ZeRO-1 AdamW fp32: parameters + 2 states), %d thread rank(s), %.3f GB per checkpoint, best of %d\n",
              parameters, ranks, gb, repeats);
  std::printf("  save (fsync)              %8.3f s  %7.2f GB/s\n", save_s, gb / save_s);
  std::printf("  load (cold, verified)     %8.3f s  %7.2f GB/s\n", load_s, gb / load_s);
  const double slowdown = iteration_with_save_s - iteration_s;
  std::printf("  async save: blocked, update at once         %8.3f s  (%.1f%% of the synchronous save)\n", blocked_at_once_s,
              100.0 * blocked_at_once_s / save_s);
  std::printf("  async save: blocked, update after fwd/bwd   %8.3f s  (%.1f%% of the synchronous save)\n", blocked_after_work_s,
              100.0 * blocked_after_work_s / save_s);
  std::printf("  iteration alone / with an async save        %8.3f s  %.3f s  (+%.3f s: %.1f%% of the synchronous save)\n", iteration_s,
              iteration_with_save_s, slowdown, 100.0 * slowdown / save_s);
  std::printf("  async save: until done                      %8.3f s\n", async_total_s);
  std::printf("  (sink %g)\n", sink.load());
  std::filesystem::remove_all(dir);
  return 0;
}
