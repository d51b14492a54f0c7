#pragma once
// Token shards in the format llm.c and its users already have, and a loader that gives each
// data-parallel rank its own deterministic slice of every global batch (issue 13).
//
//   enum class token_format       gpt2 (uint16 tokens), llama3 (uint32 tokens)
//   struct shard_info             path, format, token count (read from a header, checked)
//   shard_info inspect_shard(path)              the header, checked against the file's size
//   std::vector<std::string> find_shards(pattern)   the files a glob pattern names, sorted
//   void write_shard(path, tokens, format)      a shard (tests, tools)
//   class shard_loader            next() -> inputs and targets of this rank's B x T slice;
//                                 position() / seek() for resuming; reset()
//
// The format (llm.c's dev/data/data_common.py): a header of 256 little-endian int32, where
// [0] is the magic (20240520 for GPT-2's uint16 tokens, 20240801 for LLaMA-3's uint32), [1]
// the version (1 and 7) and [2] the number of tokens, then the tokens. A file whose size is
// not header + tokens is rejected, naming both sizes.
//
// Slicing, as llm.c's DataLoader (not shuffled): a global batch is ranks x B x T consecutive
// tokens (+1 for the last target); rank r's slice of batch k in a shard starts at token
// (k ranks + r) B T, and targets are inputs shifted by one token. A shard serves
// floor((tokens - 1) / (ranks B T)) batches, then the next shard starts; after the last, the
// first again (a new epoch). So d ranks with B rows each read exactly what one rank with d B
// rows reads, row block by row block: data parallelism leaves the data unchanged.
//
//   trident::data::shard_loader train(trident::data::find_shards("data/tiny_train_*.bin"), B, T,
//                                     grid.data().rank(), grid.data().size());
//   auto batch = train.next();   // batch.inputs, batch.targets: B x T token ids each
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::data {

enum class token_format : std::uint8_t { gpt2, llama3 };

inline constexpr std::size_t header_ints = 256;
inline constexpr std::size_t header_bytes = header_ints * sizeof(std::int32_t);

constexpr std::int32_t magic_of(token_format f) noexcept { return f == token_format::gpt2 ? 20240520 : 20240801; }
constexpr std::int32_t version_of(token_format f) noexcept { return f == token_format::gpt2 ? 1 : 7; }
constexpr std::size_t token_bytes(token_format f) noexcept { return f == token_format::gpt2 ? 2 : 4; }

//! What a shard's header says, checked against the file.
struct shard_info {
  std::string path;
  token_format format = token_format::gpt2;
  std::size_t tokens = 0;
};

namespace detail {

// A file descriptor that closes itself.
class file {
 public:
  explicit file(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    TRIDENT_EXPECT(fd_ >= 0, "token shard '", path, "': cannot open it (", std::strerror(errno), ")");
  }
  file(file&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  file& operator=(file&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() { close(); }
  int fd() const noexcept { return fd_; }
  // Reads exactly `bytes` at `offset`, or throws naming the file.
  void read_at(const std::string& path, void* into, std::size_t bytes, std::size_t offset) const {
    auto* p = static_cast<unsigned char*>(into);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      TRIDENT_EXPECT(n > 0, "token shard '", path, "': reading ", bytes, " bytes at offset ", offset, " failed (",
                     n == 0 ? "end of file" : std::strerror(errno), ")");
      p += n;
      bytes -= static_cast<std::size_t>(n);
      offset += static_cast<std::size_t>(n);
    }
  }

 private:
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline std::int32_t little_endian_int32(const unsigned char* b) noexcept {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
                                   static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24);
}

inline shard_info inspect(const std::string& path, const file& f) {
  struct stat st {};
  TRIDENT_EXPECT(::fstat(f.fd(), &st) == 0, "token shard '", path, "': cannot stat it (", std::strerror(errno), ")");
  const auto size = static_cast<std::size_t>(st.st_size);
  TRIDENT_EXPECT(size >= header_bytes, "token shard '", path, "': ", size, " bytes, shorter than the ", header_bytes,
                 "-byte header (256 int32); truncated, or not a token shard");
  std::array<unsigned char, 12> head{};
  f.read_at(path, head.data(), head.size(), 0);
  const std::int32_t magic = little_endian_int32(head.data()), version = little_endian_int32(head.data() + 4),
                     count = little_endian_int32(head.data() + 8);
  shard_info info{path, token_format::gpt2, 0};
  if (magic == magic_of(token_format::gpt2)) info.format = token_format::gpt2;
  else if (magic == magic_of(token_format::llama3)) info.format = token_format::llama3;
  else
    throw usage_error(trident::detail::concat("token shard '", path, "': magic number ", magic, "; expected ",
                                              magic_of(token_format::gpt2), " (llm.c's GPT-2 format, uint16 tokens) or ",
                                              magic_of(token_format::llama3), " (LLaMA-3, uint32 tokens)"));
  TRIDENT_EXPECT(version == version_of(info.format), "token shard '", path, "': version ", version, " with magic ", magic,
                 "; expected version ", version_of(info.format));
  TRIDENT_EXPECT(count >= 0, "token shard '", path, "': a negative token count (", count, ") in its header");
  info.tokens = static_cast<std::size_t>(count);
  const std::size_t expected = header_bytes + info.tokens * token_bytes(info.format);
  TRIDENT_EXPECT(size == expected, "token shard '", path, "': ", size, " bytes, but its header announces ", info.tokens,
                 " tokens, which take ", expected, " bytes with the header (", size < expected ? "truncated" : "trailing bytes",
                 ")");
  return info;
}

}  // namespace detail

//! Reads and checks a shard's header (magic, version, and that the file holds exactly the
//! announced tokens); usage_error naming the file and what was expected otherwise.
inline shard_info inspect_shard(const std::string& path) {
  const detail::file f(path);
  return detail::inspect(path, f);
}

//! The files matching a glob pattern, sorted; usage_error when none does.
inline std::vector<std::string> find_shards(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  TRIDENT_EXPECT(!out.empty(), "token shards: no file matches '", pattern, "'",
                 rc == GLOB_NOMATCH || rc == 0 ? "" : " (glob failed)", "; expected at least one shard");
  std::sort(out.begin(), out.end());
  return out;
}

//! Writes `tokens` as a shard in `format` (every token must fit its width).
inline void write_shard(const std::string& path, std::span<const std::uint32_t> tokens, token_format format = token_format::gpt2) {
  TRIDENT_EXPECT(tokens.size() < (std::size_t{1} << 31), "write_shard('", path, "'): ", tokens.size(),
                 " tokens; the header's int32 count holds fewer than 2^31");
  std::vector<unsigned char> bytes(header_bytes + tokens.size() * token_bytes(format), 0);
  auto put = [&](std::size_t at, std::uint32_t v, std::size_t width) {
    for (std::size_t i = 0; i < width; ++i) bytes[at + i] = static_cast<unsigned char>(v >> (8 * i));
  };
  put(0, static_cast<std::uint32_t>(magic_of(format)), 4);
  put(4, static_cast<std::uint32_t>(version_of(format)), 4);
  put(8, static_cast<std::uint32_t>(tokens.size()), 4);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    TRIDENT_EXPECT(format == token_format::llama3 || tokens[i] <= 0xFFFF, "write_shard('", path, "'): token ", i, " is ",
                   tokens[i], ", which does not fit the GPT-2 format's uint16");
    put(header_bytes + i * token_bytes(format), tokens[i], token_bytes(format));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TRIDENT_EXPECT(fd >= 0, "write_shard('", path, "'): cannot create it (", std::strerror(errno), ")");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      throw usage_error(trident::detail::concat("write_shard('", path, "'): writing failed (", std::strerror(e), ")"));
    }
    done += static_cast<std::size_t>(n);
  }
  TRIDENT_EXPECT(::close(fd) == 0, "write_shard('", path, "'): closing failed (", std::strerror(errno), ")");
}

//! B x T token ids and the next token of each.
struct token_batch {
  std::vector<std::int32_t> inputs, targets;
};

//! Where a loader is: the shard and the batch in it that next() serves next.
struct loader_position {
  std::size_t shard = 0, batch = 0;
  friend bool operator==(const loader_position&, const loader_position&) = default;
};

//! Serves this rank's B x T slice of each global batch of `ranks` x B x T tokens, shard after
//! shard, in llm.c's order (see the header comment). Every shard is checked at construction;
//! one too small for a global batch is a usage_error naming it.
class shard_loader {
 public:
  shard_loader(std::vector<std::string> shards, std::size_t batch, std::size_t seq, int rank, int ranks)
      : batch_(batch), seq_(seq), rank_(rank), ranks_(ranks) {
    TRIDENT_EXPECT(batch >= 1 && seq >= 1, "shard_loader: B = ", batch, " rows of T = ", seq, " tokens; expected both at least 1");
    TRIDENT_EXPECT(ranks >= 1 && rank >= 0 && rank < ranks, "shard_loader: rank ", rank, " of ", ranks,
                   "; expected 0 <= rank < ranks");
    TRIDENT_EXPECT(!shards.empty(), "shard_loader: no shards given");
    // ranks x B x T (+ 1 for the last target) must fit in size_t; a wrapped product would pass
    // the size checks below and later divide by zero.
    std::size_t global = 0;
    const bool wraps = __builtin_mul_overflow(static_cast<std::size_t>(ranks), batch, &global) ||
                       __builtin_mul_overflow(global, seq, &global) || global == static_cast<std::size_t>(-1);
    TRIDENT_EXPECT(!wraps, "shard_loader: a global batch of ", ranks, " ranks x B = ", batch, " x T = ", seq,
                   " tokens overflows a 64-bit count; expected far fewer tokens per step");
    for (auto& path : shards) {
      detail::file f(path);
      shard_info info = detail::inspect(path, f);
      TRIDENT_EXPECT(info.tokens >= global + 1, "shard_loader: shard '", path, "' holds ", info.tokens,
                     " tokens; a global batch of ", ranks, " ranks x B = ", batch, " x T = ", seq, " needs ", global + 1);
      shards_.push_back({std::move(info), std::move(f)});
    }
  }

  std::size_t rows() const noexcept { return batch_; }
  //! Tokens of one global batch (ranks x B x T): what one position step stands for.
  std::size_t global_tokens() const noexcept { return static_cast<std::size_t>(ranks_) * batch_ * seq_; }
  std::size_t sequence() const noexcept { return seq_; }
  std::size_t shards() const noexcept { return shards_.size(); }
  //! Global batches shard s serves before the next shard starts.
  std::size_t batches_in(std::size_t s) const { return (shards_.at(s).info.tokens - 1) / global_tokens(); }
  const shard_info& info(std::size_t s) const { return shards_.at(s).info; }

  loader_position position() const noexcept { return at_; }
  //! Continue from `p` (a position() saved earlier, e.g. in a checkpoint).
  void seek(loader_position p) {
    TRIDENT_EXPECT(p.shard < shards_.size() && p.batch < batches_in(p.shard), "shard_loader::seek: shard ", p.shard, ", batch ",
                   p.batch, " is outside the ", shards_.size(), " shards (or that shard's ",
                   p.shard < shards_.size() ? batches_in(p.shard) : 0, " batches)");
    at_ = p;
  }
  void reset() noexcept { at_ = {}; }

  //! This rank's slice of the next global batch.
  token_batch next() {
    token_batch out;
    next_into(out);
    return out;
  }
  //! The same into existing vectors (resized to B x T).
  void next_into(token_batch& out) {
    const std::size_t n = batch_ * seq_;
    const auto& s = shards_[at_.shard];
    const std::size_t first = (at_.batch * static_cast<std::size_t>(ranks_) + static_cast<std::size_t>(rank_)) * n;
    const std::size_t width = token_bytes(s.info.format);
    raw_.resize((n + 1) * width);
    s.f.read_at(s.info.path, raw_.data(), raw_.size(), header_bytes + first * width);
    out.inputs.resize(n);
    out.targets.resize(n);
    auto token = [&](std::size_t i) {
      std::uint32_t v = 0;
      for (std::size_t b = 0; b < width; ++b) v |= static_cast<std::uint32_t>(raw_[i * width + b]) << (8 * b);
      return static_cast<std::int32_t>(v);
    };
    for (std::size_t i = 0; i < n; ++i) {
      out.inputs[i] = token(i);
      out.targets[i] = token(i + 1);
    }
    if (++at_.batch >= batches_in(at_.shard)) at_ = {(at_.shard + 1) % shards_.size(), 0};
  }

 private:
  struct open_shard {
    shard_info info;
    detail::file f;
  };

  std::size_t batch_, seq_;
  int rank_, ranks_;
  std::vector<open_shard> shards_;
  loader_position at_;
  std::vector<unsigned char> raw_;
};

}  // namespace trident::data
