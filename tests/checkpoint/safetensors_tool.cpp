// The C++ side of checkpoint.safetensors_py (tests/checkpoint/safetensors_py.sh):
//   safetensors_tool write DIR    writes the files safetensors_check.py loads with Python's safetensors
//   safetensors_tool check FILE   reads the file safetensors_check.py wrote and checks it value by value
// Element i of each tensor (flat, row-major) follows a formula that safetensors_check.py repeats:
// change one, change both. Every value is exact in its type, so both sides compare bit for bit.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "trident/checkpoint/safetensors.hpp"

namespace ck = trident::checkpoint;
using trident::bf16;
using trident::fp16;

namespace {

template <class T, class F>
std::vector<T> make(std::size_t n, F f) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = f(static_cast<std::int64_t>(i));
  return v;
}

// The tensors both sides know (safetensors_check.py: EXPECTED).
struct expected {
  std::vector<float> f32 = make<float>(6, [](std::int64_t i) { return (static_cast<float>(i) - 2.5f) * 0.5f; });
  std::vector<double> f64 = make<double>(3, [](std::int64_t i) { return static_cast<double>(i + 1) / 3.0; });
  std::vector<fp16> f16 = make<fp16>(4, [](std::int64_t i) { return fp16(static_cast<float>(i - 1) * 0.25f); });
  std::vector<bf16> b16 = make<bf16>(4, [](std::int64_t i) { return bf16((static_cast<float>(i) - 1.5f) * 2.0f); });
  std::vector<std::int8_t> i8 =
      make<std::int8_t>(5, [](std::int64_t i) { return static_cast<std::int8_t>(i * 37 - 100); });
  std::vector<std::uint8_t> u8 =
      make<std::uint8_t>(5, [](std::int64_t i) { return static_cast<std::uint8_t>(255 - i * 50); });
  std::vector<std::int32_t> i32 =
      make<std::int32_t>(4, [](std::int64_t i) { return static_cast<std::int32_t>(i * -123456789 + 7); });
  std::vector<std::uint32_t> u32 = make<std::uint32_t>(
      4, [](std::int64_t i) { return static_cast<std::uint32_t>(4294967295ll - i * 1000000007ll); });
  std::vector<std::int64_t> i64 =
      make<std::int64_t>(3, [](std::int64_t i) { return -(std::int64_t{1} << 62) + i * 205891132094649ll; });
  std::vector<std::uint64_t> u64 = make<std::uint64_t>(
      3, [](std::int64_t i) { return ~std::uint64_t{0} - static_cast<std::uint64_t>(i) * (std::uint64_t{1} << 40); });
  float scalar = 3.5f;
};

// All ten dtypes, a scalar, empty tensors and metadata, in an order that is not the reference's
// (U8 first, so the tensors after it are not aligned): Python must not care.
void write_dtypes(const expected& e, const std::filesystem::path& path) {
  ck::safetensors_writer w;
  w.add("u8", {5}, std::span(e.u8));
  w.add("f32", {2, 3}, std::span(e.f32));
  w.add("f64", {3}, std::span(e.f64));
  w.add("f16", {4}, std::span(e.f16));
  w.add("bf16", {2, 2}, std::span(e.b16));
  w.add("i8", {5}, std::span(e.i8));
  w.add("i32", {4}, std::span(e.i32));
  w.add("u32", {2, 2}, std::span(e.u32));
  w.add("i64", {3}, std::span(e.i64));
  w.add("u64", {3, 1}, std::span(e.u64));
  w.add("scalar", {}, std::span(&e.scalar, 1));
  w.add("empty_i32", {0}, std::span<const std::int32_t>());
  w.add("empty_f16", {2, 0}, std::span<const fp16>());
  w.set_metadata("format", "trident");
  w.set_metadata("unicode", "\xc3\xa9\xe2\x88\x91");
  w.write(path);
}

// Everything numpy has (no bf16), in the reference's order (its Dtype enum descending, then the
// name: prepare() in safetensors/src/tensor.rs) with one metadata key: the bytes must equal
// safetensors.numpy.save's for the same arrays.
void write_reference_order(const expected& e, const std::filesystem::path& path) {
  ck::safetensors_writer w;
  w.add("u64", {3, 1}, std::span(e.u64));  // U64 > I64 > F64 > F32 > U32 > I32 > F16 > I8 > U8
  w.add("i64", {3}, std::span(e.i64));
  w.add("f64", {3}, std::span(e.f64));
  w.add("f32", {2, 3}, std::span(e.f32));
  w.add("scalar", {}, std::span(&e.scalar, 1));
  w.add("u32", {2, 2}, std::span(e.u32));
  w.add("empty_i32", {0}, std::span<const std::int32_t>());
  w.add("i32", {4}, std::span(e.i32));
  w.add("empty_f16", {2, 0}, std::span<const fp16>());
  w.add("f16", {4}, std::span(e.f16));
  w.add("i8", {5}, std::span(e.i8));
  w.add("u8", {5}, std::span(e.u8));
  w.set_metadata("format", "trident");
  w.write(path);
}

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
    ++failures;
  }
}

// The file safetensors_check.py writes with safetensors.numpy.save_file (its PYTHON_WRITTEN).
void check_python_file(const std::filesystem::path& path) {
  const ck::safetensors_file f(path);
  const auto& h = f.header();
  expect(h.tensors.size() == 3, "3 tensors");
  expect(h.metadata.size() == 2 && h.metadata.count("source") && h.metadata.at("source") == "safetensors-python" &&
             h.metadata.count("note"),
         "metadata {source: safetensors-python, note}");
  if (h.metadata.count("note"))
    expect(h.metadata.at("note") == "caf\xc3\xa9 \"quoted\"\n", "metadata note with escapes");
  expect(f.data_offset() % 8 == 0, "the reference pads its header to a multiple of 8");

  auto shape_is = [&](const char* name, trident::dtype t, std::vector<std::uint64_t> shape) {
    const auto* e = f.find(name);
    expect(e != nullptr, std::string("a tensor '") + name + "'");
    if (e) expect(e->type == t && e->shape == shape, std::string("dtype and shape of '") + name + "'");
    return e != nullptr && e->type == t;
  };
  if (shape_is("weight", trident::dtype::float32, {3, 4})) {
    std::vector<float> w(12);
    f.read("weight", std::span(w));
    for (std::size_t i = 0; i < w.size(); ++i)
      expect(w[i] == static_cast<float>(i) * 0.75f - 4.0f, "weight[" + std::to_string(i) + "]");
  }
  if (shape_is("half", trident::dtype::float16, {5})) {
    std::vector<fp16> v(5);
    f.read("half", std::span(v));
    for (std::size_t i = 0; i < v.size(); ++i)
      expect(static_cast<float>(v[i]) == (static_cast<float>(i) - 2.0f) * 0.125f, "half[" + std::to_string(i) + "]");
  }
  if (shape_is("ids", trident::dtype::int32, {2, 3})) {
    std::vector<std::int32_t> v(6);
    f.read("ids", std::span(v));
    for (std::size_t i = 0; i < v.size(); ++i)
      expect(v[i] == static_cast<std::int32_t>(i * i) - 10, "ids[" + std::to_string(i) + "]");
    // A range in the middle, as a sharded load reads it.
    std::vector<std::int32_t> mid(3);
    f.read_range("ids", 2, std::span(mid));
    expect(mid[0] == -6 && mid[1] == -1 && mid[2] == 6, "ids[2:5] by read_range");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "check")) {
    std::fprintf(stderr, "usage: %s write DIR | check FILE\n", argv[0]);
    return 2;
  }
  try {
    const std::string command = argv[1];
    if (command == "write") {
      const expected e;
      const std::filesystem::path dir = argv[2];
      write_dtypes(e, dir / "trident_dtypes.safetensors");
      write_reference_order(e, dir / "trident_reference_order.safetensors");
      std::printf("wrote %s and %s\n", (dir / "trident_dtypes.safetensors").c_str(),
                  (dir / "trident_reference_order.safetensors").c_str());
      return 0;
    }
    check_python_file(argv[2]);
    if (failures) {
      std::fprintf(stderr, "%d mismatch(es) in %s\n", failures, argv[2]);
      return 1;
    }
    std::printf("read %s: every value as Python's safetensors wrote it\n", argv[2]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
