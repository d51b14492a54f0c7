// The NVMe tier's speed (issue 14), on one thread rank: a ZeRO-1 mixed-precision (bf16) AdamW
// optimizer over `params` parameters whose fp32 master weights and states live in files under
// `dir` (offload::nvme), against
//   - the same optimizer in memory: its step is the host update alone;
//   - the store's I/O alone: a pass over the same records with nothing computed (read and
//     write-back), and a pass that only reads;
// so that "an offloaded step takes at most 1.2 x max(host update, disk I/O)" can be read off one
// run. bench/offload.sh runs it beside fio on the same disk.
//
//   offload_io DIR [params = 64M] [steps = 5] [buffers = 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/offload/nvme.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr std::size_t layers = 8;

trident::model_spec spec_of(std::size_t params) {
  trident::model_spec s;
  for (std::size_t l = 0; l < layers; ++l) s.add("layer" + std::to_string(l) + ".weight", {params / layers}, static_cast<int>(l));
  return s;
}

using zero_type = trident::zero::zero_optimizer<1, trident::optim::adamw, trident::local_comm, trident::mixed_precision<trident::bf16>>;

// Median step time over `steps` steps (after one warm-up unless told not to) with every
// gradient set.
double time_steps(zero_type& z, int steps, bool warm_up = true) {
  std::vector<double> times;
  for (int s = warm_up ? 0 : 1; s <= steps; ++s) {
    for (std::size_t l = 0; l < layers; ++l) {
      auto g = z.gradients(z.handle("layer" + std::to_string(l) + ".weight"));
      std::fill(g.data(), g.data() + g.size(), trident::bf16(0.01f * static_cast<float>(l + 1)));
      z.grad_ready(static_cast<int>(l));
    }
    const auto t = clock_type::now();
    z.step();
    if (s > 0) times.push_back(seconds_since(t));
  }
  return times.empty() ? 0.0 : median(times);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [params] [steps] [buffers]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::size_t params = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::size_t{64} << 20;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 5;
  trident::offload::nvme_options nvme;
  nvme.buffers = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 3;
  trident::optim::adamw adamw;
  adamw.opt.lr = 1e-3f;

  trident::local_world::run(1, [&](trident::local_comm& comm) {
    const auto spec = spec_of(params);
    double update = 0, offloaded = 0, io_rw = 0, io_read = 0, step_ratio = 0;
    std::size_t file_bytes = 0, pieces = 0, largest_piece = 0;
    const char* engine = "";
    bool direct = false;
    trident::zero::zero_options options;
    if (const char* e = std::getenv("BUCKET_MB")) options.bucket_bytes = std::strtoull(e, nullptr, 10) << 20;
    {
      zero_type z(comm, spec, adamw, options);
      update = time_steps(z, steps);
    }
    {
      trident::zero::zero_options o = options;
      o.offload = trident::offload::nvme(dir, nvme);
      zero_type z(comm, spec, adamw, o);
      // The store's I/O alone, on records laid out as the optimizer's: a store of its own.
      trident::offload::store_request r;
      r.fields = {trident::mem_category::parameters, trident::mem_category::optimizer_state, trident::mem_category::optimizer_state};
      for (std::size_t b = 0; b < z.layout().buckets().size(); ++b)
        r.pieces.push_back({z.layout().buckets()[b].shard_begin, z.layout().piece_size(b)});
      r.total = z.layout().shard_size();
      pieces = r.pieces.size();
      for (const auto& p : r.pieces) largest_piece = std::max(largest_piece, p.size);
      auto store = trident::offload::nvme(dir, nvme)->make(r);
      auto& s = dynamic_cast<trident::offload::detail::nvme_store&>(*store);
      engine = s.store_engine();
      direct = s.direct();
      file_bytes = s.file_bytes();
      std::vector<std::size_t> order(r.pieces.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      auto pass = [&](bool write) {
        const auto t = clock_type::now();
        store->begin_pass(order);
        for (std::size_t p : order) {
          store->acquire(p);
          store->release(p, write);
        }
        store->end_pass();
        return seconds_since(t);
      };
      // The disk's speed drifts (a shared virtual disk moves 2-3x within a minute): the I/O
      // pass and the offloaded step alternate, and the ratio is taken within each round. Each
      // reads what it wrote one operation earlier, so a cache below the file system (a
      // virtual disk's host) favours neither. The read-only passes come after.
      std::vector<double> rw, rd, step, ratio;
      (void)time_steps(z, 0);
      (void)pass(true);
      for (int k = 0; k < steps; ++k) {
        rw.push_back(pass(true));
        step.push_back(time_steps(z, 1, false));
        ratio.push_back(step.back() / std::max(update, rw.back()));
      }
      for (int k = 0; k < steps; ++k) {
        (void)time_steps(z, 1, false);  // between two reads of the store, as much traffic as above
        rd.push_back(pass(false));
      }
      io_rw = median(rw);
      io_read = median(rd);
      offloaded = median(step);
      step_ratio = median(ratio);
    }
    const double gb = static_cast<double>(file_bytes) / 1e9;
    std::printf("offload_io: %zu parameters (ZeRO-1, bf16, AdamW: fp32 master + 2 states = %.3f GB on disk), %zu buffers, %s, "
                "O_DIRECT %s\n",
                params, gb, nvme.buffers, engine, direct ? "on" : "off");
    std::printf("  %zu pieces of up to %zu parameters (zero_options::bucket_bytes %zu MiB)\n", pieces, largest_piece,
                options.bucket_bytes >> 20);
    std::printf("  host update (in memory)     %8.1f ms\n", update * 1e3);
    std::printf("  disk I/O (read + write)     %8.1f ms   %6.2f GB/s each way, %6.2f GB/s together\n", io_rw * 1e3, gb / io_rw,
                2 * gb / io_rw);
    std::printf("  disk read alone             %8.1f ms   %6.2f GB/s\n", io_read * 1e3, gb / io_read);
    std::printf("  offloaded step              %8.1f ms   = %.2f x max(host update, disk I/O) (median of the ratios "
                "within each of %d rounds)\n", offloaded * 1e3, step_ratio, steps);
    std::printf("RESULT read_gbps=%.3f rw_gbps=%.3f step_ratio=%.3f\n", gb / io_read, 2 * gb / io_rw, step_ratio);
  });
  return 0;
}
