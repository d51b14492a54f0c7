// The safetensors layer: every dtype round-trips through a file, the bytes are the reference
// writer's bytes, ranges read back, every class of hostile header is rejected naming its
// problem, a file cut at any byte is rejected, and a seeded mutation fuzz (the sanitizer build
// runs it too) finds no crash, no foreign exception and no accepted header that breaks the rules.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "trident/checkpoint/safetensors.hpp"

namespace ck = trident::checkpoint;
namespace fs = std::filesystem;
using trident::bf16;
using trident::dtype;
using trident::fp16;

namespace {

// A fresh directory per test case, removed afterwards.
struct scratch {
  fs::path dir;
  explicit scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("trident-safetensors-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() { fs::remove_all(dir); }
  fs::path operator/(const std::string& f) const { return dir / f; }
};

std::vector<std::byte> bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void put(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> from_hex(std::string_view hex) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

std::vector<std::byte> with_length(std::string_view json, std::size_t data_bytes, std::uint64_t n) {
  std::vector<std::byte> f(8 + json.size() + data_bytes, std::byte{0x5a});
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  if (!json.empty()) std::memcpy(f.data() + 8, json.data(), json.size());
  return f;
}

std::vector<std::byte> file_of(std::string_view json, std::size_t data_bytes) {
  return with_length(json, data_bytes, json.size());
}

template <class T>
bool same_bytes(std::span<const T> a, std::span<const T> b) {
  // memcmp must not see the null pointer of an empty vector, even for 0 bytes.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// True when parsing throws a format_error whose message contains `part` (the message is shown
// on failure).
template <class F>
bool rejects(F&& parse, const std::string& part) {
  try {
    parse();
  } catch (const ck::format_error& e) {
    const std::string message = e.what();
    INFO("message: ", message);
    const bool named = message.find(part) != std::string::npos;
    CHECK_MESSAGE(named, "the message should contain: ", part);
    return named;
  }
  MESSAGE("accepted; expected a format_error saying: ", part);
  return false;
}

bool header_rejected(const std::string& json, std::uint64_t data_bytes, const std::string& part) {
  INFO("header: ", json.substr(0, 200));
  return rejects([&] { (void)ck::parse_safetensors_header(json, data_bytes, "test header"); }, part);
}

bool file_rejected(std::span<const std::byte> file, const std::string& part) {
  return rejects([&] { (void)ck::parse_safetensors(file, "test bytes"); }, part);
}

template <class T>
std::vector<T> values(std::initializer_list<T> v) {
  return std::vector<T>(v);
}

// What every accepted header must satisfy, whatever produced it.
void check_invariants(const ck::safetensors_header& h, std::uint64_t data_bytes) {
  std::uint64_t covered = 0;
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    REQUIRE(t.begin == covered);  // sorted, contiguous, starting at 0
    REQUIRE(t.end >= t.begin);
    const auto bytes = ck::detail::tensor_bytes(t.type, t.shape);
    REQUIRE(bytes.has_value());
    REQUIRE(*bytes == t.bytes());
    REQUIRE(names.insert(t.name).second);
    REQUIRE(t.name != "__metadata__");
    REQUIRE(ck::detail::invalid_utf8_at(t.name) == ck::detail::no_error);
    covered = t.end;
  }
  REQUIRE(covered == data_bytes);
  REQUIRE(h.data_bytes() == data_bytes);
  for (const auto& [k, v] : h.metadata) {
    REQUIRE(ck::detail::invalid_utf8_at(k) == ck::detail::no_error);
    REQUIRE(ck::detail::invalid_utf8_at(v) == ck::detail::no_error);
  }
}

bool same_header(const ck::safetensors_header& a, const ck::safetensors_header& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.type != y.type || x.shape != y.shape || x.begin != y.begin || x.end != y.end)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("safetensors: every dtype, scalars, empty tensors and metadata round-trip through a file") {
  scratch s("roundtrip");
  const auto f32 =
      values<float>({1.5f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                     std::numeric_limits<float>::denorm_min(), 3.25e38f});
  const auto f64 = values<double>({-1e300, 2.5, std::numeric_limits<double>::lowest(), 0.1});
  const std::vector<fp16> f16 = {fp16(1.0f), fp16(-65504.0f), fp16::from_bits(0x7e01), fp16::from_bits(0x0001)};
  const std::vector<bf16> b16 = {bf16(1.0f),       bf16(-3.0e38f), bf16::from_bits(0x7fc1),
                                 bf16(0.0078125f), bf16(5.0f),     bf16(-2.0f)};
  const auto i8 = values<std::int8_t>({-128, -1, 0, 127});
  const auto u8 = values<std::uint8_t>({0, 1, 254, 255, 7});
  const auto i32 = values<std::int32_t>({std::numeric_limits<std::int32_t>::min(), -7, 0x12345678});
  const auto u32 = values<std::uint32_t>({0xffffffffu, 0, 0x80000000u, 1});
  const auto i64 = values<std::int64_t>({std::numeric_limits<std::int64_t>::min(), -1, 0x0123456789abcdefll});
  const auto u64 = values<std::uint64_t>({~0ull, 0, 1ull << 63});
  const float scalar = 42.0f;

  ck::safetensors_writer w;
  w.add("f64", {2, 2}, std::span(f64));
  w.add("f32", {2, 3}, std::span(f32));
  w.add("scalar", {}, std::span(&scalar, 1));
  w.add("empty", {0}, std::span<const float>());
  w.add("f16", {4}, std::span(f16));
  w.add("bf16", {3, 2}, std::span(b16));
  w.add("empty3d", {3, 0, 2}, std::span<const bf16>());
  w.add("i8", {4}, std::span(i8));
  w.add("u8", {5}, std::span(u8));  // 5 bytes: what follows is not 4-aligned, which the format allows
  w.add("i32", {3}, std::span(i32));
  w.add("u32", {2, 2}, std::span(u32));
  w.add("i64", {3}, std::span(i64));
  w.add("u64", {1, 3, 1}, std::span(u64));
  w.add("raw", dtype::uint8, {2}, std::as_bytes(std::span(u8).first(2)));
  w.set_metadata("format", "pt");
  w.set_metadata("step", "1200");
  w.set_metadata("escapes \"\\\n\t\x01", "unicode \xc3\xa9\xe2\x88\x91\xf0\x9f\x98\x80");
  w.set_metadata("step", "1201");  // the last value wins
  w.write(s / "all.safetensors");
  w.write(s / "nosync.safetensors", /*sync=*/false);

  CHECK(fs::file_size(s / "all.safetensors") == w.file_bytes());
  CHECK(bytes_of(s / "all.safetensors") == bytes_of(s / "nosync.safetensors"));
  CHECK(w.header_json().size() % 8 == 0);

  const ck::safetensors_file f(s / "all.safetensors");
  const auto& h = f.header();
  const auto added = w.entries();
  REQUIRE(h.tensors.size() == added.size());
  for (std::size_t i = 0; i < added.size(); ++i) {
    INFO("tensor ", added[i].name);
    CHECK(h.tensors[i].name == added[i].name);  // the file's order is the order added
    CHECK(h.tensors[i].type == added[i].type);
    CHECK(h.tensors[i].shape == added[i].shape);
    CHECK(h.tensors[i].begin == added[i].begin);
    CHECK(h.tensors[i].end == added[i].end);
  }
  CHECK(h.metadata.size() == 3);
  CHECK(h.metadata.at("step") == "1201");
  CHECK(h.metadata.at("escapes \"\\\n\t\x01") == "unicode \xc3\xa9\xe2\x88\x91\xf0\x9f\x98\x80");
  CHECK(f.data_offset() == 8 + w.header_json().size());
  CHECK(f.file_bytes() == w.file_bytes());
  CHECK(h.data_bytes() == f.file_bytes() - f.data_offset());
  CHECK(f.find("nope") == nullptr);
  CHECK(f.find("bf16")->type == dtype::bfloat16);
  CHECK(h.find("u64")->shape == std::vector<std::uint64_t>{1, 3, 1});

  // Typed reads: the bytes come back exactly (NaN payloads, -0 and subnormals included).
  auto back = [&]<class T>(const std::string& name, const std::vector<T>& expected) {
    std::vector<T> got(expected.size());
    f.read(name, std::span(got));
    return same_bytes(std::span<const T>(got), std::span<const T>(expected));
  };
  CHECK(back("f32", f32));
  CHECK(back("f64", f64));
  CHECK(back("f16", f16));
  CHECK(back("bf16", b16));
  CHECK(back("i8", i8));
  CHECK(back("u8", u8));
  CHECK(back("i32", i32));
  CHECK(back("u32", u32));
  CHECK(back("i64", i64));
  CHECK(back("u64", u64));
  CHECK(back("scalar", std::vector<float>{42.0f}));
  CHECK(back("empty", std::vector<float>{}));
  CHECK(back("empty3d", std::vector<bf16>{}));
  CHECK(back("raw", std::vector<std::uint8_t>{0, 1}));
  CHECK(h.find("empty")->bytes() == 0);
  CHECK(h.find("scalar")->shape.empty());

  // The same file parsed from memory.
  const auto memory = bytes_of(s / "all.safetensors");
  const auto v = ck::parse_safetensors(memory);
  CHECK(same_header(v.header, h));
  CHECK(v.data_offset == f.data_offset());
  const auto* i64_entry = v.header.find("i64");
  CHECK(same_bytes(v.data.subspan(i64_entry->begin, i64_entry->bytes()), std::as_bytes(std::span(i64))));
}

TEST_CASE("safetensors: ranges of a tensor read back, and misuse is a usage_error naming the tensor") {
  scratch s("ranges");
  std::vector<std::int32_t> ramp(1000);
  for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::int32_t>(i * 3 - 500);
  const std::vector<std::uint8_t> small = {9, 8, 7};
  ck::safetensors_writer w;
  w.add("small", {3}, std::span(small));
  w.add("ramp", {10, 100}, std::span(ramp));
  w.write(s / "r.safetensors");
  const ck::safetensors_file f(s / "r.safetensors");

  std::vector<std::int32_t> part(37);
  f.read_range("ramp", 250, std::span(part));  // elements, in the typed overload
  CHECK(std::equal(part.begin(), part.end(), ramp.begin() + 250));
  f.read_range("ramp", 1000 - 37, std::span(part));  // up to the last element
  CHECK(std::equal(part.begin(), part.end(), ramp.end() - 37));
  std::array<std::byte, 6> raw{};
  f.read_range("ramp", 2, std::span(raw));  // bytes, in the byte overload: straddles elements 0 and 1
  CHECK(std::memcmp(raw.data(), reinterpret_cast<const std::byte*>(ramp.data()) + 2, raw.size()) == 0);
  f.read_range("ramp", 4000, std::span(raw).first(0));  // empty at the very end is fine

  auto usage = [](auto&& call, const std::string& part_of_message) {
    try {
      call();
    } catch (const trident::usage_error& e) {
      INFO(e.what());
      return std::string(e.what()).find(part_of_message) != std::string::npos;
    }
    return false;
  };
  std::vector<float> floats(1000);
  CHECK(usage([&] { f.read("ramp", std::span(floats)); }, "is int32 (I32), read as float32"));
  std::vector<std::int32_t> wrong(999);
  CHECK(usage([&] { f.read("ramp", std::span(wrong)); }, "has 4000 bytes; the destination has 3996"));
  CHECK(usage([&] { f.read("missing", std::span(wrong)); }, "has no tensor 'missing'"));
  CHECK(usage([&] { f.read_range("ramp", 964, std::span(part)); }, "elements [964, 964 + 37)"));
  CHECK(usage([&] { f.read_range("ramp", ~0ull, std::span(part)); }, "which has 1000"));
  CHECK(usage([&] { f.read_range("small", 1, std::span(raw)); }, "which has 3 bytes"));
  CHECK(usage([&] { f.read_range("small", ~0ull - 2, std::span(raw)); }, "which has 3 bytes"));

  ck::safetensors_writer bad;
  bad.add("x", {2}, std::span(small).first(2));
  CHECK(usage([&] { bad.add("x", {1}, std::span(small).first(1)); }, "was added already"));
  CHECK(usage([&] { bad.add("y", {4}, std::span(small)); }, "needs 4 bytes, got 3"));
  CHECK(usage([&] { bad.add("__metadata__", {3}, std::span(small)); }, "reserved"));
  CHECK(usage([&] { bad.add("big", {1ull << 32, 1ull << 32}, std::span(small)); }, "overflows 64 bits"));
  CHECK(usage([&] { bad.add("bad\xff", {3}, std::span(small)); }, "not valid UTF-8"));
  CHECK(usage([&] { bad.set_metadata("k", "\xc0\xaf"); }, "not valid UTF-8"));

  // The OS's refusals name the path and strerror.
  try {
    bad.write(s / "no-such-dir" / "x.safetensors");
    FAIL("wrote into a missing directory");
  } catch (const ck::io_error& e) {
    CHECK(e.status() == ENOENT);
    CHECK(std::string(e.what()).find("no-such-dir/x.safetensors': cannot create it (No such file or directory)") !=
          std::string::npos);
  }
  CHECK_THROWS_AS(ck::safetensors_file(s / "absent.safetensors"), ck::io_error);
  CHECK(rejects([&] { ck::safetensors_file d(s.dir); }, "not a regular file"));

  // A file cut short after it was opened: the read says so instead of returning garbage.
  ck::safetensors_file opened(s / "r.safetensors");
  fs::resize_file(s / "r.safetensors", opened.data_offset() + 100);
  CHECK(rejects([&] { opened.read("ramp", std::span(ramp)); }, "was it truncated after it was opened?"));
}

TEST_CASE("safetensors: the bytes are those the reference writes for the same tensors") {
  // From safetensors 0.8.0 (Python, numpy):
  //   save({'a': np.array([1.0, -2.0], np.float32), 's': np.array(1.5, np.float16),
  //         'b': np.array([1, 2, 3], np.uint8), 'q"\\\n\x01é': np.zeros((0,), np.int64)},
  //        metadata={'format': 'pt'}).hex()
  // The reference orders tensors by dtype alignment, then by name (I64, F32, F16, U8 here); we
  // write in the order added, so adding them in that order must give the same bytes.
  const auto reference = from_hex(
      "08010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c22715c225c5c5c6e5c7530303031"
      "c3a9223a7b226474797065223a22493634222c227368617065223a5b305d2c22646174615f6f666673657473223a5b302c305d7d2c22"
      "61223a7b226474797065223a22463332222c227368617065223a5b325d2c22646174615f6f666673657473223a5b302c385d7d2c2273"
      "223a7b226474797065223a22463136222c227368617065223a5b5d2c22646174615f6f666673657473223a5b382c31305d7d2c226222"
      "3a7b226474797065223a225538222c227368617065223a5b335d2c22646174615f6f666673657473223a5b31302c31335d7d7d202020"
      "20200000803f000000c0003e010203");
  const std::vector<float> a = {1.0f, -2.0f};
  const fp16 half(1.5f);
  const std::vector<std::uint8_t> b = {1, 2, 3};
  ck::safetensors_writer w;
  w.add("q\"\\\n\x01\xc3\xa9", {0}, std::span<const std::int64_t>());
  w.add("a", {2}, std::span(a));
  w.add("s", {}, std::span(&half, 1));
  w.add("b", {3}, std::span(b));
  w.set_metadata("format", "pt");
  scratch s("reference");
  w.write(s / "ours.safetensors");
  const auto ours = bytes_of(s / "ours.safetensors");
  CHECK(ours == reference);

  // The rules behind those bytes, spelled out: the length field, the padding, the data.
  REQUIRE(ours.size() == 285);
  CHECK(ck::detail::little_endian_u64(ours.data()) == 264);  // 259 bytes of JSON, padded to 264
  const std::string json(reinterpret_cast<const char*>(ours.data()) + 8, 264);
  CHECK(json.substr(259) == "     ");
  CHECK(json.starts_with("{\"__metadata__\":{\"format\":\"pt\"},\"q\\\"\\\\\\n\\u0001\xc3\xa9\":{\"dtype\":\"I64\""));
  CHECK(json.find("\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}") != std::string::npos);
  CHECK(json.find("\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[8,10]}") != std::string::npos);
  CHECK(std::vector<std::byte>(ours.begin() + 272, ours.end()) == from_hex("0000803f000000c0003e010203"));
  CHECK(w.file_bytes() == 285);

  // And the header padding for every JSON length modulo 8.
  for (std::size_t len = 0; len < 16; ++len) {
    ck::safetensors_writer p;
    p.add(std::string(len, 'n'), {0}, std::span<const float>());
    const auto text = p.header_json();
    CHECK(text.size() % 8 == 0);
    CHECK(text.find_last_not_of(' ') + 1 > text.size() - 8);  // less than 8 spaces of padding
    CHECK(same_header(ck::parse_safetensors_header(text, 0),
                      ck::parse_safetensors_header(text.substr(0, text.find_last_not_of(' ') + 1), 0)));
  }
}

TEST_CASE("safetensors: every kind of hostile header is rejected, naming the problem") {
  const std::string a4 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  auto one = [](const std::string& fields) { return "{\"a\":{" + fields + "}}"; };

  // JSON structure.
  CHECK(header_rejected("[1,2]", 0, "the header must be a JSON object; found '['"));
  CHECK(header_rejected("", 0, "the header must be a JSON object; found the end of the header"));
  CHECK(header_rejected("{\"a\" {}}", 0, "expected ':' after the name 'a'"));
  CHECK(header_rejected("{" + a4 + "} x", 4, "trailing characters after the header's JSON object"));
  CHECK(header_rejected("{" + a4 + std::string("}\0", 2), 4, "trailing characters"));
  CHECK(header_rejected("{" + a4 + ",}", 4, "expected a string for a tensor name; found '}'"));
  CHECK(header_rejected("{\"a\":null}", 0, "tensor 'a' must be an object"));
  CHECK(header_rejected("{\"a\":\"x", 0, "tensor 'a' must be an object"));
  CHECK(header_rejected("{\"a", 0, "unterminated string in a tensor name"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,4])"), 4,
                        "expected a non-negative integer in the shape of tensor 'a'; found '['"));
  // Nesting a million deep costs nothing: the parser is not recursive, the grammar has depth 3.
  CHECK(header_rejected("{\"a\":" + std::string(1'000'000, '{'), 0, "expected a string for a field name; found '{'"));
  CHECK(
      header_rejected("{\"a\":{\"shape\":" + std::string(1'000'000, '[') + "}}", 0, "expected a non-negative integer"));

  // Numbers.
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1.0],"data_offsets":[0,4])"), 4,
                        "a fraction or an exponent in the shape"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1e0],"data_offsets":[0,4])"), 4, "a fraction or an exponent"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])"), 4,
                        "a negative number in the shape of tensor 'a'"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])"), 4,
                        "a negative number in the data_offsets"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4.0])"), 4,
                        "a fraction or an exponent in the data_offsets"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4])"), 4,
                        "larger than 2^64 - 1"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[01],"data_offsets":[0,4])"), 4, "leading zero"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4,8])"), 4,
                        "must be [begin, end]: more than 2"));
  CHECK(
      header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[4])"), 4, "must be [begin, end]: 1 integer(s)"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":1,"data_offsets":[0,4])"), 4,
                        "the shape of tensor 'a' must be an array"));
  // A huge array of offsets stops at the third element; a huge shape of ones is legal.
  std::string many = "0";
  for (int i = 0; i < 200'000; ++i) many += ",0";
  CHECK(header_rejected(one(R"("dtype":"U8","shape":[0],"data_offsets":[)" + many + "])"), 0, "more than 2 integers"));
  std::string ones = "1";
  for (int i = 0; i < 200'000; ++i) ones += ",1";
  CHECK(ck::parse_safetensors_header(one(R"("dtype":"U8","shape":[)" + ones + R"(],"data_offsets":[0,1])"), 1)
            .tensors[0]
            .shape.size() == 200'001);

  // Fields and types.
  CHECK(header_rejected(one(R"("dtype":"I16","shape":[1],"data_offsets":[0,2])"), 2,
                        "unknown dtype 'I16' of tensor 'a'"));
  CHECK(header_rejected(one(R"("dtype":"Q4_K\n","shape":[1],"data_offsets":[0,2])"), 2, "unknown dtype 'Q4_K\\x0a'"));
  CHECK(header_rejected(one(R"("dtype":32,"shape":[1],"data_offsets":[0,4])"), 4, "expected a string for a dtype"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1])"), 4, "tensor 'a' has no \"data_offsets\""));
  CHECK(header_rejected(one(R"("shape":[1],"data_offsets":[0,4])"), 4, "tensor 'a' has no \"dtype\""));
  CHECK(header_rejected(one(""), 0, "has no \"dtype\""));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1)"), 4,
                        "an unknown field 'extra' in tensor 'a'"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"shape":[1],"data_offsets":[0,4])"), 4,
                        "the field 'shape' appears twice"));
  CHECK(header_rejected("{" + a4 + "," + a4 + "}", 4, "the tensor name 'a' appears twice"));
  CHECK(header_rejected(R"({"__metadata__":{},"__metadata__":{}})", 0, "\"__metadata__\" appears twice"));
  CHECK(header_rejected(R"({"__metadata__":{"k":"1","k":"2"}})", 0, "a metadata key appears twice"));
  CHECK(header_rejected(R"({"__metadata__":{"k":1}})", 0, "the metadata value of 'k' must be a string"));
  CHECK(header_rejected(R"({"__metadata__":{"k":{"x":"y"}}})", 0, "the metadata value of 'k' must be a string"));
  CHECK(header_rejected(R"({"__metadata__":["k"]})", 0, "\"__metadata__\" must be an object of strings"));

  // Strings and encodings.
  CHECK(header_rejected("{\"a\xff\":{}}", 0, "not valid UTF-8 (at byte 3"));
  CHECK(header_rejected("{\"a\xc0\xaf\":{}}", 0, "not valid UTF-8"));          // overlong '/'
  CHECK(header_rejected("{\"a\xed\xa0\x80\":{}}", 0, "not valid UTF-8"));      // an encoded surrogate
  CHECK(header_rejected("{\"a\xf4\x90\x80\x80\":{}}", 0, "not valid UTF-8"));  // past U+10FFFF
  CHECK(header_rejected("{\"a\xe2\x88", 0, "not valid UTF-8"));                // cut inside a character
  CHECK(header_rejected(R"({"\ud800":{}})", 0, "a high surrogate \\u escape not followed by a low one"));
  CHECK(header_rejected(R"({"\ud800\u0041":{}})", 0, "not followed by a low one"));
  CHECK(header_rejected(R"({"\udc00":{}})", 0, "a lone low surrogate"));
  CHECK(header_rejected(R"({"\u12":{}})", 0, "needs 4 hexadecimal digits"));
  CHECK(header_rejected(R"({"\x41":{}})", 0, "an invalid escape in a tensor name"));
  CHECK(header_rejected("{\"a\tb\":{}}", 0, "an unescaped control character (byte 0x09)"));
  // Escapes that are legal decode to the name they stand for.
  const auto escaped = ck::parse_safetensors_header(
      R"({"\u00e9\ud83d\ude00\/\"\\\b\f\n\r\t":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})", 1);
  CHECK(escaped.tensors[0].name == "\xc3\xa9\xf0\x9f\x98\x80/\"\\\b\f\n\r\t");

  // Sizes and offsets.
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), 8,
                        "tensor 'a' has data_offsets [0, 8], 8 bytes, but its shape [3] of F32 needs 12 bytes"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0])"), 0,
                        "overflows 64 bits"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0])"), 0,
                        "overflows 64 bits"));
  // Folded left as the reference folds it: a zero after an overflow does not save the product.
  CHECK(header_rejected(one(R"("dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0])"), 0,
                        "overflows 64 bits"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), 4,
                        "past the end of the 4-byte data section"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615])"),
                        4, "needs 4 bytes"));
  CHECK(header_rejected(one(R"("dtype":"F32","shape":[0],"data_offsets":[8,4])"), 8, "end before they begin"));
  CHECK(header_rejected(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"));
  CHECK(header_rejected(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      12, "bytes [4, 8) of the data section belong to no tensor (a gap before 'b')"));
  CHECK(header_rejected(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
                        "bytes [0, 4) of the data section"));
  CHECK(header_rejected("{" + a4 + "}", 8, "the tensors cover 4 bytes but the data section has 8 (4 trailing bytes"));
  CHECK(header_rejected("{}", 1, "the tensors cover 0 bytes"));
  // An empty tensor inside another one's bytes is an overlap, as in the reference.
  CHECK(header_rejected(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
      8, "overlap"));
  // ... while at either end of one it is legal, in any order in the JSON.
  const auto ends = ck::parse_safetensors_header(
      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("e":{"dtype":"I8","shape":[0,5],"data_offsets":[0,0]}})",
      8);
  REQUIRE(ends.tensors.size() == 3);
  CHECK(ends.tensors[0].name == "e");
  CHECK(ends.tensors[1].name == "a");
  CHECK(ends.tensors[2].name == "z");

  // The file around the header.
  CHECK(file_rejected(from_hex("0800000000"), "5 bytes, shorter than the 8-byte header length field"));
  CHECK(file_rejected(with_length("{}", 0, 1ull << 63),
                      "says 9223372036854775808 bytes, more than the 100000000-byte limit"));
  CHECK(file_rejected(with_length("{}", 0, ~0ull), "more than the 100000000-byte limit"));
  CHECK(file_rejected(with_length("{}", 0, ck::max_header_bytes + 1), "more than the 100000000-byte limit"));
  CHECK(file_rejected(with_length("{}", 90, 1000), "says 1000 bytes, but only 92 bytes follow it"));
  CHECK(file_rejected(with_length("{}", 4, 4), "trailing characters"));  // the header takes some data
  CHECK(file_rejected(file_of("{" + a4 + "}", 2), "past the end of the 2-byte data section"));
  CHECK(ck::parse_safetensors(file_of("{" + a4 + "}", 4)).header.tensors.size() == 1);
}

TEST_CASE("safetensors: a file cut at any byte is rejected, from disk and from memory") {
  scratch s("truncated");
  const std::vector<float> a = {1, 2, 3};
  const std::vector<std::uint8_t> b = {4, 5};
  ck::safetensors_writer w;
  w.add("a", {3}, std::span(a));
  w.add("b", {2, 1}, std::span(b));
  w.set_metadata("k", "v");
  w.write(s / "whole.safetensors");
  const auto whole = bytes_of(s / "whole.safetensors");
  REQUIRE(whole.size() == w.file_bytes());
  int rejected_disk = 0, rejected_memory = 0;
  for (std::size_t cut = 0; cut < whole.size(); ++cut) {
    const auto prefix = std::span(whole).first(cut);
    put(s / "cut.safetensors", prefix);
    try {
      ck::safetensors_file f(s / "cut.safetensors");
    } catch (const ck::format_error&) {
      ++rejected_disk;
    }
    try {
      (void)ck::parse_safetensors(prefix);
    } catch (const ck::format_error&) {
      ++rejected_memory;
    }
  }
  CHECK(rejected_disk == static_cast<int>(whole.size()));
  CHECK(rejected_memory == static_cast<int>(whole.size()));
  // One byte too many is rejected too.
  auto longer = whole;
  longer.push_back(std::byte{0});
  CHECK(file_rejected(longer, "1 trailing bytes belong to no tensor"));
}

namespace {

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

// Valid files to start from: every dtype, metadata with escapes, empty tensors, no tensors.
std::vector<std::vector<std::byte>> fuzz_seeds(const scratch& s) {
  static const std::vector<double> d = {1, 2};
  static const std::vector<float> f = {1, 2, 3};
  static const std::vector<fp16> h = {fp16(1.0f)};
  static const std::vector<bf16> b = {bf16(2.0f), bf16(3.0f)};
  static const std::vector<std::int8_t> i8 = {1, -1, 3};
  static const std::vector<std::uint32_t> u32 = {7};
  static const std::vector<std::int64_t> i64 = {-5, 5};
  std::vector<std::vector<std::byte>> seeds;
  auto keep = [&](const ck::safetensors_writer& w) {
    w.write(s / "seed.safetensors", false);
    seeds.push_back(bytes_of(s / "seed.safetensors"));
  };
  {
    ck::safetensors_writer w;
    w.add("model.layers.0.weight", {2}, std::span(d));
    w.add("b", {3, 1}, std::span(f));
    w.add("h", {}, std::span(h));
    w.add("bf", {1, 2}, std::span(b));
    w.add("empty", {0, 4}, std::span<const float>());
    w.add("i8", {3}, std::span(i8));
    w.add("u32", {1}, std::span(u32));
    w.add("i64", {2}, std::span(i64));
    w.set_metadata("format", "pt");
    w.set_metadata("note", "tab\there \"quoted\" \xc3\xa9");
    keep(w);
  }
  {
    ck::safetensors_writer w;
    w.add("only", {3}, std::span(f));
    keep(w);
  }
  {
    ck::safetensors_writer w;
    w.add("e0", {0}, std::span<const std::int64_t>());
    w.add("\\u-looking \"name\"\n", {2, 0, 3}, std::span<const bf16>());
    w.set_metadata("", "");
    keep(w);
  }
  keep(ck::safetensors_writer{});
  return seeds;
}

}  // namespace

TEST_CASE("safetensors: seeded mutations never crash, throw only trident errors, and what is accepted is consistent") {
  scratch s("fuzz");
  const auto seeds = fuzz_seeds(s);
  // TRIDENT_FUZZ_INPUTS=10000000 for a long run; the default takes about 0.5 s (5 s under ASan).
  const std::uint64_t inputs = env_or("TRIDENT_FUZZ_INPUTS", 100'000);
  const std::uint64_t seed = env_or("TRIDENT_FUZZ_SEED", 20240611);
  std::mt19937_64 rng(seed);
  auto below = [&](std::size_t n) {
    return n == 0 ? std::size_t{0} : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };

  // Bytes and tokens that matter to the grammar, and numbers near the edges.
  const std::vector<std::string> tokens = {"{",
                                           "}",
                                           "[",
                                           "]",
                                           ",",
                                           ":",
                                           "\"",
                                           "\\",
                                           "\\u",
                                           "\\ud800",
                                           "\\udc00",
                                           "-",
                                           "0",
                                           "1",
                                           "8",
                                           ".5",
                                           "e9",
                                           " ",
                                           "\n",
                                           "\t",
                                           "\"__metadata__\":",
                                           "\"dtype\":\"F32\",",
                                           "\"shape\":[],",
                                           "\"data_offsets\":[0,0],",
                                           "null",
                                           "true",
                                           "\xff",
                                           "\xc3",
                                           "\xe2\x82\xac",
                                           "\xf0\x9f\x98\x80",
                                           std::string(1, '\0'),
                                           "{\"x\":{}}"};
  const std::vector<std::string> numbers = {"0",
                                            "1",
                                            "2",
                                            "3",
                                            "4",
                                            "7",
                                            "8",
                                            "16",
                                            "255",
                                            "65536",
                                            "4294967296",
                                            "4611686018427387904",
                                            "9223372036854775807",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "99999999999999999999999",
                                            "-1",
                                            "1.0",
                                            "1e3",
                                            "00"};

  auto mutate_text = [&](std::string& t) {
    const int ops = 1 + static_cast<int>(below(3));
    for (int op = 0; op < ops; ++op) {
      switch (below(9)) {
        case 0:  // flip a bit
          if (!t.empty()) t[below(t.size())] ^= static_cast<char>(1u << below(8));
          break;
        case 1:  // a random byte
          if (!t.empty()) t[below(t.size())] = static_cast<char>(below(256));
          break;
        case 2:  // insert a token
          t.insert(below(t.size() + 1), tokens[below(tokens.size())]);
          break;
        case 3: {  // delete a range
          if (t.empty()) break;
          const std::size_t at = below(t.size());
          t.erase(at, 1 + below(std::min<std::size_t>(16, t.size() - at)));
          break;
        }
        case 4:  // truncate
          t.resize(below(t.size() + 1));
          break;
        case 5: {  // replace a number (in a shape, an offset) with another
          std::vector<std::pair<std::size_t, std::size_t>> runs;
          for (std::size_t i = 0; i < t.size();) {
            if (t[i] >= '0' && t[i] <= '9') {
              std::size_t j = i;
              while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j;
              runs.emplace_back(i, j - i);
              i = j;
            } else {
              ++i;
            }
          }
          if (runs.empty()) break;
          if (runs.size() >= 2 && below(3) == 0) {  // swap two numbers: offsets that overlap or leave gaps
            auto x = runs[below(runs.size())], y = runs[below(runs.size())];
            if (x.first > y.first) std::swap(x, y);
            if (x.first == y.first) break;
            const std::string first = t.substr(x.first, x.second), second = t.substr(y.first, y.second);
            t.replace(y.first, y.second, first);
            t.replace(x.first, x.second, second);
            break;
          }
          const auto [at, len] = runs[below(runs.size())];
          std::string replacement = numbers[below(numbers.size())];
          if (below(2) == 0 && len < 19) {  // a neighbour of the current value
            const std::uint64_t v = std::stoull(t.substr(at, len));
            replacement =
                std::to_string(below(2) == 0 ? v + 1 + below(8) : v - std::min<std::uint64_t>(v, 1 + below(8)));
          }
          t.replace(at, len, replacement);
          break;
        }
        case 6: {  // copy a slice elsewhere (duplicates entries, keys, brackets)
          if (t.empty()) break;
          const std::size_t at = below(t.size());
          const std::string slice = t.substr(at, 1 + below(48));
          t.insert(below(t.size() + 1), slice);
          break;
        }
        case 7: {  // move a tensor's data: shift [begin, end] together, or take another tensor's pair
          struct pair_at {
            std::size_t at, len;
            std::uint64_t begin, end;
          };
          std::vector<pair_at> pairs;
          const std::string key = "\"data_offsets\":[";
          for (std::size_t k = t.find(key); k != std::string::npos; k = t.find(key, k + 1)) {
            const std::size_t b0 = k + key.size(), b1 = t.find_first_not_of("0123456789", b0);
            if (b1 == std::string::npos || b1 == b0 || b1 - b0 > 18 || t[b1] != ',') continue;
            const std::size_t e0 = b1 + 1, e1 = t.find_first_not_of("0123456789", e0);
            if (e1 == std::string::npos || e1 == e0 || e1 - e0 > 18 || t[e1] != ']') continue;
            pairs.push_back({b0, e1 - b0, std::stoull(t.substr(b0, b1 - b0)), std::stoull(t.substr(e0, e1 - e0))});
          }
          if (pairs.empty()) break;
          const auto& p = pairs[below(pairs.size())];
          std::uint64_t begin = p.begin, end = p.end;
          if (below(2) == 0) {
            const auto& other = pairs[below(pairs.size())];
            begin = other.begin;
            end = other.end;
          } else {
            const std::uint64_t d = 1 + below(8);
            if (below(2) == 0 || begin < d) begin += d, end += d;
            else begin -= d, end -= d;
          }
          t.replace(p.at, p.len, std::to_string(begin) + "," + std::to_string(end));
          break;
        }
        default: {  // swap two slices' positions by rotation
          if (t.size() < 2) break;
          std::size_t a = below(t.size()), b = below(t.size());
          if (a > b) std::swap(a, b);
          std::rotate(t.begin() + static_cast<std::ptrdiff_t>(a),
                      t.begin() + static_cast<std::ptrdiff_t>(a + (b - a) / 2),
                      t.begin() + static_cast<std::ptrdiff_t>(b));
          break;
        }
      }
    }
  };

  std::uint64_t accepted = 0, rejected = 0, reread = 0;
  // Which checks rejected inputs: the message's first words, names and numbers aside.
  std::map<std::string, std::uint64_t> reasons;
  auto reason_of = [](const std::string& message) {
    std::string r;
    char quote = 0;
    for (std::size_t i = message.find(": ") + 2; i < message.size() && r.size() < 48; ++i) {
      const char c = message[i];
      if (quote != 0) {
        if (c == quote && (i + 1 == message.size() || message[i + 1] == ' ' || message[i + 1] == ';')) quote = 0;
      } else if ((c == '\'' || c == '"') && (i == 0 || message[i - 1] == ' ')) {
        quote = c;
        r += "_";
      } else if (c == '(' || c == ';') {
        break;
      } else if (c < '0' || c > '9') {
        r += c;
      }
    }
    return r;
  };
  std::vector<std::byte> file;
  std::string text;
  for (std::uint64_t input = 0; input < inputs; ++input) {
    const auto& base = seeds[below(seeds.size())];
    const std::uint64_t n = ck::detail::little_endian_u64(base.data());
    const std::string json(reinterpret_cast<const char*>(base.data()) + 8, n);
    const std::uint64_t data_bytes = base.size() - 8 - n;
    const bool header_level = below(3) != 0;
    INFO("input ", input, " (seed ", seed, ")");
    try {
      if (header_level) {
        // The header alone, with the length field kept right, so that the mutation reaches the parser.
        text = json;
        mutate_text(text);
        std::uint64_t data = data_bytes;
        if (below(8) == 0) data = below(2) ? data + below(9) : data - std::min<std::uint64_t>(data, below(9));
        const auto h = ck::parse_safetensors_header(text, data);
        check_invariants(h, data);
        ++accepted;
      } else {
        // The whole file: the length field and the data are fair game too.
        file = base;
        text.assign(reinterpret_cast<const char*>(file.data()), file.size());
        mutate_text(text);
        if (below(4) == 0 && text.size() >= 8) {
          const std::uint64_t lengths[] = {0,
                                           1,
                                           n - 1,
                                           n + 1,
                                           n + 8,
                                           text.size() - 8,
                                           text.size(),
                                           1ull << 63,
                                           ~0ull,
                                           ck::max_header_bytes,
                                           ck::max_header_bytes + 1};
          const std::uint64_t v = lengths[below(std::size(lengths))];
          for (int i = 0; i < 8; ++i) text[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
        }
        file.resize(text.size());
        if (!text.empty()) std::memcpy(file.data(), text.data(), text.size());
        const auto v = ck::parse_safetensors(file);
        check_invariants(v.header, v.data.size());
        REQUIRE(v.data_offset + v.data.size() == file.size());
        ++accepted;
        // Written back by our writer, it parses to the same header and the same data.
        ck::safetensors_writer w;
        for (const auto& t : v.header.tensors) w.add(t.name, t.type, t.shape, v.data.subspan(t.begin, t.bytes()));
        for (const auto& [k, value] : v.header.metadata) w.set_metadata(k, value);
        const std::string again = w.header_json();
        REQUIRE(same_header(ck::parse_safetensors_header(again, v.data.size()), v.header));
        if (reread < 100) {  // and from disk, tensor by tensor
          ++reread;
          put(s / "accepted.safetensors", file);
          const ck::safetensors_file f(s / "accepted.safetensors");
          REQUIRE(same_header(f.header(), v.header));
          for (const auto& t : v.header.tensors) {
            std::vector<std::byte> got(t.bytes());
            f.read(t.name, got);
            REQUIRE(same_bytes(std::span<const std::byte>(got), v.data.subspan(t.begin, t.bytes())));
          }
        }
      }
    } catch (const ck::format_error& e) {
      ++rejected;
      ++reasons[reason_of(e.message())];
    } catch (const trident::error& e) {  // a usage_error would mean the writer refuses what the reader accepted
      FAIL("input ", input, ": not a format_error: ", e.what());
    } catch (const std::exception& e) {
      FAIL("input ", input, ": an exception that is not a trident::error: ", e.what());
    }
  }
  MESSAGE("fuzz: ", inputs, " inputs from seed ", seed, ": ", accepted, " accepted, ", rejected, " rejected, ", reread,
          " re-read from disk; ", reasons.size(), " kinds of rejection");
  if (env_or("TRIDENT_FUZZ_VERBOSE", 0) != 0)
    for (const auto& [reason, count] : reasons) MESSAGE(count, "  ", reason);
  CHECK(accepted + rejected == inputs);
  // Both outcomes are exercised: whitespace, a renamed key or an equal number keep a file valid.
  CHECK(accepted > inputs / 100);
  CHECK(rejected > inputs / 2);
}
