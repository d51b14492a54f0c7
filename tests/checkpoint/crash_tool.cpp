// The program that tests/checkpoint/crash_safety.sh kills with SIGKILL at random moments of a
// save, and then asks whether what is on disk is right:
//
//   crash_tool save  <root> <elements>   resume from the newest good checkpoint under root (if
//                                        any), then train and save after every step (sync, keep
//                                        3), printing "saved N"; runs until killed (or 10000 steps)
//   crash_tool check <root> <elements>   load the newest good checkpoint, train a fresh optimizer
//                                        from scratch to the same step and compare every field
//                                        bit for bit; prints "ok step N (skipped K)"; exit 0 when
//                                        equal, 1 when not, 3 when there is no checkpoint yet
//
// Two thread ranks, ZeRO-1, AdamW, fp32: parameters, and two optimizer states per element.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/local.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

using zero_t = trident::zero::zero_optimizer<1, trident::optim::adamw, trident::local_comm>;

trident::model_spec spec_of(std::size_t elements) {
  trident::model_spec spec;
  for (int l = 0; l < 4; ++l) spec.add("layer" + std::to_string(l) + ".weight", {elements / 4}, l);
  return spec;
}

float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

zero_t make(trident::local_comm& comm, std::size_t elements) {
  trident::optim::adamw opt;
  opt.opt.lr = 1e-3f;
  trident::zero::zero_options o;
  o.bucket_bytes = elements;  // a few buckets
  return zero_t(comm, spec_of(elements), opt, o);
}

void initialise(zero_t& z, std::size_t elements) {
  std::vector<float> v(elements / 4);
  for (int l = 0; l < 4; ++l) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = noise(static_cast<std::uint64_t>(l), i);
    z.set_parameter("layer" + std::to_string(l) + ".weight", v);
  }
}

void step(trident::local_comm& comm, zero_t& z, std::int64_t s) {
  for (int l = 3; l >= 0; --l) {
    const auto h = z.handle("layer" + std::to_string(l) + ".weight");
    const float* p = z.parameters(h).data();
    auto g = z.gradients(h);
    for (std::size_t i = 0; i < g.size(); ++i)
      g.data()[i] = 0.3f * p[i] + noise(static_cast<std::uint64_t>(s * 8 + l * 2 + comm.rank()), i);
    z.grad_ready(l);
  }
  z.step();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s save|check <root> <elements>\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const std::filesystem::path root = argv[2];
  const std::size_t elements = std::strtoull(argv[3], nullptr, 10) / 64 * 64;
  try {
    if (mode == "save") {
      trident::local_world::run(2, [&](trident::local_comm& comm) {
        zero_t z = make(comm, elements);
        initialise(z, elements);
        std::int64_t s = 0;
        if (auto r = trident::checkpoint::load_latest(comm, z, root)) s = r->step;
        for (; s < 10000;) {
          step(comm, z, s);
          ++s;
          trident::checkpoint::save(comm, z, root, s, {.metadata = {}, .keep = 3, .sync = true, .timeout = std::chrono::minutes(1)});
          if (comm.rank() == 0) {
            std::printf("saved %lld\n", static_cast<long long>(s));
            std::fflush(stdout);
          }
        }
      });
      return 0;
    }
    if (mode == "check") {
      int verdict = 0;
      trident::local_world::run(2, [&](trident::local_comm& comm) {
        zero_t loaded = make(comm, elements);
        std::vector<std::string> skipped;
        const auto r = trident::checkpoint::load_latest(comm, loaded, root, &skipped);
        if (!r) {
          verdict = 3;
          return;
        }
        zero_t fresh = make(comm, elements);
        initialise(fresh, elements);
        for (std::int64_t s = 0; s < r->step; ++s) step(comm, fresh, s);
        auto a = loaded.state_fields();
        auto b = fresh.state_fields();
        bool same = loaded.steps_taken() == fresh.steps_taken() && a.size() == b.size();
        for (std::size_t f = 0; same && f < a.size(); ++f)
          for (const auto& range : a[f].held)
            same = same && std::memcmp(static_cast<const float*>(a[f].data) + range.at, static_cast<const float*>(b[f].data) + range.at,
                                       range.count * sizeof(float)) == 0;
        std::vector<std::uint64_t> all(2);
        const std::uint64_t mine = same ? 0 : 1;
        comm.all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
        if (comm.rank() == 0) {
          verdict = all[0] + all[1] == 0 ? 0 : 1;
          std::printf("%s step %lld (skipped %zu)\n", verdict == 0 ? "ok" : "MISMATCH at", static_cast<long long>(r->step), skipped.size());
          for (const auto& why : skipped) std::printf("  skipped: %s\n", why.c_str());
        }
      });
      return verdict;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash_tool %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "crash_tool: unknown mode '%s'\n", mode.c_str());
  return 2;
}
