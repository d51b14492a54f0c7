// trident/checkpoint/safetensors.hpp — Hugging Face's safetensors format: the file a checkpoint
// shard is written in, read back with every offset checked.
//
// Synopsis
//   class format_error : error          a file or header that breaks the format (names the source, what, expected)
//   class io_error : status_error       an OS call failed; status() is errno, the message names the path
//   max_header_bytes                    100 MB, the reference implementation's limit
//   safetensors_name(dtype)             "F32", "BF16", ...;  dtype_from_safetensors_name("F32") -> optional<dtype>
//   struct tensor_entry                 name, dtype, shape, [begin, end) in the data section; bytes()
//   struct safetensors_header           tensors in file order, metadata; find(name), data_bytes()
//   parse_safetensors_header(json, data_bytes, source)   strict parse, then the reference's validation
//   parse_safetensors(file_bytes, source) -> safetensors_view {header, data_offset, data}   a file in memory
//   class safetensors_writer            add(name, dtype, shape, bytes) / add(name, shape, span<T>),
//                                       set_metadata(k, v), header_json(), file_bytes(), write(path, sync)
//   class safetensors_file              opens and validates; header(), read(name, out), read_range(name, offset, out),
//                                       read_at(out, file offset)
//
// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian u64 N, then N
// bytes of UTF-8 JSON, then the data section. The JSON maps each tensor's name to {"dtype",
// "shape", "data_offsets": [begin, end]} (offsets relative to the data section), plus an optional
// "__metadata__" object of strings. docs/checkpoint_format.md describes it as trident writes it.
//
// Reading enforces what the Rust reference enforces (safetensors/src/tensor.rs, read_metadata and
// Metadata::validate), so a file we accept is one Python's safetensors accepts, and the other way
// round for the dtypes trident has: N at most 100 MB and inside the file; the JSON an object;
// per tensor, end - begin == product(shape) x element size (overflow checked, the product folded
// left as the reference folds it); sorted by offsets, the tensors tile the data section exactly
// (no gap, no overlap, no trailing byte); names unique. Stricter than the reference, on purpose:
// an unknown field in a tensor's entry, a duplicate key and a lone UTF-16 surrogate are errors.
//
// The JSON parser is ours and small: the header's grammar has a fixed depth (object of objects
// of arrays), so the parser follows it without recursion; it accepts objects, arrays, strings
// (every escape, \uXXXX with surrogate pairs) and non-negative integers, nothing else. It never
// reads past its input, and what it allocates is bounded by a small multiple of the header's
// length, which is bounded by the file's size and max_header_bytes before a byte is read.
//
// Writing: the header is padded with spaces to a multiple of 8 bytes (as the reference does, so
// the data section starts 8-aligned) and the tensors follow in the order they were added.
// Little-endian hosts only (x86-64, AArch64): the data section is copied as it is in memory.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"

namespace trident::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "trident's safetensors files are little-endian, and the data section is copied as it is in memory");

//! A file or a header that breaks the safetensors format: the message names the source (the
//! file), what is wrong, and what was expected.
//!
//!   try { trident::checkpoint::safetensors_file f("model.safetensors"); }
//!   catch (const trident::checkpoint::format_error& e) { std::fprintf(stderr, "%s\n", e.what()); }
class format_error : public error {
 public:
  explicit format_error(std::string_view message, std::string_view operation = {},
                        std::source_location where = std::source_location::current())
      : error("trident format error", message, operation, where) {}
};

//! An OS call on a file failed (open, pread, write, fsync, close); status() is errno and the
//! message names the path and strerror.
class io_error : public status_error {
 public:
  io_error(int errno_value, std::string_view message, std::string_view operation = {},
           std::source_location where = std::source_location::current())
      : status_error("trident I/O error", errno_value, message, operation, where) {}
};

//! The longest header the reference accepts (its MAX_HEADER_SIZE); larger is a format_error.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

//! The dtype's name in a safetensors header: `safetensors_name(dtype::bfloat16) == "BF16"`.
constexpr std::string_view safetensors_name(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "F32";
    case dtype::float64: return "F64";
    case dtype::float16: return "F16";
    case dtype::bfloat16: return "BF16";
    case dtype::int8: return "I8";
    case dtype::uint8: return "U8";
    case dtype::int32: return "I32";
    case dtype::uint32: return "U32";
    case dtype::int64: return "I64";
    case dtype::uint64: return "U64";
  }
  return "?";
}

//! The dtype a safetensors name stands for, or nothing for a name trident has no type for
//! (BOOL, I16, U16, the F8 kinds, ...): `dtype_from_safetensors_name("F16") == dtype::float16`.
constexpr std::optional<dtype> dtype_from_safetensors_name(std::string_view name) noexcept {
  constexpr dtype all[] = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16, dtype::int8,
                           dtype::uint8,   dtype::int32,   dtype::uint32,  dtype::int64,    dtype::uint64};
  for (const dtype t : all)
    if (safetensors_name(t) == name) return t;
  return std::nullopt;
}

//! One tensor of a file: its name, dtype, shape and bytes [begin, end) of the data section.
struct tensor_entry {
  std::string name;
  dtype type = dtype::float32;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;

  std::uint64_t bytes() const noexcept { return end - begin; }
};

//! A validated header: the tensors in the order of their data (by offset), and the metadata.
//!
//!   const auto& h = file.header();
//!   if (const auto* t = h.find("wte.weight")) std::printf("%s\n", std::string(name_of(t->type)).c_str());
struct safetensors_header {
  std::vector<tensor_entry> tensors;
  std::map<std::string, std::string> metadata;

  //! The tensor called `name`, or nullptr. A linear search: safetensors_file keeps an index.
  const tensor_entry* find(std::string_view name) const noexcept {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  //! The length of the data section the tensors cover.
  std::uint64_t data_bytes() const noexcept {
    std::uint64_t last = 0;
    for (const auto& t : tensors) last = std::max(last, t.end);
    return last;
  }
};

namespace detail {

inline constexpr std::size_t no_error = static_cast<std::size_t>(-1);

// The index of the first byte that is not well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), or no_error. The reference rejects such a header
// (str::from_utf8) before parsing it.
inline std::size_t invalid_utf8_at(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return i;
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return no_error;
}

// A name as a message shows it: quoted, control bytes escaped, long names cut, so that a
// hostile header cannot make a message of megabytes or one that breaks a log line.
inline std::string printable(std::string_view s) {
  constexpr std::size_t shown = 80;
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > shown) out += trident::detail::concat("...' (", s.size(), " bytes)");
  else out += "'";
  return out;
}

inline std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size() && i < 8; ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > 8) out += trident::detail::concat(", ... (", shape.size(), " dimensions)");
  return out + "]";
}

// product(shape) x size_of(type), folded left with overflow checks as the reference folds it
// (so [2^40, 2^40, 0] overflows there and here alike); nullopt on overflow.
inline std::optional<std::uint64_t> tensor_bytes(dtype type, const std::vector<std::uint64_t>& shape) noexcept {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(size_of(type)), &n)) return std::nullopt;
  return n;
}

inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[static_cast<unsigned char>(c) >> 4];
          out += hex[static_cast<unsigned char>(c) & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The header's grammar, followed directly: { name: {dtype, shape, data_offsets} | "__metadata__":
// {string: string} }. Every failure is a format_error naming the source and the byte.
class header_parser {
 public:
  header_parser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  safetensors_header parse() {
    if (const std::size_t bad = invalid_utf8_at(text_); bad != no_error) {
      pos_ = bad;
      fail("the header is not valid UTF-8");
    }
    safetensors_header h;
    bool have_metadata = false;
    skip_ws();
    if (peek() != '{') fail("the header must be a JSON object; found ", found());
    ++pos_;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        const std::size_t key_at = pos_;
        std::string key = parse_string("a tensor name");
        skip_ws();
        expect(':', "after the name ", printable(key));
        skip_ws();
        if (key == "__metadata__") {
          if (have_metadata) {
            pos_ = key_at;
            fail("\"__metadata__\" appears twice");
          }
          have_metadata = true;
          parse_metadata(h.metadata);
        } else {
          h.tensors.push_back(parse_tensor(std::move(key)));
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        if (peek() == '}') {
          ++pos_;
          break;
        }
        fail("expected ',' or '}' after an entry of the header; found ", found());
      }
    }
    skip_ws();
    if (pos_ != text_.size())
      fail("trailing characters after the header's JSON object (only whitespace may follow it); found ", found());
    return h;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    throw format_error(trident::detail::concat(source_, ": ", std::forward<Parts>(parts)..., " (at byte ", pos_,
                                               " of the ", text_.size(), "-byte header)"));
  }

  char peek() const noexcept { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  // What stands at the cursor, for messages.
  std::string found() const {
    if (pos_ >= text_.size()) return "the end of the header";
    const auto c = static_cast<unsigned char>(text_[pos_]);
    if (c < 0x20 || c >= 0x7f)
      return trident::detail::concat("byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    return trident::detail::concat("'", static_cast<char>(c), "'");
  }

  void skip_ws() noexcept {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  template <class... Parts>
  void expect(char c, Parts&&... context) {
    if (peek() != c) fail("expected '", c, "' ", std::forward<Parts>(context)..., "; found ", found());
    ++pos_;
  }

  unsigned hex4(std::string_view what) {
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = peek();
      unsigned d = 0;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      else fail("a \\u escape in ", what, " needs 4 hexadecimal digits; found ", found());
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  std::string parse_string(std::string_view what) {
    if (peek() != '"') fail("expected a string for ", what, "; found ", found());
    ++pos_;
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string in ", what);
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("an unescaped control character (", found(), ") in ", what);
      ++pos_;
      if (c != '\\') {
        out += c;  // the whole header was checked to be UTF-8 already
        continue;
      }
      const std::size_t escape_at = pos_ - 1;
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4(what);
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            pos_ = escape_at;
            fail("a lone low surrogate \\u escape in ", what);
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (peek() != '\\' || pos_ + 1 >= text_.size() || text_[pos_ + 1] != 'u') {
              pos_ = escape_at;
              fail("a high surrogate \\u escape not followed by a low one in ", what);
            }
            pos_ += 2;
            const std::uint32_t low = hex4(what);
            if (low < 0xDC00 || low > 0xDFFF) {
              pos_ = escape_at;
              fail("a high surrogate \\u escape not followed by a low one in ", what);
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          pos_ = escape_at;
          fail("an invalid escape in ", what, " (JSON has \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  template <class... Parts>
  std::uint64_t parse_uint(const Parts&... what) {
    const char c = peek();
    if (c == '-') fail("a negative number in ", what..., "; expected a non-negative integer");
    if (c < '0' || c > '9') fail("expected a non-negative integer in ", what..., "; found ", found());
    if (c == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      fail("a number with a leading zero in ", what..., " (not JSON)");
    std::uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const auto d = static_cast<std::uint64_t>(peek() - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10)
        fail("an integer in ", what..., " larger than 2^64 - 1");
      v = v * 10 + d;
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E')
      fail("a number with a fraction or an exponent in ", what..., "; expected an integer");
    return v;
  }

  // [u64, ...]: at most `limit` elements (more is an error named by `too_many`).
  template <class Each>
  void parse_uint_array(std::string_view what, const std::string& name, Each each) {
    if (peek() != '[')
      fail("the ", what, " of tensor ", printable(name), " must be an array of non-negative integers; found ", found());
    ++pos_;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      each(parse_uint("the ", what, " of tensor ", printable(name)));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return;
      }
      fail("expected ',' or ']' in the ", what, " of tensor ", printable(name), "; found ", found());
    }
  }

  void parse_metadata(std::map<std::string, std::string>& metadata) {
    if (peek() != '{') fail("\"__metadata__\" must be an object of strings; found ", found());
    ++pos_;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      const std::size_t key_at = pos_;
      std::string key = parse_string("a metadata key");
      skip_ws();
      expect(':', "after the metadata key ", printable(key));
      skip_ws();
      if (peek() != '"') fail("the metadata value of ", printable(key), " must be a string; found ", found());
      std::string value = parse_string("a metadata value");
      if (!metadata.emplace(std::move(key), std::move(value)).second) {
        pos_ = key_at;
        fail("a metadata key appears twice");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return;
      }
      fail("expected ',' or '}' in \"__metadata__\"; found ", found());
    }
  }

  tensor_entry parse_tensor(std::string name) {
    if (peek() != '{')
      fail("tensor ", printable(name), " must be an object {\"dtype\", \"shape\", \"data_offsets\"}; found ", found());
    ++pos_;
    tensor_entry t;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        const std::size_t key_at = pos_;
        const std::string key = parse_string("a field name");
        skip_ws();
        expect(':', "after the field ", printable(key), " of tensor ", printable(name));
        skip_ws();
        bool* seen = nullptr;
        if (key == "dtype") seen = &have_dtype;
        else if (key == "shape") seen = &have_shape;
        else if (key == "data_offsets") seen = &have_offsets;
        if (seen == nullptr) {
          pos_ = key_at;
          fail("an unknown field ", printable(key), " in tensor ", printable(name),
               "; expected dtype, shape and data_offsets");
        }
        if (*seen) {
          pos_ = key_at;
          fail("the field ", printable(key), " appears twice in tensor ", printable(name));
        }
        *seen = true;
        if (key == "dtype") {
          const std::size_t at = pos_;
          const std::string d = parse_string("a dtype");
          const auto type = dtype_from_safetensors_name(d);
          if (!type) {
            pos_ = at;
            fail("unknown dtype ", printable(d), " of tensor ", printable(name),
                 "; trident reads F32, F64, F16, BF16, I8, U8, I32, U32, I64, U64");
          }
          t.type = *type;
        } else if (key == "shape") {
          parse_uint_array("shape", name, [&](std::uint64_t d) { t.shape.push_back(d); });
        } else {
          std::array<std::uint64_t, 2> offsets{};
          std::size_t count = 0;
          parse_uint_array("data_offsets", name, [&](std::uint64_t v) {
            if (count == 2)
              fail("the data_offsets of tensor ", printable(name), " must be [begin, end]: more than 2 integers");
            offsets[count++] = v;
          });
          if (count != 2)
            fail("the data_offsets of tensor ", printable(name), " must be [begin, end]: ", count, " integer(s)");
          t.begin = offsets[0];
          t.end = offsets[1];
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        if (peek() == '}') {
          ++pos_;
          break;
        }
        fail("expected ',' or '}' in tensor ", printable(name), "; found ", found());
      }
    }
    if (!have_dtype || !have_shape || !have_offsets)
      fail("tensor ", printable(name), " has no \"", !have_dtype ? "dtype" : (!have_shape ? "shape" : "data_offsets"),
           "\"; every tensor needs dtype, shape and data_offsets");
    t.name = std::move(name);
    return t;
  }

  std::string_view text_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

template <class... Parts>
[[noreturn]] void fail_format(std::string_view source, const Parts&... parts) {
  throw format_error(trident::detail::concat(source, ": ", parts...));
}

// The reference's Metadata::validate, plus unique names: sizes agree with shapes, and sorted by
// offsets the tensors tile [0, data_bytes) exactly. Sorts h.tensors into file order.
inline void validate(safetensors_header& h, std::uint64_t data_bytes, std::string_view source) {
  for (const auto& t : h.tensors) {
    const auto bytes = tensor_bytes(t.type, t.shape);
    if (!bytes)
      fail_format(source, "the shape ", shape_text(t.shape), " of tensor ", printable(t.name),
                  " overflows 64 bits when multiplied out (", safetensors_name(t.type), ", ", size_of(t.type),
                  " bytes per element)");
    if (t.end < t.begin)
      fail_format(source, "the data_offsets [", t.begin, ", ", t.end, "] of tensor ", printable(t.name),
                  " end before they begin");
    if (t.end - t.begin != *bytes)
      fail_format(source, "tensor ", printable(t.name), " has data_offsets [", t.begin, ", ", t.end, "], ",
                  t.end - t.begin, " bytes, but its shape ", shape_text(t.shape), " of ", safetensors_name(t.type),
                  " needs ", *bytes, " bytes");
    if (t.end > data_bytes)
      fail_format(source, "tensor ", printable(t.name), " has data_offsets [", t.begin, ", ", t.end,
                  "], past the end of the ", data_bytes, "-byte data section (a truncated file?)");
  }
  std::vector<std::size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return h.tensors[a].name < h.tensors[b].name; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (h.tensors[order[i]].name == h.tensors[order[i - 1]].name)
      fail_format(source, "the tensor name ", printable(h.tensors[order[i]].name), " appears twice in the header");

  // Empty tensors sit anywhere their offset says, as long as it is inside the section; sorting
  // by (begin, end) puts them before a tensor that starts there, as the reference sorts.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const tensor_entry& a, const tensor_entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  const tensor_entry* previous = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < covered)
      fail_format(source, "tensors ", printable(previous->name), " [", previous->begin, ", ", previous->end, ") and ",
                  printable(t.name), " [", t.begin, ", ", t.end, ") overlap in the data section");
    if (t.begin > covered)
      fail_format(source, "bytes [", covered, ", ", t.begin, ") of the data section belong to no tensor (a gap before ",
                  printable(t.name), "); the tensors must tile the data section");
    covered = t.end;
    previous = &t;
  }
  if (covered != data_bytes)
    fail_format(source, "the tensors cover ", covered, " bytes but the data section has ", data_bytes, " (",
                data_bytes - covered, " trailing bytes belong to no tensor)");
}

inline std::uint64_t little_endian_u64(const std::byte* b) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<std::uint64_t>(b[i]);
  return v;
}

// The header length N from a file's first 8 bytes, checked against the file's size.
inline std::uint64_t header_length(const std::byte* first8, std::uint64_t file_bytes, std::string_view source) {
  const std::uint64_t n = little_endian_u64(first8);
  if (n > max_header_bytes)
    throw format_error(trident::detail::concat(source, ": the header length field says ", n, " bytes, more than the ",
                                               max_header_bytes,
                                               "-byte limit (not a safetensors file, or a corrupt one)"));
  if (n > file_bytes - 8)
    throw format_error(trident::detail::concat(source, ": the header length field says ", n, " bytes, but only ",
                                               file_bytes - 8, " bytes follow it (a truncated file?)"));
  return n;
}

// A file descriptor that closes itself; reads and writes whole ranges or throws naming the path.
class posix_file {
 public:
  posix_file(const std::filesystem::path& path, int flags, mode_t mode = 0) : path_(path) {
    do fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) fail_os((flags & (O_WRONLY | O_RDWR)) != 0 ? "cannot create it" : "cannot open it");
  }
  posix_file(posix_file&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
  posix_file& operator=(posix_file&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  posix_file(const posix_file&) = delete;
  posix_file& operator=(const posix_file&) = delete;
  ~posix_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::filesystem::path& path() const noexcept { return path_; }

  std::uint64_t regular_file_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_os("cannot stat it");
    if (!S_ISREG(st.st_mode))
      throw format_error(trident::detail::concat("safetensors file '", path_.string(), "': not a regular file"));
    return static_cast<std::uint64_t>(st.st_size);
  }

  void read_at(std::span<std::byte> out, std::uint64_t offset) const {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_os(trident::detail::concat("cannot read ", out.size(), " bytes at offset ", offset));
      if (n == 0)
        throw format_error(trident::detail::concat("safetensors file '", path_.string(), "': the file ends at byte ",
                                                   offset + done, " while reading ", out.size(), " bytes at offset ",
                                                   offset, " (was it truncated after it was opened?)"));
      done += static_cast<std::size_t>(n);
    }
  }

  void write_all(std::span<const std::byte> bytes, std::uint64_t& written) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_os(trident::detail::concat("cannot write (", written + done, " bytes written so far)"));
      done += static_cast<std::size_t>(n);
    }
    written += done;
  }

  //! Asks the kernel to start writing [offset, offset + bytes) to the device, without waiting
  //! (Linux's sync_file_range; elsewhere nothing: the fsync does it all).
  void start_writeback([[maybe_unused]] std::uint64_t offset, [[maybe_unused]] std::uint64_t bytes) noexcept {
#if defined(__linux__)
    ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
#endif
  }

  void sync() {
    int rc = 0;
    do rc = ::fsync(fd_);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) fail_os("fsync failed");
  }

  // Closes and reports what close reports (a delayed write error on NFS, for one).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) fail_os("close failed");
  }

 private:
  [[noreturn]] void fail_os(std::string_view what) const {
    const int e = errno;
    throw io_error(
        e, trident::detail::concat("safetensors file '", path_.string(), "': ", what, " (", std::strerror(e), ")"));
  }

  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace detail

//! Parses and validates a header's JSON against a data section of `data_bytes` bytes (see the
//! file comment for the rules); format_error naming `source`, the problem and what was expected.
//! The tensors come back in the order of their data.
//!
//!   auto h = trident::checkpoint::parse_safetensors_header(
//!       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
//!   assert(h.find("w")->bytes() == 8);
inline safetensors_header parse_safetensors_header(std::string_view json, std::uint64_t data_bytes,
                                                   std::string_view source = "safetensors header") {
  if (json.size() > max_header_bytes)
    throw format_error(trident::detail::concat(source, ": a ", json.size(), "-byte header, more than the ",
                                               max_header_bytes, "-byte limit"));
  auto h = detail::header_parser(json, source).parse();
  detail::validate(h, data_bytes, source);
  return h;
}

//! A whole file held in memory, parsed: its header, and its data section (a view into the bytes).
struct safetensors_view {
  safetensors_header header;
  std::uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  std::span<const std::byte> data;
};

//! Parses a complete safetensors file held in memory (length field, header, data), as
//! safetensors_file does on disk: for files received over a network, and for tests.
//!
//!   auto v = trident::checkpoint::parse_safetensors(bytes);
//!   auto w = v.data.subspan(v.header.find("w")->begin, v.header.find("w")->bytes());
inline safetensors_view parse_safetensors(std::span<const std::byte> file,
                                          std::string_view source = "safetensors bytes") {
  if (file.size() < 8)
    throw format_error(trident::detail::concat(
        source, ": ", file.size(), " bytes, shorter than the 8-byte header length field (a truncated file?)"));
  const std::uint64_t n = detail::header_length(file.data(), file.size(), source);
  const std::string_view json(reinterpret_cast<const char*>(file.data() + 8), static_cast<std::size_t>(n));
  safetensors_view v{parse_safetensors_header(json, file.size() - 8 - n, source), 8 + n, {}};
  v.data = file.subspan(static_cast<std::size_t>(v.data_offset));
  return v;
}

//! Collects tensors and metadata, then writes one safetensors file. The tensors' bytes are not
//! copied: they must stay alive and unchanged until write() returns. Tensors are written in the
//! order added (wider dtypes first keeps every tensor aligned for readers that map the file).
//!
//!   trident::checkpoint::safetensors_writer w;
//!   w.add("wte.weight", {vocab, dim}, std::span<const float>(weights));
//!   w.set_metadata("step", "1200");
//!   w.write(dir / "model.safetensors.tmp");   // the caller renames it into place
class safetensors_writer {
 public:
  //! Adds a tensor of `type` and `shape` whose little-endian data are `bytes`; usage_error when
  //! the name is taken, reserved or not UTF-8, or the size does not match the shape.
  void add(std::string name, dtype type, std::vector<std::uint64_t> shape, std::span<const std::byte> bytes) {
    TRIDENT_EXPECT(name != "__metadata__",
                   "safetensors_writer: the tensor name \"__metadata__\" is reserved for metadata");
    TRIDENT_EXPECT(detail::invalid_utf8_at(name) == detail::no_error, "safetensors_writer: the tensor name ",
                   detail::printable(name), " is not valid UTF-8 (the header is JSON)");
    const auto expected = detail::tensor_bytes(type, shape);
    TRIDENT_EXPECT(expected.has_value(), "safetensors_writer: the shape ", detail::shape_text(shape), " of tensor ",
                   detail::printable(name), " overflows 64 bits when multiplied out");
    TRIDENT_EXPECT(*expected == bytes.size(), "safetensors_writer: tensor ", detail::printable(name), " of shape ",
                   detail::shape_text(shape), " and dtype ", name_of(type), " needs ", *expected, " bytes, got ",
                   bytes.size());
    TRIDENT_EXPECT(!names_.contains(name), "safetensors_writer: a tensor named ", detail::printable(name),
                   " was added already");
    names_.insert(name);
    tensor_entry e{std::move(name), type, std::move(shape), data_bytes_, data_bytes_ + bytes.size()};
    data_bytes_ = e.end;
    tensors_.push_back({std::move(e), bytes});
  }

  //! The same for element type T: `w.add("bias", {n}, std::span<const float>(b))`.
  template <element_type T>
  void add(std::string name, std::vector<std::uint64_t> shape, std::span<T> values) {
    add(std::move(name), dtype_of<T>, std::move(shape), std::as_bytes(values));
  }

  //! A "__metadata__" entry (both strings UTF-8); a key set twice keeps the last value.
  void set_metadata(std::string key, std::string value) {
    TRIDENT_EXPECT(
        detail::invalid_utf8_at(key) == detail::no_error && detail::invalid_utf8_at(value) == detail::no_error,
        "safetensors_writer: the metadata ", detail::printable(key), " is not valid UTF-8 (the header is JSON)");
    metadata_.insert_or_assign(std::move(key), std::move(value));
  }

  //! The header as written: compact JSON ("__metadata__" first when there is any, then the
  //! tensors in the order added), padded with spaces to a multiple of 8 bytes.
  std::string header_json() const {
    std::string j = "{";
    if (!metadata_.empty()) {
      j += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata_) {
        if (!std::exchange(first, false)) j += ',';
        detail::append_json_string(j, k);
        j += ':';
        detail::append_json_string(j, v);
      }
      j += '}';
    }
    for (const auto& t : tensors_) {
      if (j.size() > 1) j += ',';
      detail::append_json_string(j, t.entry.name);
      j += ":{\"dtype\":\"";
      j += safetensors_name(t.entry.type);
      j += "\",\"shape\":[";
      for (std::size_t i = 0; i < t.entry.shape.size(); ++i) {
        if (i) j += ',';
        j += std::to_string(t.entry.shape[i]);
      }
      j += "],\"data_offsets\":[";
      j += std::to_string(t.entry.begin);
      j += ',';
      j += std::to_string(t.entry.end);
      j += "]}";
    }
    j += '}';
    j.resize((j.size() + 7) / 8 * 8, ' ');
    return j;
  }

  //! The size of the file write() makes: 8 + the padded header + the data.
  std::uint64_t file_bytes() const { return 8 + header_json().size() + data_bytes_; }

  //! The tensors added so far, with their offsets in the data section.
  std::vector<tensor_entry> entries() const {
    std::vector<tensor_entry> out;
    out.reserve(tensors_.size());
    for (const auto& t : tensors_) out.push_back(t.entry);
    return out;
  }

  //! Writes the file at `path` (created or truncated; not atomic: write a temporary name and
  //! rename it), and fsyncs it before closing unless `sync` is false. io_error naming the path
  //! when the OS refuses; a failed write leaves a partial file behind.
  void write(const std::filesystem::path& path, bool sync = true) const {
    write(path, sync, [](std::span<const std::byte>) {});
  }

  //! write(), showing `seen` every byte of the file in order, in chunks of at most a few MiB,
  //! each right after it is written (still in the cache): a checksum without reading the file
  //! back.
  template <class Seen>
  void write(const std::filesystem::path& path, bool sync, Seen&& seen) const {
    const std::string header = header_json();
    TRIDENT_EXPECT(header.size() <= max_header_bytes, "safetensors_writer: the header of '", path.string(), "' takes ",
                   header.size(), " bytes, more than the ", max_header_bytes, "-byte limit readers accept");
    std::array<std::byte, 8> length{};
    for (int i = 0; i < 8; ++i) length[static_cast<std::size_t>(i)] = static_cast<std::byte>(header.size() >> (8 * i));
    detail::posix_file f(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::uint64_t written = 0;
    f.write_all(length, written);
    seen(std::span<const std::byte>(length));
    f.write_all(std::as_bytes(std::span(header.data(), header.size())), written);
    seen(std::as_bytes(std::span(header.data(), header.size())));
    constexpr std::size_t chunk = std::size_t{4} << 20;
    for (const auto& t : tensors_)
      for (std::size_t at = 0; at < t.bytes.size(); at += chunk) {
        const auto part = t.bytes.subspan(at, std::min(chunk, t.bytes.size() - at));
        const std::uint64_t from = written;
        f.write_all(part, written);
        // Start the device's write of what is written while the next chunk is copied, rather
        // than all of it at the fsync: the fsync then waits for the tail only.
        if (sync) f.start_writeback(from, part.size());
        seen(part);
      }
    if (sync) f.sync();
    f.close();
  }

 private:
  struct pending {
    tensor_entry entry;
    std::span<const std::byte> bytes;
  };
  std::vector<pending> tensors_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_bytes_ = 0;
};

//! An open safetensors file whose size and header have been validated; reads whole tensors or
//! byte ranges of them with pread (so concurrent reads from several threads are fine).
//!
//!   trident::checkpoint::safetensors_file f(dir / "model.safetensors");
//!   std::vector<float> w(n);
//!   f.read("wte.weight", std::span(w));                 // the whole tensor; dtype and size checked
//!   f.read_range("wte.weight", 1024, std::span(w).first(256));   // elements [1024, 1280)
class safetensors_file {
 public:
  //! Opens `path` and validates it; format_error or io_error naming the path otherwise.
  explicit safetensors_file(std::filesystem::path path) : file_(path, O_RDONLY) {
    const std::string source = trident::detail::concat("safetensors file '", path.string(), "'");
    file_bytes_ = file_.regular_file_size();
    if (file_bytes_ < 8)
      throw format_error(trident::detail::concat(
          source, ": ", file_bytes_, " bytes, shorter than the 8-byte header length field (a truncated file?)"));
    std::array<std::byte, 8> length{};
    file_.read_at(length, 0);
    const std::uint64_t n = detail::header_length(length.data(), file_bytes_, source);
    std::string json(static_cast<std::size_t>(n), '\0');
    file_.read_at(std::as_writable_bytes(std::span(json.data(), json.size())), 8);
    data_offset_ = 8 + n;
    header_ = parse_safetensors_header(json, file_bytes_ - data_offset_, source);
    index_.resize(header_.tensors.size());
    std::iota(index_.begin(), index_.end(), std::size_t{0});
    std::sort(index_.begin(), index_.end(),
              [&](std::size_t a, std::size_t b) { return header_.tensors[a].name < header_.tensors[b].name; });
  }

  const std::filesystem::path& path() const noexcept { return file_.path(); }
  const safetensors_header& header() const noexcept { return header_; }
  //! Where the data section starts (8 + the header's length) and the file's size.
  std::uint64_t data_offset() const noexcept { return data_offset_; }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }

  //! The tensor called `name`, or nullptr (a binary search).
  const tensor_entry* find(std::string_view name) const noexcept {
    const auto it = std::lower_bound(index_.begin(), index_.end(), name,
                                     [&](std::size_t i, std::string_view n) { return header_.tensors[i].name < n; });
    return it != index_.end() && header_.tensors[*it].name == name ? &header_.tensors[*it] : nullptr;
  }

  //! Reads the whole tensor `name`; `out.size()` must be its size in bytes.
  void read(std::string_view name, std::span<std::byte> out) const {
    const tensor_entry& t = entry(name);
    TRIDENT_EXPECT(out.size() == t.bytes(), "safetensors file '", path().string(), "': tensor ",
                   detail::printable(name), " has ", t.bytes(), " bytes; the destination has ", out.size());
    file_.read_at(out, data_offset_ + t.begin);
  }

  //! Reads bytes [offset, offset + out.size()) of the file (offsets as in the file, header included).
  void read_at(std::span<std::byte> out, std::uint64_t offset) const {
    TRIDENT_EXPECT(offset <= file_bytes_ && out.size() <= file_bytes_ - offset, "safetensors file '", path().string(), "': bytes [",
                   offset, ", ", offset, " + ", out.size(), ") of a file of ", file_bytes_, " bytes");
    file_.read_at(out, offset);
  }

  //! Reads bytes [byte_offset, byte_offset + out.size()) of tensor `name`.
  void read_range(std::string_view name, std::uint64_t byte_offset, std::span<std::byte> out) const {
    const tensor_entry& t = entry(name);
    TRIDENT_EXPECT(byte_offset <= t.bytes() && out.size() <= t.bytes() - byte_offset, "safetensors file '",
                   path().string(), "': bytes [", byte_offset, ", ", byte_offset, " + ", out.size(), ") of tensor ",
                   detail::printable(name), ", which has ", t.bytes(), " bytes");
    file_.read_at(out, data_offset_ + t.begin + byte_offset);
  }

  //! The whole tensor as elements of T, which must be its dtype: `f.read("w", std::span(floats))`.
  template <element_type T>
  requires(!std::is_const_v<T>) void read(std::string_view name, std::span<T> out) const {
    check_type<T>(name);
    read(name, std::as_writable_bytes(out));
  }

  //! Elements [first_element, first_element + out.size()) of tensor `name` (offset and size in
  //! elements of T, which must be its dtype; the byte overload counts bytes).
  template <element_type T>
  requires(!std::is_const_v<T>) void read_range(std::string_view name, std::uint64_t first_element,
                                                std::span<T> out) const {
    const tensor_entry& t = check_type<T>(name);
    const std::uint64_t elements = t.bytes() / sizeof(T);
    TRIDENT_EXPECT(first_element <= elements && out.size() <= elements - first_element, "safetensors file '",
                   path().string(), "': elements [", first_element, ", ", first_element, " + ", out.size(),
                   ") of tensor ", detail::printable(name), ", which has ", elements);
    file_.read_at(std::as_writable_bytes(out), data_offset_ + t.begin + first_element * sizeof(T));
  }

 private:
  const tensor_entry& entry(std::string_view name) const {
    const tensor_entry* t = find(name);
    TRIDENT_EXPECT(t != nullptr, "safetensors file '", path().string(), "' has no tensor ", detail::printable(name),
                   " (it has ", header_.tensors.size(), " tensors)");
    return *t;
  }

  template <class T>
  const tensor_entry& check_type(std::string_view name) const {
    const tensor_entry& t = entry(name);
    TRIDENT_EXPECT(t.type == dtype_of<T>, "safetensors file '", path().string(), "': tensor ", detail::printable(name),
                   " is ", name_of(t.type), " (", safetensors_name(t.type), "), read as ", name_of(dtype_of<T>));
    return t;
  }

  detail::posix_file file_;
  safetensors_header header_;
  std::vector<std::size_t> index_;  // tensor indices sorted by name
  std::uint64_t data_offset_ = 0;
  std::uint64_t file_bytes_ = 0;
};

}  // namespace trident::checkpoint
