// Token shards in llm.c's format: the bytes on disk, reading back both widths, each rank's
// slice of a global batch (d ranks read what one rank with d x B rows reads), shards in turn
// and epochs, resuming from a position, and bad files named.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/data/token_shards.hpp"

namespace data = trident::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test case, removed afterwards.
struct scratch {
  fs::path dir;
  explicit scratch(const std::string& name) : dir(fs::temp_directory_path() / ("trident-shards-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& f) const { return (dir / f).string(); }
};

std::vector<std::uint32_t> iota_tokens(std::size_t n, std::uint32_t first = 0) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<std::uint32_t>(i);
  return t;
}

std::vector<unsigned char> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void expect_error(const std::string& what_contains, auto&& f) {
  try {
    f();
    FAIL("no error; expected one saying: ", what_contains);
  } catch (const trident::usage_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(what_contains) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("token shards: the bytes are llm.c's (256 little-endian int32 header, then the tokens)") {
  scratch s("bytes");
  data::write_shard(s / "a.bin", iota_tokens(3, 0x0102), data::token_format::gpt2);
  const auto b = bytes_of(s / "a.bin");
  REQUIRE(b.size() == 1024 + 3 * 2);
  // 20240520 = 0x0134D888, version 1, 3 tokens; the rest of the header zero.
  CHECK(std::vector<unsigned char>(b.begin(), b.begin() + 12) ==
        std::vector<unsigned char>{0x88, 0xD8, 0x34, 0x01, 1, 0, 0, 0, 3, 0, 0, 0});
  for (std::size_t i = 12; i < 1024; ++i) CHECK(b[i] == 0);
  CHECK(std::vector<unsigned char>(b.begin() + 1024, b.end()) == std::vector<unsigned char>{0x02, 0x01, 0x03, 0x01, 0x04, 0x01});

  data::write_shard(s / "l.bin", iota_tokens(2, 0x01020304), data::token_format::llama3);
  const auto l = bytes_of(s / "l.bin");
  REQUIRE(l.size() == 1024 + 2 * 4);
  // 20240801 = 0x0134D9A1, version 7.
  CHECK(std::vector<unsigned char>(l.begin(), l.begin() + 8) == std::vector<unsigned char>{0xA1, 0xD9, 0x34, 0x01, 7, 0, 0, 0});
  CHECK(std::vector<unsigned char>(l.begin() + 1024, l.begin() + 1028) == std::vector<unsigned char>{0x04, 0x03, 0x02, 0x01});

  const auto info = data::inspect_shard(s / "l.bin");
  CHECK(info.format == data::token_format::llama3);
  CHECK(info.tokens == 2);
}

TEST_CASE("token shards: d ranks with B rows read exactly what one rank with d x B rows reads, batch after batch") {
  scratch s("slices");
  const std::size_t B = 2, T = 5;
  data::write_shard(s / "train_000.bin", iota_tokens(200, 1000), data::token_format::gpt2);
  data::write_shard(s / "train_001.bin", iota_tokens(150, 5000), data::token_format::llama3);
  const auto files = data::find_shards(s / "train_*.bin");
  REQUIRE(files.size() == 2);
  for (int d : {1, 2, 3}) {
    CAPTURE(d);
    data::shard_loader whole(files, B * static_cast<std::size_t>(d), T, 0, 1);
    std::vector<data::shard_loader> ranks;
    for (int r = 0; r < d; ++r) ranks.emplace_back(files, B, T, r, d);
    // 199 / (d B T) batches in the first shard, 149 / (d B T) in the second, then the first again.
    const std::size_t steps = whole.batches_in(0) + whole.batches_in(1) + 2;
    for (std::size_t step = 0; step < steps; ++step) {
      const auto want = whole.next();
      std::vector<std::int32_t> inputs, targets;
      for (auto& r : ranks) {
        const auto got = r.next();
        REQUIRE(got.inputs.size() == B * T);
        inputs.insert(inputs.end(), got.inputs.begin(), got.inputs.end());
        targets.insert(targets.end(), got.targets.begin(), got.targets.end());
      }
      CHECK(inputs == want.inputs);
      CHECK(targets == want.targets);
      for (std::size_t i = 0; i < want.inputs.size(); ++i) CHECK(want.targets[i] == want.inputs[i] + 1);
    }
  }
  // The first batch of rank 1 of 2 starts B T tokens in; the second shard starts after
  // floor(199 / 20) = 9 global batches; after its 7, the first shard again.
  data::shard_loader r1(files, B, T, 1, 2);
  CHECK(r1.next().inputs.front() == 1000 + static_cast<std::int32_t>(B * T));
  CHECK(r1.batches_in(0) == 9);
  CHECK(r1.batches_in(1) == 7);
  r1.seek({1, 0});
  CHECK(r1.next().inputs.front() == 5000 + static_cast<std::int32_t>(B * T));
  r1.seek({1, 6});
  r1.next();
  CHECK(r1.position() == data::loader_position{0, 0});
}

TEST_CASE("token shards: a position saved and restored continues the same stream") {
  scratch s("resume");
  data::write_shard(s / "t.bin", iota_tokens(500), data::token_format::gpt2);
  data::shard_loader a({s / "t.bin"}, 3, 4, 0, 2);
  for (int i = 0; i < 5; ++i) a.next();
  const auto saved = a.position();
  const auto next = a.next();
  data::shard_loader b({s / "t.bin"}, 3, 4, 0, 2);
  b.seek(saved);
  CHECK(b.next().inputs == next.inputs);
  expect_error("outside the 1 shards", [&] { b.seek({3, 0}); });
}

TEST_CASE("token shards: bad files and arguments are usage errors naming the file and what was expected") {
  scratch s("bad");
  data::write_shard(s / "good.bin", iota_tokens(100), data::token_format::gpt2);
  const auto good = bytes_of(s / "good.bin");
  auto write_bytes = [&](const std::string& name, std::vector<unsigned char> b) {
    std::ofstream(s / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return s / name;
  };
  auto wrong_magic = good;
  wrong_magic[0] ^= 0xFF;
  expect_error("magic number", [&] { data::inspect_shard(write_bytes("magic.bin", wrong_magic)); });
  auto wrong_version = good;
  wrong_version[4] = 2;
  expect_error("version 2 with magic 20240520; expected version 1", [&] { data::inspect_shard(write_bytes("version.bin", wrong_version)); });
  auto truncated = good;
  truncated.resize(good.size() - 3);
  expect_error("1221 bytes, but its header announces 100 tokens, which take 1224 bytes with the header (truncated)",
               [&] { data::inspect_shard(write_bytes("truncated.bin", truncated)); });
  expect_error("shorter than the 1024-byte header", [&] { data::inspect_shard(write_bytes("tiny.bin", {1, 2, 3})); });
  expect_error("cannot open it", [&] { data::inspect_shard(s / "missing.bin"); });
  expect_error("no file matches", [&] { data::find_shards(s / "nothing_*.bin"); });
  expect_error("holds 100 tokens; a global batch of 4 ranks x B = 5 x T = 5 needs 101",
               [&] { data::shard_loader({s / "good.bin"}, 5, 5, 0, 4); });
  // ranks x B x T beyond 64 bits once wrapped to 0 tokens, passed the size check and divided by zero
  expect_error("overflows a 64-bit count", [&] { data::shard_loader({s / "good.bin"}, std::size_t{1} << 62, 4, 0, 4); });
  expect_error("overflows a 64-bit count", [&] { data::shard_loader({s / "good.bin"}, std::size_t{1} << 32, std::size_t{1} << 32, 0, 1); });
  expect_error("expected 0 <= rank < ranks", [&] { data::shard_loader({s / "good.bin"}, 1, 1, 2, 2); });
  expect_error("expected both at least 1", [&] { data::shard_loader({s / "good.bin"}, 0, 1, 0, 1); });
  const std::vector<std::uint32_t> wide{70000};
  expect_error("does not fit the GPT-2 format's uint16", [&] { data::write_shard(s / "wide.bin", wide, data::token_format::gpt2); });
}

TEST_CASE("token shards: scripts/prepare_data.py writes shards that read back as the text's bytes (byte-level tokens)") {
  scratch s("prepare");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "In the beginning was the shard, line " + std::to_string(i) + ".\n";
  std::ofstream(s / "tiny.txt", std::ios::binary) << text;
  const std::string command = std::string("python3 '") + TRIDENT_SOURCE_DIR + "/scripts/prepare_data.py' --text '" + (s / "tiny.txt") +
                              "' --out '" + s.dir.string() + "' --val-fraction 0.1 > /dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  const auto train = data::inspect_shard(s / "tiny_train.bin"), val = data::inspect_shard(s / "tiny_val.bin");
  CHECK(train.format == data::token_format::gpt2);
  CHECK(train.tokens + val.tokens == text.size());
  CHECK(val.tokens == text.size() / 10);
  // One rank, one row as long as the whole training shard (minus the last target).
  data::shard_loader loader({s / "tiny_train.bin"}, 1, train.tokens - 1, 0, 1);
  const auto batch = loader.next();
  for (std::size_t i = 0; i < batch.inputs.size(); ++i) {
    CHECK(batch.inputs[i] == static_cast<unsigned char>(text[i]));
    CHECK(batch.targets[i] == static_cast<unsigned char>(text[i + 1]));
  }
  // Bad arguments are named.
  CHECK(std::system(("python3 '" + std::string(TRIDENT_SOURCE_DIR) + "/scripts/prepare_data.py' --text '" + (s / "missing.txt") +
                     "' --out '" + s.dir.string() + "' 2> /dev/null").c_str()) != 0);
}
