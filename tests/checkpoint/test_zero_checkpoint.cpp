// Sharded checkpoints of zero_optimizer on thread ranks: a resumed run equals an uninterrupted
// one bit for bit (ZeRO 0-3, fp32, bf16, fp16 with skipped steps and a moving loss scale), a
// checkpoint loads into another world size and stage (resharding), and broken checkpoints are
// named and skipped. (test_zero_checkpoint_mpi.cpp: the same resume under MPI.)
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

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
    // Without echoes only the rank that found the fault (rank 1: its file) has a reason.
    std::vector<std::string> found;
    REQUIRE(ck::load_latest(comm, z, root, &found, /*echoes=*/false).has_value());
    INFO("rank ", comm.rank(), " found: ", found.empty() ? std::string("nothing") : found[0]);
    CHECK(found.size() == (comm.rank() == 1 ? 1u : 0u));
    if (comm.rank() == 1 && !found.empty()) CHECK(found[0].find("rank_00001.safetensors") != std::string::npos);
  });
  // Another precision, another model: refused, naming what differs.
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<2, trident::mixed_precision<trident::bf16>> z(comm, toy_spec(), adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, z, root / "step_00000002"), doctest::Contains("'parameters' is float32 there and bfloat16 here"), trident::error);
    trident::model_spec other = toy_spec();
    other.add("extra", {3}, 4);
    optimizer_t<2, trident::full_precision> y(comm, other, adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, y, root / "step_00000002"), doctest::Contains("has no tensor 'extra'"), trident::usage_error);
    // Not a broken checkpoint to go past: load_latest must not start this model afresh.
    CHECK_THROWS_WITH_AS(ck::load_latest(comm, y, root), doctest::Contains("has no tensor 'extra'"), trident::usage_error);
    // A tensor of another shape, and a model that lacks one of the checkpoint's tensors.
    trident::model_spec wider;
    wider.add("embed", {37, 9}, 0).add("w1", {8, 24}, 1).add("b1", {24}, 1).add("w2", {24, 8}, 2).add("ln", {8}, 3);
    optimizer_t<2, trident::full_precision> w(comm, wider, adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, w, root / "step_00000002"), doctest::Contains("tensor 'embed' is 37,8"), trident::usage_error);
    trident::model_spec fewer;
    fewer.add("embed", {37, 8}, 0).add("w1", {8, 24}, 1).add("b1", {24}, 1).add("w2", {24, 8}, 2);
    optimizer_t<2, trident::full_precision> f(comm, fewer, adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, f, root / "step_00000002"), doctest::Contains("holds tensors that no rank's model has: ln"),
                         trident::usage_error);
  });
  // A rank file the MANIFEST lists but the disk lacks: corrupt (it was an I/O error that
  // load_latest passed on instead of going past the checkpoint).
  fs::remove(root / "step_00000002" / "rank_00001.safetensors");
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<2, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, z, root / "step_00000002"), doctest::Contains("rank_00001.safetensors is missing"),
                         ck::corrupt_checkpoint);
    std::vector<std::string> skipped;
    CHECK(!ck::load_latest(comm, z, root, &skipped).has_value());  // 4 corrupt, 3 incomplete, 2 missing a file
    CHECK(skipped.size() == 2);
  });
  fs::remove_all(root.parent_path());
}

// A load reads each header before the file's checksum is known (the checksum is computed as
// the pieces are read): damage that still parses, here a shape changed alike in every file,
// must be reported as corruption (load_latest goes on past it), not as another model.
TEST_CASE("checkpoint: a damaged header that looks like another model is reported as corrupt") {
  const auto root = fresh_dir("damaged_header");
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<1, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    initialise(z);
    ck::save(comm, z, root, 1);
  });
  for (const char* name : {"rank_00000.safetensors", "rank_00001.safetensors"}) {
    const auto f = root / "step_00000001" / name;
    auto b = bytes_of(f);
    const std::string shape = "\\t8,24\\t";  // w1's global shape in the tensor list (JSON escapes the tabs)
    const auto at = std::search(b.begin(), b.end(), shape.begin(), shape.end());
    REQUIRE(at != b.end());
    at[2] = '9';
    std::ofstream(f, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
  }
  local_world::run(2, [&](local_comm& comm) {
    optimizer_t<1, trident::full_precision> z(comm, toy_spec(), adamw(), options());
    CHECK_THROWS_WITH_AS(ck::load(comm, z, root / "step_00000001"), doctest::Contains("is corrupt"), ck::corrupt_checkpoint);
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
    // At once, while the background thread is (likely) still starting its copy: these changes
    // must wait for it (hold_state), or the files would hold them.
    const auto spec = toy_spec();
    for (const auto& t : spec.tensors()) z.set_parameter(t.name, std::vector<float>(t.numel, 7.0f));
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

// The parsers of what a checkpoint directory holds besides safetensors headers (those are
// fuzzed in test_safetensors.cpp): the MANIFEST, each file's tensor list and the piece keys.
// A seeded mutation loop from valid inputs (bytes flipped, replaced by the characters that
// matter, inserted, deleted, lines duplicated, cut): every input is accepted with the rules
// holding, or rejected with a trident::error; never a crash (run under ASan and UBSan in CI).
// TRIDENT_FUZZ_INPUTS (default 30000 per parser) and TRIDENT_FUZZ_SEED for longer runs.
TEST_CASE("checkpoint: the manifest, tensor-list and piece-key parsers survive mutated input") {
  auto env_or = [](const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
  };
  const std::uint64_t inputs = env_or("TRIDENT_FUZZ_INPUTS", 30'000);
  std::uint64_t state = env_or("TRIDENT_FUZZ_SEED", 20261125);
  auto next = [&] {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const std::string alphabet("0123456789abcdefABCDEF\t\n ,-/@.x\r\0\xff", 34);
  auto mutate = [&](std::string s) {
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = s.empty() ? 0 : next() % (s.size() + 1);
      const char c = next() % 3 == 0 ? static_cast<char>(next() & 0xff) : alphabet[next() % alphabet.size()];
      switch (next() % 6) {
        case 0: if (at < s.size()) s[at] = c; break;
        case 1: s.insert(at, 1, c); break;
        case 2: if (at < s.size()) s.erase(at, 1 + next() % 4); break;
        case 3: s.resize(at); break;
        case 4: {  // a line repeated
          const auto b = s.rfind('\n', at == 0 ? 0 : at - 1), e2 = s.find('\n', at);
          const std::size_t from = b == std::string::npos ? 0 : b + 1;
          s.insert(from, s.substr(from, (e2 == std::string::npos ? s.size() : e2 + 1) - from));
          break;
        }
        default: s.insert(at, std::to_string(next() % 3 == 0 ? next() : next() % 40)); break;
      }
    }
    return s;
  };
  namespace d = ck::detail;
  const std::string manifest =
      "0123456789abcdef  index.json\nfedcba9876543210  rank_00000.safetensors\n00000000000000ff  rank_00001.safetensors\n";
  const std::string tensors = "embed\t1\t37,8\t0\t2\nw1\t0\t8,24\t1\t2\nln\t0\t8\t-\t1\nb\t0\t3,4,5\t-\t1\n";
  const std::string keys[] = {"parameters/h0.attn.qkv.weight@1024", "state0/w@0", "master/a/b@c@12"};
  std::uint64_t accepted[3] = {0, 0, 0}, rejected[3] = {0, 0, 0};
  for (std::uint64_t i = 0; i < inputs; ++i) {
    // MANIFEST
    const std::string m = i == 0 ? manifest : mutate(manifest);
    try {
      const auto files = d::parse_manifest(m, "MANIFEST");
      for (const auto& [f, h] : files) {
        (void)h;
        REQUIRE(!f.empty());
        REQUIRE(f.find('/') == std::string::npos);
        REQUIRE((f != "." && f != ".."));
      }
      ++accepted[0];
    } catch (const trident::error&) {
      ++rejected[0];
    }
    // A file's tensor list
    const std::string t = i == 0 ? tensors : mutate(tensors);
    try {
      std::map<std::string, d::saved_tensor> table;
      std::map<std::string, int> parts;
      d::parse_tensor_lines(t, "rank_00000.safetensors", "ckpt", table, parts);
      for (const auto& [name, s] : table) {
        const auto split = s.split();  // a valid sharding, or a usage_error (caught below)
        REQUIRE(split.numel() <= (std::size_t{1} << 48));
        REQUIRE(parts.at(name) < s.parts);
        REQUIRE((!s.axis || *s.axis < s.shape.size()));
      }
      ++accepted[1];
    } catch (const trident::error&) {
      ++rejected[1];
    }
    // A piece key (never throws: a key that is not ours is false)
    const std::string k = mutate(keys[i % 3]);
    std::string field, tensor;
    std::size_t begin = 0;
    if (d::parse_piece_key(k, field, tensor, begin)) {
      REQUIRE(d::piece_key(field, tensor, begin).size() <= k.size());
      REQUIRE(field.find('/') == std::string::npos);
      ++accepted[2];
    } else {
      ++rejected[2];
    }
  }
  MESSAGE("manifest ", accepted[0], " accepted / ", rejected[0], " rejected; tensor lists ", accepted[1], " / ", rejected[1],
          "; piece keys ", accepted[2], " / ", rejected[2]);
  for (int p = 0; p < 3; ++p) {  // the mutations reach both sides of every parser
    CHECK(accepted[p] > 0);
    CHECK(rejected[p] > 0);
  }
  // Hostile tensor lists, one by one.
  auto refuses = [&](const std::string& line, const char* why) {
    std::map<std::string, d::saved_tensor> table;
    std::map<std::string, int> parts;
    CAPTURE(line);
    CHECK_THROWS_WITH_AS(d::parse_tensor_lines(line, "f", "ckpt", table, parts), doctest::Contains(why), ck::corrupt_checkpoint);
  };
  refuses("w\t0\t4294967296,4294967296\t0\t2\n", "too large");
  refuses("w\t0\t0,3\t0\t1\n", "too large");  // an empty dimension
  refuses("w\t2\t4,3\t0\t2\n", "not one of the parts");
  refuses("w\t0\t4,3\t2\t2\n", "not an axis");
  refuses("w\t0\t4,3\t-\t2\n", "not split has one part");
  refuses("w\t0\t4,3\t0\t0\n", "out of range");
  refuses("w\t0\t-4,3\t0\t1\n", "is not a count");
  refuses("w\t0\t4,3\t0\n", "tab-separated");
  refuses("w\t0\t4,3\t0\t2\nw\t1\t4,3\t0\t2\n", "listed twice");
  refuses("w\t0\t4,3\t0\t99999999999999999999\n", "is not a count");
}
