// Offload of the optimizer state (issue 14) on thread ranks: the host and NVMe tiers train
// bit for bit as the in-memory optimizer for ZeRO 1, 2 and 3; the ledger reports every tier
// as offload/store.hpp's formulas say; checkpoints' state_fields() read and write through the
// files; bad input (directories, a full disk, a truncated file, a CPU without AVX-512) is an
// error or a clean fallback, never wrong state.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <type_traits>
#include <vector>

#include "offload/offload_training.hpp"
#include "trident/comm/local.hpp"
#include "trident/optim/host_simd.hpp"

using trident::local_comm;
using trident::local_world;
namespace zero = trident::zero;
namespace optim = trident::optim;
namespace offload = trident::offload;
using offload_training::scratch_dir;
using offload_training::with;
using zero_training::by_name;

namespace {

optim::adamw adamw() {
  optim::adamw o;
  o.opt.lr = 3e-3f;
  o.opt.weight_decay = 1e-2f;
  return o;
}

optim::sgd sgd() {
  optim::sgd o;
  o.opt.lr = 0.05f;
  o.opt.momentum = 0.9f;
  return o;
}

template <int Stage, class Opt, class Precision = trident::full_precision>
std::vector<float> train(int n, Opt opt, int steps, zero::zero_options options) {
  return local_world::run(n, [&](local_comm& c) { return by_name<Stage, Opt, Precision>(c, opt, steps, options); })[0];
}

// Every tier against memory, `==` on every parameter.
template <int Stage, class Opt, class Precision = trident::full_precision>
void check_tiers(int n, Opt opt) {
  scratch_dir dir("tiers");
  const auto memory = train<Stage, Opt, Precision>(n, opt, 6, zero_training::small_buckets());
  offload::nvme_options two;
  two.buffers = 2;
  offload::nvme_options buffered;
  buffered.direct = false;
  const std::pair<std::string, std::shared_ptr<const offload::placement>> tiers[] = {
      {"host", offload::host()},
      {"nvme", offload::nvme(dir.path)},
      {"nvme, 2 buffers", offload::nvme(dir.path, two)},
      {"nvme, page cache", offload::nvme(dir.path, buffered)}};
  for (const auto& [name, placement] : tiers) {
    INFO("ZeRO-", Stage, " on ", n, " ranks, tier ", name);
    CHECK(train<Stage, Opt, Precision>(n, opt, 6, with(placement)) == memory);
  }
  CHECK(dir.files() == 0);  // each rank's file goes with its optimizer
}

}  // namespace

TEST_CASE("offload: host and NVMe tiers train bitwise as in memory, ZeRO 1-3 (AdamW, bf16 and fp32)") {
  check_tiers<1, optim::adamw, trident::mixed_precision<trident::bf16>>(2, adamw());
  check_tiers<2, optim::adamw, trident::mixed_precision<trident::bf16>>(3, adamw());
  check_tiers<3, optim::adamw, trident::mixed_precision<trident::bf16>>(2, adamw());
  check_tiers<3, optim::adamw>(4, adamw());  // no master weights: only the states move
}

TEST_CASE("offload: SGD with momentum and fp16 loss scaling (skipped steps) offloaded to NVMe") {
  check_tiers<2, optim::sgd, trident::mixed_precision<trident::fp16>>(2, sgd());
}

TEST_CASE("offload: the ledger reports every tier as the formulas say") {
  using trident::mem_category;
  using trident::space_kind;
  scratch_dir dir("ledger");
  const mlp::dims d{64, 128, 16};
  for (int n : {1, 2, 4}) {
    local_world::run(n, [&](local_comm& comm) {
      auto ledger = std::make_shared<trident::memory_ledger>("rank " + std::to_string(comm.rank()));
      trident::scoped_ledger use{ledger};
      zero::zero_options options;
      options.bucket_bytes = 16 << 10;
      options.first_bucket_bytes = 4 << 10;
      options.persistence_threshold = 0;
      options.offload = offload::nvme(dir.path);
      zero::zero_optimizer<2, optim::adamw, local_comm, trident::mixed_precision<trident::bf16>> z(comm, mlp::spec(d), adamw(),
                                                                                                     options);
      mlp::initialise(z, d);
      const std::size_t rows = 16 / static_cast<std::size_t>(n);
      mlp::train_step(z, d, static_cast<std::size_t>(comm.rank()) * rows, rows, rows);
      z.step();
      INFO(n, " ranks, rank ", comm.rank(), "\n", ledger->report());
      const double psi = static_cast<double>(z.layout().full_size());
      // What stays in the optimizer's memory: bf16 parameters (whole) and gradients (sharded).
      const auto held = static_cast<double>(ledger->bytes(space_kind::host, mem_category::parameters) +
                                            ledger->bytes(space_kind::host, mem_category::gradients) +
                                            ledger->bytes(space_kind::host, mem_category::optimizer_state));
      CHECK(held == psi * offload::device_bytes_per_parameter(2, offload::tier::nvme, n));
      CHECK(held < psi * offload::device_bytes_per_parameter(2, offload::tier::memory, n));
      // On disk: the fp32 master (parameters) and AdamW's two states, each piece padded to 4 KiB.
      std::size_t padded = 0;
      for (std::size_t b = 0; b < z.layout().buckets().size(); ++b)
        padded += (z.layout().piece_size(b) * 4 + 4095) / 4096 * 4096;
      CHECK(ledger->bytes(space_kind::nvme, mem_category::parameters) == padded);
      CHECK(ledger->bytes(space_kind::nvme, mem_category::optimizer_state) == 2 * padded);
      CHECK(static_cast<double>(padded) >= 4.0 * psi / n);
      // In host memory besides: the buffers the pieces pass through, 3 at most, each a record.
      std::size_t largest = 0;
      for (std::size_t b = 0; b < z.layout().buckets().size(); ++b)
        largest = std::max(largest, 3 * ((z.layout().piece_size(b) * 4 + 4095) / 4096 * 4096));
      const std::size_t slots = std::min<std::size_t>(3, z.layout().buckets().size());
      CHECK(ledger->bytes(space_kind::host, mem_category::communication) >= slots * largest);
    });
  }
  CHECK(dir.files() == 0);
}

// l2's state in host memory, l0's and l1's in files (small_buckets(): l2 has a bucket of its own,
// with bf16 gradients l1 and l0 share one).
static std::shared_ptr<const offload::placement> l2_on_host(const std::filesystem::path& dir) {
  return offload::tiered([](std::string_view t) { return t.starts_with("l2.") ? offload::tier::host : offload::tier::nvme; },
                         offload::host(), offload::nvme(dir));
}

TEST_CASE("offload: a tier per tensor (tiered) trains bitwise as in memory, and the ledger splits as the rule says") {
  using trident::mem_category;
  using trident::space_kind;
  using precision = trident::mixed_precision<trident::bf16>;
  scratch_dir dir("tiered");
  auto check = [&]<int Stage>(std::integral_constant<int, Stage>) {
    const auto memory = train<Stage, optim::adamw, precision>(2, adamw(), 6, zero_training::small_buckets());
    INFO("ZeRO-", Stage);
    CHECK(train<Stage, optim::adamw, precision>(2, adamw(), 6, with(l2_on_host(dir.path))) == memory);
    // Everything on one tier through the rule is the same as that tier alone.
    auto all_host = offload::tiered([](std::string_view) { return offload::tier::host; }, offload::host(), offload::nvme(dir.path));
    CHECK(train<Stage, optim::adamw, precision>(2, adamw(), 6, with(all_host)) == memory);
  };
  check(std::integral_constant<int, 1>{});
  check(std::integral_constant<int, 2>{});
  check(std::integral_constant<int, 3>{});
  CHECK(dir.files() == 0);

  // The ledger: l2's master weights and two states (12 bytes per element of its piece) in host
  // memory, the rest on disk.
  local_world::run(2, [&](local_comm& comm) {
    auto ledger = std::make_shared<trident::memory_ledger>("rank " + std::to_string(comm.rank()));
    trident::scoped_ledger use{ledger};
    zero::zero_optimizer<2, optim::adamw, local_comm, precision> z(comm, mlp::spec(mlp::dims{}), adamw(),
                                                                   with(l2_on_host(dir.path)));
    const std::size_t l2 = z.layout().find("l2.weight").bucket;
    REQUIRE(z.layout().buckets().size() > 1);
    std::size_t nvme_padded = 0;
    for (std::size_t b = 0; b < z.layout().buckets().size(); ++b)
      if (b != l2) nvme_padded += (z.layout().piece_size(b) * 4 + 4095) / 4096 * 4096;
    INFO(ledger->report());
    CHECK(ledger->bytes(space_kind::host, mem_category::optimizer_state) == 2 * 4 * z.layout().piece_size(l2));
    CHECK(ledger->bytes(space_kind::nvme, mem_category::optimizer_state) == 2 * nvme_padded);
    CHECK(ledger->bytes(space_kind::nvme, mem_category::parameters) == nvme_padded);
  });
  CHECK(dir.files() == 0);
}

TEST_CASE("offload: a tiered rule that splits a bucket or keeps a tensor in memory is a usage error naming it") {
  scratch_dir dir("tiered-bad");
  using Z = zero::zero_optimizer<2, optim::adamw, local_comm, trident::mixed_precision<trident::bf16>>;
  local_world::run(2, [&](local_comm& comm) {
    zero::zero_options one_bucket;  // 25 MB: the whole MLP in one bucket, l2 and the rest disagree
    one_bucket.offload = l2_on_host(dir.path);
    CHECK_THROWS_WITH_AS(Z(comm, mlp::spec(mlp::dims{}), adamw(), one_bucket),
                         doctest::Contains("holds tensor 'l0.weight' (nvme) and tensor 'l2.weight' (host)"), trident::usage_error);
    auto memory = offload::tiered([](std::string_view t) { return t == "l2.bias" ? offload::tier::memory : offload::tier::host; },
                                  offload::host(), offload::nvme(dir.path));
    CHECK_THROWS_WITH_AS(Z(comm, mlp::spec(mlp::dims{}), adamw(), with(memory)), doctest::Contains("'l2.bias' on tier memory"),
                         trident::usage_error);
  });
  CHECK_THROWS_WITH_AS(offload::tiered({}, offload::host(), offload::nvme(dir.path)), doctest::Contains("empty rule"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(offload::tiered([](std::string_view) { return offload::tier::host; }, offload::nvme(dir.path), offload::host()),
                       doctest::Contains("expected offload::host()"), trident::usage_error);
  CHECK(dir.files() == 0);
}

TEST_CASE("offload: the formulas per tier (ZeRO's 16, 4 + 12/N, 2 + 14/N, 16/N and their offloaded forms)") {
  using offload::tier;
  CHECK(offload::device_bytes_per_parameter(0, tier::memory, 8) == 16.0);
  CHECK(offload::device_bytes_per_parameter(1, tier::memory, 8) == 4.0 + 12.0 / 8);
  CHECK(offload::device_bytes_per_parameter(2, tier::memory, 8) == 2.0 + 14.0 / 8);
  CHECK(offload::device_bytes_per_parameter(3, tier::memory, 8) == 16.0 / 8);
  CHECK(offload::device_bytes_per_parameter(1, tier::host, 8) == 4.0);
  CHECK(offload::device_bytes_per_parameter(2, tier::nvme, 8) == 2.0 + 2.0 / 8);
  CHECK(offload::device_bytes_per_parameter(3, tier::nvme, 8) == 4.0 / 8);
  CHECK(offload::device_bytes_per_parameter(0, tier::host, 8) < 0);  // refused
}

TEST_CASE("offload: state_fields() reads and writes through the NVMe files (what checkpoints use)") {
  scratch_dir dir("fields");
  using precision = trident::mixed_precision<trident::bf16>;
  auto run = [&](zero::zero_options options) {
    return local_world::run(2, [&](local_comm& comm) {
      const mlp::dims d;
      zero::zero_optimizer<3, optim::adamw, local_comm, precision> z(comm, mlp::spec(d), adamw(), options);
      mlp::initialise(z, d);
      std::vector<std::vector<float>> seen;
      for (int s = 0; s < 6; ++s) {
        const std::size_t first = static_cast<std::size_t>(s) * 24 + static_cast<std::size_t>(comm.rank()) * 12;
        mlp::train_step(z, d, first, 12, 12, z.loss_scale());
        z.step();
        if (s == 2) {
          // Read every field, then change them all, as a checkpoint's load does.
          for (auto& f : z.state_fields()) {
            if (f.type != trident::dtype::float32) continue;
            auto* data = static_cast<float*>(f.data);
            std::vector<float> values;
            for (const auto& r : f.held)
              for (std::size_t i = 0; i < r.count; ++i) {
                values.push_back(data[r.at + i]);
                data[r.at + i] *= 0.75f;
              }
            seen.push_back(values);
          }
          z.set_parameter("l1.bias", std::vector<float>(d.hidden, 0.125f));
        }
      }
      seen.push_back(z.full_master());
      return seen;
    })[0];
  };
  const auto memory = run(zero_training::small_buckets());
  const auto nvme = run(with(offload::nvme(dir.path)));
  REQUIRE(memory.size() == 4);  // master, two states, then the final parameters
  CHECK(nvme == memory);
}

TEST_CASE("offload: bad directories are usage errors that name them") {
  scratch_dir dir("bad");
  CHECK_THROWS_WITH_AS(offload::nvme(dir.path / "missing"), doctest::Contains("does not exist"), trident::usage_error);
  std::ofstream(dir.path / "a-file") << "x";
  CHECK_THROWS_WITH_AS(offload::nvme(dir.path / "a-file"), doctest::Contains("is not a directory"), trident::usage_error);
  // Not writable: /sys refuses new files even to root; a read-only directory does for others.
  const std::filesystem::path locked = ::geteuid() == 0 ? std::filesystem::path("/sys") : dir.path / "locked";
  if (::geteuid() != 0) {
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  }
  local_world::run(1, [&](local_comm& comm) {
    auto o = with(offload::nvme(locked));
    using Z = zero::zero_optimizer<2, optim::adamw, local_comm>;
    CHECK_THROWS_WITH_AS(Z(comm, mlp::spec(mlp::dims{}), adamw(), o), doctest::Contains("not writable"), trident::usage_error);
    // Stage 0 keeps every state on every rank: nothing to offload piece by piece.
    auto h = with(offload::host());
    using Z0 = zero::zero_optimizer<0, optim::adamw, local_comm>;
    CHECK_THROWS_WITH_AS(Z0(comm, mlp::spec(mlp::dims{}), adamw(), h), doctest::Contains("needs ZeRO stage 1, 2 or 3"),
                         trident::usage_error);
  });
  if (::geteuid() != 0) std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
}

TEST_CASE("offload: a disk without room is an error at construction, before training") {
  scratch_dir dir("full");
  // RLIMIT_FSIZE makes the filesystem refuse the file's size as a full disk would (EFBIG);
  // SIGXFSZ, which would end the process, is ignored meanwhile.
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = old;
  tiny.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &tiny) == 0);
  local_world::run(1, [&](local_comm& comm) {
    using Z = zero::zero_optimizer<1, optim::adamw, local_comm>;
    CHECK_THROWS_WITH_AS(Z(comm, mlp::spec(mlp::dims{}), adamw(), with(offload::nvme(dir.path))), doctest::Contains("no room"),
                         trident::usage_error);
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, previous);
  CHECK(dir.files() == 0);  // nothing left behind
}

TEST_CASE("offload: a file truncated behind our back is an error before the step changes anything") {
  scratch_dir dir("truncated");
  local_world::run(1, [&](local_comm& comm) {
    const mlp::dims d;
    zero::zero_optimizer<2, optim::adamw, local_comm> z(comm, mlp::spec(d), adamw(), with(offload::nvme(dir.path)));
    mlp::initialise(z, d);
    mlp::train_step(z, d, 0, 24, 24, z.loss_scale());
    z.step();
    mlp::train_step(z, d, 24, 24, 24, z.loss_scale());
    const auto before = z.full_master();  // fp32 without master weights: the working weights, in memory
    REQUIRE(dir.files() == 1);
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) std::filesystem::resize_file(e.path(), 4096);
    CHECK_THROWS_WITH_AS(z.step(), doctest::Contains("truncated behind trident's back"), trident::error);
    CHECK(z.full_master() == before);
    CHECK(z.steps_taken() == 1);
  });
}

TEST_CASE("offload: without AVX-512 (or AVX2) the host step falls back and trains the same bits") {
  scratch_dir dir("isa");
  using precision = trident::mixed_precision<trident::bf16>;
  const auto widest = train<2, optim::adamw, precision>(2, adamw(), 4, with(offload::nvme(dir.path)));
  for (auto isa : {optim::detail::host_isa::avx2, optim::detail::host_isa::portable}) {
    if (!optim::detail::force_host_isa(isa)) continue;  // this CPU lacks it
    INFO("forced ISA ", static_cast<int>(isa));
    CHECK(train<2, optim::adamw, precision>(2, adamw(), 4, with(offload::nvme(dir.path))) == widest);
    optim::detail::unforce_host_isa();
  }
}

TEST_CASE("offload: an NVMe store keeps what a pass wrote, through io_uring and O_DIRECT where they work") {
  scratch_dir dir("store");
  offload::store_request r;
  r.fields = {trident::mem_category::parameters, trident::mem_category::optimizer_state};
  r.pieces = {{0, 1000}, {1000, 1}, {1001, 5000}, {6001, 3}};  // sizes that are not multiples of 4 KiB
  r.total = 6004;
  auto store = offload::nvme(dir.path)->make(r);
  auto& nvme = dynamic_cast<offload::detail::nvme_store&>(*store);
#if defined(TRIDENT_HAS_LIBURING) && TRIDENT_HAS_LIBURING
  CHECK(std::string(nvme.store_engine()) == "io_uring");
#else
  CHECK(std::string(nvme.store_engine()) == "pread/pwrite thread");
#endif
  MESSAGE("NVMe store: ", nvme.store_engine(), ", O_DIRECT ", nvme.direct(), ", ", nvme.file_bytes(), " bytes in ", nvme.path().string());
  CHECK(nvme.file_bytes() == 2 * (4096 + 4096 + 20480 + 4096));
  const std::vector<std::size_t> order = {0, 1, 2, 3}, backwards = {3, 2, 1, 0};
  for (int pass = 0; pass < 3; ++pass) {
    store->begin_pass(pass == 1 ? backwards : order);
    for (std::size_t p : pass == 1 ? backwards : order) {
      float* const* f = store->acquire(p);
      for (std::size_t i = 0; i < r.pieces[p].size; ++i) {
        const float expected = static_cast<float>(pass * 10000 + r.pieces[p].begin + i);
        REQUIRE(f[0][i] == (pass == 0 ? 0.0f : expected - 10000));  // what the last pass wrote (zeros at first)
        REQUIRE(f[1][i] == (pass == 0 ? 0.0f : -(expected - 10000)));
        f[0][i] = expected;
        f[1][i] = -expected;
      }
      store->release(p, true);
    }
    store->end_pass();
  }
  // Out of the pass's order is a usage error, not a wrong piece.
  store->begin_pass(order);
  CHECK_THROWS_WITH_AS(store->acquire(2), doctest::Contains("out of the pass's order"), trident::usage_error);
}

TEST_CASE("offload: an NVMe store takes an empty piece (it read as an end of file and poisoned the store)") {
  scratch_dir dir("empty_piece");
  offload::store_request r;
  r.fields = {trident::mem_category::parameters, trident::mem_category::optimizer_state};
  r.pieces = {{0, 4}, {4, 0}, {4, 4}};
  r.total = 8;
  auto store = offload::nvme(dir.path)->make(r);
  const std::vector<std::size_t> order = {0, 1, 2};
  for (int pass = 0; pass < 2; ++pass) {
    store->begin_pass(order);
    for (std::size_t p : order) {
      float* const* f = store->acquire(p);
      for (std::size_t i = 0; i < r.pieces[p].size; ++i) {
        CHECK(f[0][i] == (pass == 0 ? 0.0f : static_cast<float>(r.pieces[p].begin + i)));
        f[0][i] = static_cast<float>(r.pieces[p].begin + i);
      }
      store->release(p, true);
    }
    store->end_pass();
  }
}
