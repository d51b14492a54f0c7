// Sharded checkpoints of zero_optimizer on thread ranks: a resumed run equals an uninterrupted
// one bit for bit (ZeRO 0-3, fp32, bf16, fp16 with skipped steps and a moving loss scale), a
// checkpoint loads into another world size and stage (resharding), and broken checkpoints are
// named and skipped. (test_zero_checkpoint_mpi.cpp: the same resume under MPI.)
#include <doctest/doctest.h>

#include <unistd.h>

#include "checkpoint/resume_suite.hpp"

namespace ck = trident::checkpoint;
using trident::local_comm;
using trident::local_world;
using namespace resume_suite;

namespace {

fs::path fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("trident_ckpt_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

template <int Stage, class Precision>
outcome run(int ranks, const fs::path& root, bool resume) {
  return local_world::run(ranks, [&](local_comm& comm) { return run_on<Stage, Precision>(comm, root, resume); })[0];
}

}  // namespace

TEST_CASE("checkpoint: 10 steps, save, load, 10 steps equals 20 steps bit for bit, ZeRO 0-3, fp32, bf16 and fp16") {
  for_each_stage_and_precision([]<int Stage, class Precision>(const char* precision) {
    CAPTURE(Stage);
    CAPTURE(precision);
    const auto straight_dir = fresh_dir("straight"), resumed_dir = fresh_dir("resumed");
    const auto straight = run<Stage, Precision>(2, straight_dir, false);
    const auto resumed = run<Stage, Precision>(2, resumed_dir, true);
    check_same<Precision>(straight, resumed, straight_dir, resumed_dir, 2);
  });
}


TEST_CASE("checkpoint: a resume that loses state is caught (the test can fail)") {
  // Resumed without the optimizer states: the parameters differ from the uninterrupted run.
  const auto dir = fresh_dir("lossy");
  const auto straight = run<1, trident::full_precision>(2, fresh_dir("lossy_straight"), false);
  auto per_rank = local_world::run(2, [&](local_comm& comm) {
    {
      optimizer_t<1, trident::full_precision> z(comm, toy_spec(), adamw(), options());
      initialise(z);
      train(comm, z, 0, 10);
      ck::save(comm, z, dir, 10);
    }
    optimizer_t<1, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    ck::load(comm, z, dir / "step_00000010");
    for (auto& f : z.state_fields())
      if (f.name == "state1")
        for (const auto& r : f.held) std::fill_n(static_cast<float*>(f.data) + r.at, r.count, 0.0f);
    train(comm, z, 10, 20);
    return z.full_master();
  });
  CHECK(std::memcmp(per_rank[0].data(), straight.master.data(), straight.master.size() * sizeof(float)) != 0);
}

TEST_CASE("checkpoint: saved at (d = 4, ZeRO-3), loaded at (d = 2, ZeRO-1) and (d = 1, ZeRO-0), training goes on as in that layout") {
  const auto root = fresh_dir("reshard");
  local_world::run(4, [&](local_comm& comm) {
    optimizer_t<3, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    initialise(z);
    train(comm, z, 0, 10);
    ck::save(comm, z, root, 10);
  });
  auto continued = [&](auto stage, int ranks) {
    constexpr int S = decltype(stage)::value;
    auto loaded = local_world::run(ranks, [&](local_comm& comm) {
      optimizer_t<S, trident::full_precision> z(comm, toy_spec(), adamw(), options());
      ck::load(comm, z, root / "step_00000010");
      train(comm, z, 10, 20);
      return z.full_master();
    })[0];
    auto straight = local_world::run(ranks, [&](local_comm& comm) {
      optimizer_t<S, trident::full_precision> z(comm, toy_spec(), adamw(), options());
      initialise(z);
      train(comm, z, 0, 20);
      return z.full_master();
    })[0];
    REQUIRE(loaded.size() == straight.size());
    double worst = 0;
    for (std::size_t i = 0; i < loaded.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(loaded[i] - straight[i])));
    MESSAGE("d = ", ranks, ", ZeRO-", S, ": largest difference from training in that layout throughout: ", worst);
    CHECK(worst <= 1e-6);
    // and the parameters moved: 10 more steps are not nothing
    double moved = 0;
    for (std::size_t i = 0; i < loaded.size(); ++i) moved = std::max(moved, static_cast<double>(std::fabs(loaded[i])));
    CHECK(moved > 0.1);
  };
  continued(std::integral_constant<int, 1>{}, 2);
  continued(std::integral_constant<int, 0>{}, 1);
  continued(std::integral_constant<int, 2>{}, 3);  // 3 does not divide the buckets as 4 did
}

TEST_CASE("checkpoint: broken checkpoints are named, and load_latest falls back to the newest good one") {
  const auto root = fresh_dir("broken");
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<2, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    initialise(z);
    for (int s = 1; s <= 4; ++s) {
      train(comm, z, s - 1, s);
      ck::save(comm, z, root, s, {.metadata = {}, .keep = 3, .sync = true});
    }
  });
  CHECK(ck::checkpoints(root).size() == 3);  // keep = 3: step 1 is gone
  CHECK(!fs::exists(root / "step_00000001"));
  // step 4: a flipped byte in a rank file; step 3: no MANIFEST (a save cut short).
  {
    const auto f = root / "step_00000004" / "rank_00001.safetensors";
    auto b = bytes_of(f);
    b[b.size() - 3] ^= 0x10;
    std::ofstream(f, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
    fs::remove(root / "step_00000003" / "MANIFEST");
  }
  CHECK_THROWS_WITH_AS(ck::verify(root / "step_00000004"), doctest::Contains("rank_00001.safetensors is corrupt"),
                       ck::corrupt_checkpoint);
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<2, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, z, root / "step_00000004"), doctest::Contains("is corrupt"), ck::corrupt_checkpoint);
    std::vector<std::string> skipped;
    const auto r = ck::load_latest(comm, z, root, &skipped);
    REQUIRE(r.has_value());
    CHECK(r->step == 2);  // 4 is corrupt, 3 incomplete (not listed: no MANIFEST)
    CHECK(skipped.size() == 1);
    CHECK(z.steps_taken() == 2);
  });
  // Another precision, another model: refused, naming what differs.
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<2, trident::mixed_precision<trident::bf16>> z(comm, toy_spec(), adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, z, root / "step_00000002"), doctest::Contains("'parameters' is float32 there and bfloat16 here"), trident::error);
    trident::model_spec other = toy_spec();
    other.add("extra", {3}, 4);
    optimizer_t<2, trident::full_precision> y(comm, other, adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, y, root / "step_00000002"), doctest::Contains("its model differs"), trident::usage_error);
    // Not a broken checkpoint to go past: load_latest must not start this model afresh.
    CHECK_THROWS_WITH_AS(ck::load_latest(comm, y, root), doctest::Contains("its model differs"), trident::usage_error);
  });
  fs::remove_all(root.parent_path());
}

TEST_CASE("checkpoint: an asynchronous save holds the state of its start while training goes on") {
  const auto sync_root = fresh_dir("sync"), async_root = fresh_dir("async");
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<3, trident::mixed_precision<trident::fp16>> z(comm, toy_spec(), adamw(), options(),
                                                               make_scaler<trident::mixed_precision<trident::fp16>>());
    initialise(z);
    train(comm, z, 0, 10);
    ck::save(comm, z, sync_root, 10);
    auto pending = ck::save_async(comm, z, async_root, 10);
    CHECK(pending.path() == async_root / "step_00000010");
    train(comm, z, 10, 15);  // changes every field the save is still writing
    pending.wait();
    CHECK(pending.ready());
  });
  ck::verify(async_root / "step_00000010");
  for (const char* f : {"rank_00000.safetensors", "rank_00001.safetensors", "index.json", "MANIFEST"}) {
    CAPTURE(f);
    CHECK(bytes_of(sync_root / "step_00000010" / f) == bytes_of(async_root / "step_00000010" / f));
  }
  CHECK(!fs::exists(async_root / ".tmp.step_00000010"));
}
