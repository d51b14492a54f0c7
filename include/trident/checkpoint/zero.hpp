// trident/checkpoint/zero.hpp — sharded checkpoints of a zero_optimizer: every rank writes what
// it owns, and a load fills whatever a rank holds, in any world size, ZeRO stage,
// tensor-parallel size or pipeline split.
//
// Synopsis
//   struct save_options          user metadata, keep the last k, fsync
//   struct load_result           where it loaded from, the step, the user metadata
//   save(comm, zero, root, step, options)   collective over every rank that holds part of the
//                                           model: the data-parallel group, or the whole grid
//                                           under tensor or pipeline parallelism
//   save_async(...) -> pending_save         returns once the state is copied to host memory;
//                                           the files are written in the background
//   load(comm, zero, dir)                   collective; any layout (resharding)
//   load_latest(comm, zero, root)           the newest checkpoint that verifies, falling back
//   checkpoints(root)                       complete checkpoints under root, newest first
//   verify(dir)                             the manifest's xxh64 checksums
//   export_safetensors(dir, file, field)    one safetensors file of whole tensors (no comm)
//   import_safetensors(comm, zero, file)    start from such a file (e.g. written by PyTorch)
//   class corrupt_checkpoint                incomplete, truncated or corrupt: what load_latest
//                                           goes past (another model or precision is a
//                                           usage_error, which it raises)
//
// On disk (docs/checkpoint_format.md):
//   <root>/step_00000020/
//     rank_00000.safetensors   this rank's piece of every bucket, one 1-D tensor per (field,
//                              tensor) run, named "<field>/<tensor>@<first element>": fields are
//                              "parameters" (working weights), "master", "state0".. (the
//                              optimizer's states); its metadata says which part of which
//                              global tensor each is; rank 0's also holds the counters
//     index.json               for people and tools: format, step, world size, stage, dtypes,
//                              every tensor's global shape, split and pieces (file, part, range)
//     MANIFEST                 "<xxh64>  <file>" per file, as `xxhsum -c MANIFEST` checks it
//
// Tensor parallelism: a tensor registered in the model_spec by its global sharding and part
// (model_spec::add(name, sharding, part, layer)) is saved as that part; replicas by part 0
// only. A load whose part of a tensor is the saved one reads its pieces; one with another
// division assembles the tensor from every saved part and cuts its own.
//
// Why each rank writes its piece of every bucket (as ZeRO's optimizer-state files do), in
// every stage: the ranks write in parallel and each element once, and the pieces are ranges of
// tensors, so a load in another layout reads the ranges it needs from whichever files hold
// them, with no collective but the verdict.
//
// Atomic and durable: everything is written into <root>/.tmp.step_N, each file fsynced, then
// MANIFEST (last), the directory fsynced and renamed to step_N, and <root> fsynced. A directory
// without a MANIFEST, or whose files do not match it, is not a checkpoint: load() names what is
// wrong, load_latest() goes on to the next older one.
//
// Asynchronous: a background thread copies this rank's pieces to host memory (the optimizer's
// next update waits for that copy: the only stall) and writes them. A synchronous save writes
// straight from the optimizer's host memory. Either way each file's xxh64 is computed as it is
// written, and a load checks it as it reads (every file is passed over once). The ranks then
// coordinate through the directory, not the
// communicator (which the training thread is using): each rank leaves "rank_N.done" (its
// file's xxh64) or "rank_N.failed" beside its file, and rank 0 waits for all of them (up to
// save_options::timeout) before it writes the manifest. A rank that dies mid-save leaves no
// checkpoint, only a .tmp directory that the next save of that step replaces.
//
// Failure is agreed: a rank that cannot write or read reports it to the others, so every rank
// throws (naming the failed rank and why) at the same point, and the ranks stay matched.
//
//   trident::checkpoint::save(comm, zero, "ckpt", zero.steps_taken(), {.keep = 3});
//   ...
//   auto r = trident::checkpoint::load_latest(comm, zero, "ckpt");   // r.step: where it resumed
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <thread>
#include <tuple>
#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "trident/checkpoint/safetensors.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/space_span.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/model/sharding.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace trident::checkpoint {

struct save_options {
  std::map<std::string, std::string> metadata;  // the user's (data position, RNG state, ...), returned by load
  int keep = 0;                                 // keep the newest k checkpoints under root; 0: all
  bool sync = true;                             // fsync files and directories (off only for tests of speed)
  //! How long rank 0 waits for the other ranks' files before it gives the checkpoint up.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

//! A checkpoint that is incomplete, truncated or corrupt (a missing or unreadable MANIFEST, a
//! checksum that does not match, a missing file or piece): load_latest goes past it. Whatever
//! else fails a load (another model, precision or optimizer: a usage_error) is raised by
//! load_latest too, not skipped: starting afresh would silently throw the training away.
class corrupt_checkpoint : public error {
 public:
  explicit corrupt_checkpoint(std::string_view message, std::string_view operation = {},
                              std::source_location where = std::source_location::current())
      : error("trident checkpoint error", message, operation, where) {}
};

struct load_result {
  std::filesystem::path path;
  std::int64_t step = 0;
  std::map<std::string, std::string> metadata;
};

namespace detail {

using trident::detail::concat;

inline constexpr std::string_view format_name = "trident-zero-checkpoint";
inline constexpr int format_version = 2;
inline constexpr std::string_view user_prefix = "user.";

inline std::string step_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}
inline std::string rank_file(int r) {
  char name[40];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", r);
  return name;
}
inline std::string hex64(std::uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}
// Doubles travel as hexadecimal floats: exact, and readable by strtod and Python's float.fromhex.
inline std::string hex_double(double v) {
  char s[64];
  std::snprintf(s, sizeof s, "%a", v);
  return s;
}

inline void fsync_path(const std::filesystem::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw error(concat("checkpoint: cannot open ", p.string(), " to fsync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) throw error(concat("checkpoint: fsync of ", p.string(), " failed: ", std::strerror(e)));
}

inline std::uint64_t file_xxh64(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw error(concat("checkpoint: cannot open ", p.string(), ": ", std::strerror(errno)));
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  std::vector<char> chunk(std::size_t{4} << 20);
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0) {
      const int e = errno;
      ::close(fd);
      throw error(concat("checkpoint: cannot read ", p.string(), ": ", std::strerror(e)));
    }
    if (got == 0) break;
    XXH64_update(&state, chunk.data(), static_cast<std::size_t>(got));
  }
  ::close(fd);
  return XXH64_digest(&state);
}

inline void write_text(const std::filesystem::path& p, const std::string& text, bool sync) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw error(concat("checkpoint: cannot write ", p.string()));
  }
  if (sync) fsync_path(p, false);
}

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A field's piece of one tensor in one file: "<field>/<tensor>@<first element>".
struct piece {
  std::size_t file;
  std::string key;
  std::size_t begin, count;
};
inline std::string piece_key(std::string_view field, std::string_view tensor, std::size_t begin) {
  return concat(field, "/", tensor, "@", begin);
}
// Splits a key; false when it is not one of ours.
inline bool parse_piece_key(const std::string& key, std::string& field, std::string& tensor, std::size_t& begin) {
  const auto slash = key.find('/');
  const auto at = key.rfind('@');
  if (slash == std::string::npos || at == std::string::npos || at <= slash + 1 || at + 1 >= key.size()) return false;
  std::size_t v = 0;
  for (std::size_t i = at + 1; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9' || v > (SIZE_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<std::size_t>(key[i] - '0');
  }
  field = key.substr(0, slash);
  tensor = key.substr(slash + 1, at - slash - 1);
  begin = v;
  return true;
}

// MANIFEST: "<16 hex digits>  <file>" per line (xxhsum's format for XXH64).
// The text of a MANIFEST (`path` names it in errors).
inline std::map<std::string, std::uint64_t> parse_manifest(const std::string& text, const std::filesystem::path& path) {
  std::istringstream in(text);
  std::map<std::string, std::uint64_t> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.size() < 19 || line[16] != ' ' || line[17] != ' ')
      throw corrupt_checkpoint(concat("checkpoint ", path.string(), " line ", n, ": expected \"<16 hex digits>  <file>\""));
    std::uint64_t h = 0;
    for (int i = 0; i < 16; ++i) {
      const char c = line[static_cast<std::size_t>(i)];
      const int d = c >= '0' && c <= '9' ? c - '0' : (c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1);
      if (d < 0) throw corrupt_checkpoint(concat("checkpoint ", path.string(), " line ", n, ": '", c, "' is not a lower-case hex digit"));
      h = (h << 4) | static_cast<std::uint64_t>(d);
    }
    const std::string file = line.substr(18);
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw corrupt_checkpoint(concat("checkpoint ", path.string(), " line ", n, ": '", file, "' is not a file name of the checkpoint"));
    if (!out.emplace(file, h).second) throw corrupt_checkpoint(concat("checkpoint ", path.string(), ": ", file, " is listed twice"));
  }
  if (out.empty()) throw corrupt_checkpoint(concat("checkpoint ", path.string(), " lists no files"));
  return out;
}
inline std::map<std::string, std::uint64_t> read_manifest(const std::filesystem::path& dir) {
  const auto path = dir / "MANIFEST";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": no MANIFEST (an incomplete checkpoint: the manifest is written last)"));
  return parse_manifest(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), path);
}

// The few collectives a checkpoint needs, on host values, for a communicator of any memory
// space: a device communicator's are staged through its own space (trident::detail::stage_in).
using trident::detail::stage_in;
template <communicator Comm>
std::vector<std::uint64_t> all_gather_values(Comm& comm, std::uint64_t mine) {
  return trident::detail::all_gather_small(comm, std::span<const std::uint64_t>(&mine, 1));
}
template <communicator Comm, class T>
void broadcast_values(Comm& comm, std::vector<T>& values, int root) {
  using space = typename Comm::space;
  if constexpr (space::host_accessible) {
    comm.broadcast(std::span<T>(values), root);
  } else {
    buffer<T, space> staged(values.size(), mem_category::communication);
    stage_in(values.data(), values.size(), staged);
    comm.broadcast(staged, root);
    comm.synchronize();
    trident::copy(space_span<const T, space>(staged.data(), values.size()), space_span<T, host_space>(values));
  }
}

// Runs `work` on this rank and agrees with the others on whether it failed: every rank throws
// (its own error, or one naming the first failed rank) or none does.
template <communicator Comm, class Work>
void agreed(Comm& comm, std::string_view what, Work work) {
  std::exception_ptr mine;
  try {
    work();
  } catch (...) {
    mine = std::current_exception();
  }
  // What failed travels with the verdict, so every rank throws the same kind of error (and
  // load_latest decides alike everywhere whether to go on to an older checkpoint).
  std::uint64_t kind = 0;
  if (mine) {
    kind = 3;
    try {
      std::rethrow_exception(mine);
    } catch (const corrupt_checkpoint&) {
      kind = 1;
    } catch (const format_error&) {
      kind = 1;
    } catch (const usage_error&) {
      kind = 2;
    } catch (...) {
    }
  }
  const auto kinds = all_gather_values(comm, kind);
  if (mine) std::rethrow_exception(mine);
  for (std::size_t r = 0; r < kinds.size(); ++r) {
    if (kinds[r] == 0) continue;
    const std::string why = concat(what, ": rank ", r, " failed (its error is raised there); nothing was changed on this rank's side of it");
    const auto echo = [](auto e) {
      e.mark_echo();
      return e;
    };
    if (kinds[r] == 1) throw echo(corrupt_checkpoint(why));
    if (kinds[r] == 2) throw echo(usage_error(why));
    throw echo(error(why));
  }
}

}  // namespace detail

namespace detail {
// Bytes a load reads from a file straight into memory that is its destination.
struct direct_read {
  std::uint64_t offset;  // in the file
  std::byte* into;
  std::size_t bytes;
};

// One pass over a checkpoint file: its xxh64 is computed while the `reads` it holds (sorted by
// offset, not overlapping) land in their destinations, so a load reads each file once. What no
// read asks for is hashed through a scratch chunk. The hash is of the bytes as they were read:
// the destinations are hashed in chunks right after they arrive (still in the cache).
inline void check_and_read(const std::filesystem::path& dir, const std::string& file, std::uint64_t hash,
                           const std::vector<direct_read>& reads) {
  const auto p = dir / file;
  if (!std::filesystem::is_regular_file(p)) throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", file, " is missing"));
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error(concat("checkpoint: cannot open ", p.string(), ": ", std::strerror(errno)));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_it{fd};
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  constexpr std::size_t chunk = std::size_t{2} << 20;  // fits the cache, so the hash rereads from it
  std::vector<std::byte> scratch;
  std::uint64_t at = 0;
  bool ended = false;
  // Reads [at, at + n) into `into` (or the scratch chunk) and hashes it; short at the file's end.
  auto pass = [&](std::byte* into, std::uint64_t n) {
    while (n > 0 && !ended) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk));
      std::byte* dst = into;
      if (dst == nullptr) {
        if (scratch.empty()) scratch.resize(chunk);
        dst = scratch.data();
      }
      std::size_t got = 0;
      while (got < want) {
        const ssize_t r = ::pread(fd, dst + got, want - got, static_cast<off_t>(at + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw error(concat("checkpoint: cannot read ", p.string(), ": ", std::strerror(errno)));
        if (r == 0) {
          ended = true;
          break;
        }
        got += static_cast<std::size_t>(r);
      }
      XXH64_update(&state, dst, got);
      at += got;
      n -= got;
      if (into != nullptr) into += got;
    }
  };
  for (const auto& r : reads) {
    if (r.offset < at) throw error(concat("checkpoint: the direct reads of ", file, " overlap or are not sorted (a trident bug)"));
    pass(nullptr, r.offset - at);
    pass(r.into, r.bytes);
  }
  pass(nullptr, std::numeric_limits<std::uint64_t>::max());
  const std::uint64_t got = XXH64_digest(&state);
  if (got != hash)
    throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", file, " is corrupt (xxh64 ", hex64(got),
                                    ", the manifest says ", hex64(hash), ")"));
}

// Which rank checks (and reads in one pass) a file of a checkpoint: rank_N's file goes to rank
// N mod world, so a load in the layout that saved reads its own file; the rest to rank 0.
inline int file_checker(const std::string& file, int world) {
  static constexpr std::string_view stem = "rank_";
  if (file.rfind(stem, 0) != 0) return 0;
  std::size_t n = 0;
  for (std::size_t i = stem.size(); i < file.size() && file[i] >= '0' && file[i] <= '9'; ++i)
    n = (n * 10 + static_cast<std::size_t>(file[i] - '0')) % static_cast<std::size_t>(world);
  return static_cast<int>(n);
}
}  // namespace detail

//! Whether `dir` is a complete checkpoint whose files match its MANIFEST (size and xxh64).
//! Throws trident::error naming the first problem.
inline void verify(const std::filesystem::path& dir) {
  for (const auto& [file, hash] : detail::read_manifest(dir)) detail::check_and_read(dir, file, hash, {});
}

//! The checkpoints under root (step_N directories with a MANIFEST; not verified), newest first.
inline std::vector<std::filesystem::path> checkpoints(const std::filesystem::path& root) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return {};
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step_", 0) != 0 || name.size() == 5) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (!std::filesystem::exists(e.path() / "MANIFEST")) continue;
    found.push_back({std::stoll(name.substr(5)), e.path()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::filesystem::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace detail {

// What one rank writes, copied out of the optimizer (the snapshot), and what rank 0 adds.
struct rank_snapshot {
  std::vector<std::byte> host;  // every piece, back to back (unless written in place)
  // key, type, data, bytes: where `take` reads a piece from (the optimizer's memory), then
  // (after copy_pieces, unless in place) where it is written from.
  std::vector<std::tuple<std::string, dtype, const std::byte*, std::size_t>> pieces;
  bool copied = false;     // the pieces point at what is written (in place, or copy_pieces ran)
  bool from_host = true;
  std::map<std::string, std::string> metadata;
  std::string index;  // rank 0: index.json
};

// The tensors a rank file describes, one line each in its metadata "tensors":
//   <name> \t <part> \t <global shape, comma-separated> \t <split axis, or -> \t <parts>
// Every rank writes the tensors of its own model (its pipeline stages, its tensor-parallel
// part), so the checkpoint as a whole says what every tensor is a part of, and a load in
// another layout assembles the parts it needs.
struct saved_tensor {
  std::vector<std::size_t> shape;
  std::optional<std::size_t> axis;
  int parts = 1;
  sharding split() const {
    return axis ? sharding::split(shape, *axis, parts) : sharding::replicated(shape);
  }
  friend bool operator==(const saved_tensor&, const saved_tensor&) = default;
};
inline std::string describe(const sharding& s) {
  std::string shape;
  for (std::size_t i = 0; i < s.shape().size(); ++i) shape += concat(i ? "," : "", s.shape()[i]);
  return concat(shape, "\t", s.axis() ? std::to_string(*s.axis()) : std::string("-"), "\t", s.parts());
}
inline std::string tensor_line(const model_spec::tensor& t) {
  TRIDENT_EXPECT(t.name.find_first_of("\t\n") == std::string::npos, "checkpoint::save: tensor name '", t.name,
                 "' holds a tab or a newline, which the checkpoint's tensor list cannot carry");
  return concat(t.name, "\t", t.global.is_split() ? t.part : 0, "\t", describe(t.global), "\n");
}
// Whether this rank writes its pieces of a tensor: a replica only on part 0 (the other parts
// hold the same values), as the global norm counts it once.
inline bool writes(const model_spec::tensor& t) { return t.copy != model_copy::replica || t.part == 0; }

// Parses one file's "tensors" metadata into (name -> part) and the shared table of shardings.
inline void parse_tensor_lines(const std::string& text, const std::string& file, const std::filesystem::path& dir,
                               std::map<std::string, saved_tensor>& table, std::map<std::string, int>& parts) {
  std::istringstream in(text);
  std::string line;
  auto bad = [&](const std::string& why) {
    return corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", file, "'s tensor list: '", line, "': ", why));
  };
  auto number = [&](const std::string& v) {
    if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) throw bad(concat("'", v, "' is not a count"));
    return static_cast<std::size_t>(std::stoull(v));
  };
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::size_t at = 0;
    for (;;) {
      const auto tab = line.find('\t', at);
      cols.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (cols.size() != 5 || cols[0].empty()) throw bad("expected <name> <part> <shape> <axis> <parts>, tab-separated");
    saved_tensor t;
    std::size_t numel = 1;
    for (std::size_t b = 0;;) {
      const auto comma = cols[2].find(',', b);
      const std::size_t d = number(cols[2].substr(b, comma == std::string::npos ? std::string::npos : comma - b));
      if (d == 0 || numel > (std::size_t{1} << 48) / d) throw bad("the shape is empty or too large");
      numel *= d;
      t.shape.push_back(d);
      if (comma == std::string::npos) break;
      b = comma + 1;
    }
    const std::size_t np = number(cols[4]);
    if (np < 1 || np > 1'000'000) throw bad("the number of parts is out of range");
    t.parts = static_cast<int>(np);
    if (cols[3] != "-") {
      const std::size_t axis = number(cols[3]);
      if (axis >= t.shape.size()) throw bad("the split axis is not an axis of the shape");
      t.axis = axis;
    } else if (t.parts != 1) {
      throw bad("a tensor that is not split has one part");
    }
    const std::size_t part = number(cols[1]);
    if (part >= np) throw bad("the part is not one of the parts");
    auto [it, added] = table.emplace(cols[0], t);
    if (!added && !(it->second == t)) throw bad("other files describe this tensor otherwise");
    if (!parts.emplace(cols[0], static_cast<int>(part)).second) throw bad("the tensor is listed twice");
  }
}

// `in_place`: the pieces are written from the optimizer's (host) memory, which must not change
// until the file is written (a synchronous save); otherwise copy_pieces copies them into the
// snapshot's memory (`reuse`, a previous save's: no allocation, no page faults) first.
template <class Zero>
rank_snapshot take_snapshot(Zero& zero, int rank, int world, std::int64_t step, const save_options& options,
                            std::vector<std::byte> reuse, bool in_place) {
  rank_snapshot snap;
  snap.host = std::move(reuse);
  snap.copied = in_place;
  snap.from_host = Zero::space::host_accessible;
  const auto fields = zero.state_fields();
  const auto& layout = zero.layout();
  for (const auto& f : fields) {
    const std::size_t elem = size_of(f.type);
    for (const auto& r : f.owned)
      if (writes(layout.spec_at(r.tensor)))
        snap.pieces.emplace_back(piece_key(f.name, layout.name_at(r.tensor), r.begin), f.type,
                                 static_cast<const std::byte*>(f.data) + r.at * elem, r.count * elem);
  }
  auto& m = snap.metadata;
  m["format"] = std::string(format_name);
  m["version"] = std::to_string(format_version);
  m["rank"] = std::to_string(rank);
  m["world"] = std::to_string(world);
  std::string tensors;
  for (std::size_t t = 0; t < layout.tensors(); ++t)
    if (writes(layout.spec_at(t))) tensors += tensor_line(layout.spec_at(t));
  m["tensors"] = tensors;
  if (rank != 0) return snap;
  const auto counters = zero.checkpoint_counters();
  m["step"] = std::to_string(step);
  m["stage"] = std::to_string(Zero::stage);
  m["optimizer_steps"] = std::to_string(counters.steps);
  m["scaler.scale"] = hex_double(counters.scaler.scale);
  m["scaler.hysteresis"] = std::to_string(counters.scaler.hysteresis);
  m["scaler.iteration"] = std::to_string(counters.scaler.iteration);
  m["scaler.last_overflow"] = std::to_string(counters.scaler.last_overflow);
  for (const auto& [k, v] : options.metadata) m[concat(user_prefix, k)] = v;
  std::string& index = snap.index;  // the head of index.json; the tensors follow from the files
  index = concat("{\n  \"format\": ", json_string(format_name), ",\n  \"version\": ", format_version, ",\n  \"step\": ", step,
                 ",\n  \"world\": ", world, ",\n  \"stage\": ", Zero::stage, ",\n  \"fields\": {");
  for (std::size_t i = 0; i < fields.size(); ++i)
    index += concat(i ? ", " : "", json_string(fields[i].name), ": ", json_string(name_of(fields[i].type)));
  index += concat("},\n  \"files\": [");
  for (int r = 0; r < world; ++r) index += concat(r ? ", " : "", json_string(rank_file(r)));
  index += "],\n";
  return snap;
}

// The copy of a snapshot's pieces into its own memory (once; nothing when in place).
inline void copy_pieces(rank_snapshot& snap) {
  if (snap.copied) return;
  std::size_t total = 0;
  for (const auto& p : snap.pieces) total += std::get<3>(p);
  snap.host.resize(total);
  std::size_t used = 0;
  for (auto& [key, type, data, bytes] : snap.pieces) {
    trident::detail::copy_bytes(snap.host.data() + used, true, data, snap.from_host, bytes);
    data = snap.host.data() + used;
    used += bytes;
  }
  snap.copied = true;
}

// index.json's "tensors": every tensor's global shape, split and pieces, from what every rank
// wrote (rank 0 alone does not know the other pipeline stages' or tensor parts' tensors).
inline std::string index_tensors(const std::filesystem::path& tmp, int world) {
  struct entry {
    saved_tensor t;
    std::string pieces;
  };
  std::map<std::string, entry> all;
  for (int r = 0; r < world; ++r) {
    const safetensors_file f(tmp / rank_file(r));
    std::map<std::string, saved_tensor> table;
    std::map<std::string, int> parts;
    const auto it = f.header().metadata.find("tensors");
    if (it != f.header().metadata.end()) parse_tensor_lines(it->second, rank_file(r), tmp, table, parts);
    for (const auto& [name, t] : table) all.emplace(name, entry{t, {}});
    for (const auto& e : f.header().tensors) {
      std::string field, tensor;
      std::size_t begin = 0;
      if (!parse_piece_key(e.name, field, tensor, begin) || field != "parameters" || !parts.count(tensor)) continue;
      auto& pieces = all[tensor].pieces;
      pieces += concat(pieces.empty() ? "" : ", ", "{\"file\": ", json_string(rank_file(r)), ", \"part\": ", parts[tensor],
                       ", \"begin\": ", begin, ", \"count\": ", e.shape.empty() ? 1 : e.shape[0], "}");
    }
  }
  std::string out = "  \"tensors\": {\n";
  std::size_t i = 0;
  for (const auto& [name, e] : all) {
    std::string shape;
    for (std::size_t d = 0; d < e.t.shape.size(); ++d) shape += concat(d ? ", " : "", e.t.shape[d]);
    out += concat("    ", json_string(name), ": {\"shape\": [", shape, "], \"split_axis\": ",
                  e.t.axis ? std::to_string(*e.t.axis) : std::string("null"), ", \"parts\": ", e.t.parts, ", \"pieces\": [", e.pieces,
                  "]}", ++i < all.size() ? ",\n" : "\n");
  }
  return out + "  }\n}\n";
}

// A rank's result beside its file in the temporary directory, renamed into place so that rank
// 0 never reads half of it: "rank_N.done" (the file's xxh64) or "rank_N.failed" (why).
inline std::filesystem::path done_file(const std::filesystem::path& tmp, int r) {
  return tmp / concat("rank_", r, ".done");
}
inline std::filesystem::path failed_file(const std::filesystem::path& tmp, int r) {
  return tmp / concat("rank_", r, ".failed");
}
inline void publish(const std::filesystem::path& target, const std::string& text, bool sync) {
  auto partial = target;
  partial += ".partial";
  write_text(partial, text, sync);
  std::filesystem::rename(partial, target);
}

// The background half of a save: this rank's file, then (rank 0) the others' results, the
// index, MANIFEST and the rename. Coordinated through the directory, not the communicator,
// which belongs to the training thread meanwhile.
inline void write_checkpoint(const rank_snapshot& snap, const std::filesystem::path& root, const std::filesystem::path& tmp,
                             const std::filesystem::path& final_dir, int rank, int world, const save_options& options) {
  try {
    safetensors_writer w;
    for (const auto& [key, type, data, bytes] : snap.pieces)
      w.add(key, type, {static_cast<std::uint64_t>(bytes / size_of(type))}, std::span<const std::byte>(data, bytes));
    for (const auto& [k, v] : snap.metadata) w.set_metadata(k, v);
    const auto path = tmp / rank_file(rank);
    // The checksum of the bytes as they are written (not read back: one pass over the data).
    XXH64_state_t hash;
    XXH64_reset(&hash, 0);
    w.write(path, options.sync, [&](std::span<const std::byte> b) { XXH64_update(&hash, b.data(), b.size()); });
    publish(done_file(tmp, rank), hex64(XXH64_digest(&hash)), options.sync);
  } catch (const std::exception& e) {
    try {
      publish(failed_file(tmp, rank), e.what(), false);
    } catch (...) {
    }
    throw;
  }
  if (rank != 0) return;
  // Every rank's verdict, or the deadline: a rank that died mid-save leaves no checkpoint.
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(world));
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  for (int r = 0; r < world; ++r) {
    for (auto pause = std::chrono::microseconds(100);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
      if (std::filesystem::exists(failed_file(tmp, r))) {
        std::ifstream in(failed_file(tmp, r));
        const std::string why{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        throw error(concat("checkpoint::save of ", final_dir.string(), ": rank ", r, " failed to write its file: ", why));
      }
      if (std::filesystem::exists(done_file(tmp, r))) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw error(concat("checkpoint::save of ", final_dir.string(), ": rank ", r, " has not written its file after ",
                           options.timeout.count(), " ms; no checkpoint was made (the directory ", tmp.string(),
                           " is left for inspection)"));
      std::this_thread::sleep_for(pause);
    }
    std::ifstream in(done_file(tmp, r));
    std::string text;
    in >> text;
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw error(concat("checkpoint::save of ", final_dir.string(), ": rank ", r, "'s result file holds '", text, "'"));
    hashes[static_cast<std::size_t>(r)] = std::stoull(text, nullptr, 16);
  }
  write_text(tmp / "index.json", snap.index + index_tensors(tmp, world), options.sync);
  std::string manifest = concat(hex64(file_xxh64(tmp / "index.json")), "  index.json\n");
  for (int r = 0; r < world; ++r) manifest += concat(hex64(hashes[static_cast<std::size_t>(r)]), "  ", rank_file(r), "\n");
  for (int r = 0; r < world; ++r) std::filesystem::remove(done_file(tmp, r));
  write_text(tmp / "MANIFEST", manifest, options.sync);
  if (options.sync) fsync_path(tmp, true);
  std::filesystem::remove_all(final_dir);  // an older save of the same step
  std::filesystem::rename(tmp, final_dir);
  if (options.sync) fsync_path(root, true);
  if (options.keep > 0) {
    const auto all = checkpoints(root);
    for (std::size_t i = static_cast<std::size_t>(options.keep); i < all.size(); ++i) std::filesystem::remove_all(all[i]);
  }
}

struct save_state {
  rank_snapshot snapshot;
  std::future<void> finished;
};

}  // namespace detail

//! A save whose files are being written in the background (save_async). wait() returns when
//! this rank's part is done, and on rank 0 when the checkpoint is complete (renamed into place);
//! it rethrows what failed. The destructor waits too (reporting a failure on stderr).
class pending_save {
 public:
  pending_save() = default;
  //! What save_async makes: the checkpoint's directory and the background work's state.
  pending_save(std::filesystem::path path, std::unique_ptr<detail::save_state> state)
      : path_(std::move(path)), state_(std::move(state)) {}
  pending_save(pending_save&&) noexcept = default;
  //! Waits (rethrowing the save's error) and hands over the host memory of its snapshot, for the
  //! next save_async to copy into without allocating.
  std::vector<std::byte> release_memory() {
    wait();
    return std::move(memory_);
  }
  pending_save& operator=(pending_save&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~pending_save() { finish_quietly(); }

  //! The directory the checkpoint will have.
  const std::filesystem::path& path() const noexcept { return path_; }
  //! Whether the background work has ended (wait() would not block).
  bool ready() const { return !state_ || state_->finished.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  void wait() {
    if (!state_) return;
    auto s = std::move(state_);
    std::exception_ptr failure;
    try {
      s->finished.get();
    } catch (...) {
      failure = std::current_exception();
    }
    memory_ = std::move(s->snapshot.host);  // kept for release_memory(), even if the save failed
    if (failure) std::rethrow_exception(failure);
  }

 private:
  void finish_quietly() noexcept {
    if (!state_) return;
    try {
      state_->finished.get();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trident: a checkpoint save that was never waited for failed: %s\n", e.what());
    }
    state_.reset();
  }
  std::filesystem::path path_;
  std::unique_ptr<detail::save_state> state_;
  std::vector<std::byte> memory_;
};

namespace detail {
// save_async, and save with `in_place` (the file written straight from the optimizer's host
// memory, which the caller leaves alone until the save is done: no copy).
template <communicator Comm, class Zero>
pending_save start_save(Comm& comm, Zero& zero, const std::filesystem::path& root, std::int64_t step, const save_options& options,
                        pending_save previous, bool in_place) {
  TRIDENT_EXPECT(step >= 0, "checkpoint::save: step ", step, "; expected >= 0");
  TRIDENT_EXPECT(options.keep >= 0, "checkpoint::save: keep = ", options.keep, "; expected 0 (keep all) or more");
  TRIDENT_EXPECT(options.timeout.count() > 0, "checkpoint::save: timeout ", options.timeout.count(), " ms; expected > 0");
  const std::string name = step_name(step);
  const auto final_dir = root / name;
  const auto tmp = root / (".tmp." + name);
  const int rank = comm.rank(), world = comm.size();
  std::vector<std::byte> memory;
  agreed(comm, "checkpoint::save", [&] {
    memory = previous.release_memory();  // the previous save must be complete (and its error seen)
    if (rank == 0) {
      std::filesystem::create_directories(root);
      std::filesystem::remove_all(tmp);
      std::filesystem::create_directory(tmp);
    }
  });
  auto state = std::make_unique<save_state>();
  // Device memory: the optimizer's last work is queued on the communicator's stream, which a
  // plain copy is not ordered with.
  if constexpr (!Zero::space::host_accessible) comm.synchronize();
  state->snapshot = take_snapshot(zero, rank, world, step, options, std::move(memory), in_place);
  // Host memory is copied by the background thread, and the optimizer's next update waits for
  // that copy (hold_state): training stalls only if it updates before the copy is done. Device
  // memory is copied here (the copy's stream and device belong to this thread).
  std::promise<void> copied;
  if constexpr (Zero::space::host_accessible) {
    if (!in_place) zero.hold_state(copied.get_future().share());
  } else {
    copy_pieces(state->snapshot);
  }
  // The snapshot lives on the heap with the future, so the pending_save may move.
  state->finished = std::async(std::launch::async, [snap = &state->snapshot, copied = std::move(copied), root, tmp, final_dir, rank, world,
                                                    options]() mutable {
    try {
      copy_pieces(*snap);
    } catch (const std::exception& e) {
      copied.set_value();  // the optimizer may go on; the save has failed
      try {
        publish(failed_file(tmp, rank), e.what(), false);
      } catch (...) {
      }
      throw;
    }
    copied.set_value();
    write_checkpoint(*snap, root, tmp, final_dir, rank, world, options);
  });
  return pending_save(final_dir, std::move(state));
}
}  // namespace detail

//! Starts saving this data-parallel group's optimizer state as <root>/step_<step> (see the top
//! of this header) and returns: a background thread copies this rank's state to host memory,
//! then writes the files while training goes on. The optimizer's next change of its state
//! (step()'s update) waits for that copy (zero_optimizer::hold_state), so training stalls only
//! where the next update comes sooner than the copy ends (bench/checkpoint_io measures it).
//! Device memory is copied before this returns. Collective over `comm` (the group the
//! optimizer was built on) for its start only. Every rank must wait() before its next save;
//! rank 0's wait() returns once the checkpoint is complete.
//!
//! Passing the previous pending_save waits for it and reuses its host memory (the copy then
//! allocates nothing and takes no page faults: one memcpy).
//!
//!   trident::checkpoint::pending_save pending;
//!   for (...) {
//!     ... a step ...
//!     if (step % 100 == 0) pending = trident::checkpoint::save_async(comm, zero, "ckpt", step, {}, std::move(pending));
//!   }
//!   pending.wait();
template <communicator Comm, class Zero>
pending_save save_async(Comm& comm, Zero& zero, const std::filesystem::path& root, std::int64_t step,
                        const save_options& options = {}, pending_save previous = {}) {
  return detail::start_save(comm, zero, root, step, options, std::move(previous), false);
}

//! Saves this data-parallel group's optimizer state as <root>/step_<step> (see the top of this
//! header) and returns when it is complete. Collective over `comm`; a failure on any rank is
//! an error on every rank. Returns the directory.
template <communicator Comm, class Zero>
std::filesystem::path save(Comm& comm, Zero& zero, const std::filesystem::path& root, std::int64_t step,
                           const save_options& options = {}) {
  std::filesystem::path out;
  // Written straight from host memory: the optimizer does not change until this returns.
  auto pending = detail::start_save(comm, zero, root, step, options, {}, Zero::space::host_accessible);
  out = pending.path();
  detail::agreed(comm, "checkpoint::save", [&] { pending.wait(); });
  return out;
}

namespace detail {

template <class T>
void convert_from(const safetensors_file& f, const std::string& name, std::vector<float>& out) {
  std::vector<T> raw(out.size());
  f.read(name, std::span<T>(raw));
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<float>(raw[i]);
}

// A checkpoint opened for reading: its files, counters and user metadata (from rank 0's file),
// every tensor's global sharding, and every piece by (field, tensor, part).
struct opened_checkpoint {
  std::filesystem::path dir;
  std::vector<std::string> files;
  std::vector<safetensors_file> opened;
  std::map<std::string, std::string> meta0;  // rank 0's metadata
  std::map<std::string, saved_tensor> tensors;
  std::map<std::string, dtype> field_types;
  // field -> tensor -> part -> pieces (distinct ranges: a copy that two files hold is read once)
  std::map<std::string, std::map<std::string, std::map<int, std::vector<piece>>>> pieces;

  const std::string& get(const std::string& k) const {
    auto it = meta0.find(k);
    if (it == meta0.end()) throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", rank_file(0), " has no metadata '", k, "'"));
    return it->second;
  }
  std::int64_t integer(const std::string& k) const {
    const std::string& v = get(k);
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty()) throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": metadata '", k, "' = '", v, "' is not an integer"));
    return static_cast<std::int64_t>(x);
  }

  // Where elements [begin, begin + count) of part `part` of a tensor's field lie: calls
  // at(file, offset in the file, the bytes of `out` it fills) per piece, in the order of `out`.
  template <class At>
  void locate(const std::string& field, const std::string& tensor, int part, std::size_t begin, std::size_t count,
              std::span<std::byte> out, At at) const {
    const std::size_t elem = size_of(field_types.at(field));
    std::size_t covered = 0;
    if (auto f = pieces.find(field); f != pieces.end())
      if (auto t = f->second.find(tensor); t != f->second.end())
        if (auto pp = t->second.find(part); pp != t->second.end())
          for (const auto& p : pp->second) {
            const std::size_t lo = std::max(p.begin, begin), hi = std::min(p.begin + p.count, begin + count);
            if (lo >= hi) continue;
            const auto& file = opened[p.file];
            at(p.file, file.data_offset() + file.find(p.key)->begin + (lo - p.begin) * elem,
               out.subspan((lo - begin) * elem, (hi - lo) * elem));
            covered += hi - lo;
          }
    // Pieces never overlap (each element is written once; copies were dropped), so full
    // coverage is a count.
    if (covered != count)
      throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": '", field, "' of ", tensor, " (part ", part, ") elements ", begin, "..",
                                      begin + count, " are ", covered == 0 ? "missing" : "only partly there", " (", covered, " of ", count,
                                      " found)"));
  }

  // Elements [begin, begin + count) of part `part` of a tensor's field, as bytes into `out`.
  void read_local(const std::string& field, const std::string& tensor, int part, std::size_t begin, std::size_t count,
                  std::span<std::byte> out) const {
    locate(field, tensor, part, begin, count, out, [&](std::size_t file, std::uint64_t offset, std::span<std::byte> into) {
      opened[file].read_at(into, offset);
    });
  }

  // The whole tensor of a field in its global row-major layout, assembled from its parts.
  std::vector<std::byte> read_global(const std::string& field, const std::string& tensor) const {
    const sharding s = tensors.at(tensor).split();
    const std::size_t elem = size_of(field_types.at(field));
    std::vector<std::byte> global(s.numel() * elem), local(s.local_numel() * elem);
    for (int q = 0; q < s.parts(); ++q) {
      read_local(field, tensor, q, 0, s.local_numel(), local);
      trident::detail::for_each_run(s, q, [&](std::size_t g, std::size_t l, std::size_t n) {
        std::memcpy(global.data() + g * elem, local.data() + l * elem, n * elem);
      });
    }
    return global;
  }
};

inline opened_checkpoint open_checkpoint(const std::filesystem::path& dir, const std::map<std::string, std::uint64_t>& manifest) {
  opened_checkpoint c;
  c.dir = dir;
  for (const auto& [f, h] : manifest)
    if (f != "index.json") c.files.push_back(f);
  c.opened.reserve(c.files.size());
  for (const auto& f : c.files) {
    // A listed file that is gone is a damaged checkpoint (load_latest goes past it), not an I/O
    // error of this machine.
    if (!std::filesystem::is_regular_file(dir / f))
      throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", f, " is missing (its MANIFEST lists it)"));
    c.opened.emplace_back(dir / f);
  }
  const auto first = std::find(c.files.begin(), c.files.end(), rank_file(0));
  if (first == c.files.end()) throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": no ", rank_file(0)));
  c.meta0 = c.opened[static_cast<std::size_t>(first - c.files.begin())].header().metadata;
  if (c.get("format") != format_name || c.get("version") != std::to_string(format_version))
    throw usage_error(concat("checkpoint ", dir.string(), ": format '", c.get("format"), "' version ", c.get("version"), "; expected '",
                             format_name, "' version ", format_version));
  for (std::size_t i = 0; i < c.opened.size(); ++i) {
    const auto& h = c.opened[i].header();
    std::map<std::string, int> parts;
    const auto listed = h.metadata.find("tensors");
    if (listed == h.metadata.end())
      throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", c.files[i], " has no tensor list (metadata 'tensors')"));
    parse_tensor_lines(listed->second, c.files[i], dir, c.tensors, parts);
    for (const auto& t : h.tensors) {
      std::string field, tensor;
      std::size_t begin = 0;
      if (!parse_piece_key(t.name, field, tensor, begin) || t.shape.size() != 1)
        throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", c.files[i], " holds '", t.name, "', which is not a 1-D piece named "
                                        "<field>/<tensor>@<first element>"));
      const auto part = parts.find(tensor);
      if (part == parts.end())
        throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", c.files[i], " holds a piece of '", tensor,
                                        "', which its tensor list does not name"));
      const std::size_t count = static_cast<std::size_t>(t.shape[0]);
      const std::size_t part_numel = c.tensors[tensor].split().local_numel();
      if (begin > part_numel || count > part_numel - begin)
        throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", c.files[i], "'s piece '", t.name, "' of ", count,
                                        " elements lies outside the tensor's part"));
      auto& list = c.pieces[field][tensor][part->second];
      const bool copy = std::any_of(list.begin(), list.end(), [&](const piece& p) { return p.begin == begin && p.count == count; });
      if (!copy) list.push_back({i, t.name, begin, count});
      auto [it, added] = c.field_types.emplace(field, t.type);
      if (!added && it->second != t.type)
        throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": field '", field, "' is stored both as ", name_of(it->second), " and ",
                                        name_of(t.type)));
    }
  }
  return c;
}

}  // namespace detail

//! Loads the checkpoint in `dir` into `zero`, whatever layout it was saved with: another world
//! size, ZeRO stage, tensor-parallel size (each tensor is assembled from the parts it was
//! saved in and cut as this rank's model_spec says) or pipeline split (tensors are found by
//! name). The precision and the optimizer must match: the fields are compared. Every file is
//! verified against MANIFEST, in the same pass that reads it (each file is read once, by the
//! rank that loads from it); a damaged file is a corrupt_checkpoint even where its damage
//! would look like another model. Collective over `comm`, the group that saved (every rank of
//! the model: the data-parallel group, or the whole grid under tensor or pipeline
//! parallelism); on any rank's failure every rank throws and the optimizer may hold part of
//! the checkpoint (load another, or start afresh).
template <communicator Comm, class Zero>
load_result load(Comm& comm, Zero& zero, const std::filesystem::path& dir) {
  using namespace detail;
  load_result result{dir, 0, {}};
  typename Zero::counters counters{};
  auto fields = zero.state_fields();
  const auto& layout = zero.layout();
  const std::string what = concat("checkpoint::load(", dir.string(), ")");
  std::map<std::string, std::uint64_t> manifest;
  agreed(comm, what, [&] { manifest = read_manifest(dir); });
  const std::vector<std::pair<std::string, std::uint64_t>> listed(manifest.begin(), manifest.end());
  // The checksums, split over the ranks (each file is read from disk once, not once per rank,
  // and by the rank that loads from it: `reads[i]`, this rank's pieces of listed file i, land in
  // the optimizer during the same pass); every rank learns which file is bad, and the rank that
  // found it why.
  auto check_files = [&](const std::vector<std::vector<direct_read>>& reads) {
    std::uint64_t bad = 0;
    std::string why;
    for (std::size_t i = 0; i < listed.size() && bad == 0; ++i) {
      if (file_checker(listed[i].first, comm.size()) != comm.rank()) continue;
      try {
        check_and_read(dir, listed[i].first, listed[i].second, reads.empty() ? std::vector<direct_read>{} : reads[i]);
      } catch (const std::exception& e) {
        bad = i + 1;
        why = e.what();
      }
    }
    const auto verdicts = all_gather_values(comm, bad);
    for (std::size_t r = 0; r < verdicts.size(); ++r)
      if (verdicts[r] != 0) {
        if (static_cast<int>(r) == comm.rank()) throw corrupt_checkpoint(why);
        corrupt_checkpoint echo(concat("checkpoint ", dir.string(), ": ", listed[verdicts[r] - 1].first, " is corrupt or missing (rank ", r,
                                       " verified it and raises the details)"));
        echo.mark_echo();
        throw echo;
      }
  };
  opened_checkpoint c;
  std::vector<float> used;  // per checkpoint tensor (name order): whether this rank loads it
  // The headers are read before the checksums (a load reads each file once), so a damaged
  // header that still parses could pass for another model: a usage error is raised only once
  // the checksums are good.
  try {
    agreed(comm, what, [&] {
      try {
        c = open_checkpoint(dir, manifest);
      } catch (const format_error& e) {
        throw corrupt_checkpoint(concat("checkpoint ", dir.string(), ": ", e.what()));
      }
      result.step = c.integer("step");
      counters.steps = c.integer("optimizer_steps");
      counters.scaler.scale = std::strtod(c.get("scaler.scale").c_str(), nullptr);
      counters.scaler.hysteresis = static_cast<int>(c.integer("scaler.hysteresis"));
      counters.scaler.iteration = c.integer("scaler.iteration");
      counters.scaler.last_overflow = c.integer("scaler.last_overflow");
      for (const auto& [k, v] : c.meta0)
        if (k.rfind(user_prefix, 0) == 0) result.metadata[k.substr(user_prefix.size())] = v;
      // The model must be the same: every tensor here is in the checkpoint with its global shape.
      for (std::size_t t = 0; t < layout.tensors(); ++t) {
        const auto& spec = layout.spec_at(t);
        const auto it = c.tensors.find(spec.name);
        if (it == c.tensors.end())
          throw usage_error(concat("checkpoint ", dir.string(), " has no tensor '", spec.name, "', which this model holds; it was saved from "
                                   "another model"));
        if (it->second.shape != spec.global.shape())
          throw usage_error(concat("checkpoint ", dir.string(), ": tensor '", spec.name, "' is ", describe(it->second.split()),
                                   " (shape, split axis, parts) there, and its global shape here is ", describe(spec.global),
                                   "; it was saved from another model"));
      }
      for (const auto& f : fields) {
        auto ft = c.field_types.find(f.name);
        if (ft == c.field_types.end()) {
          std::string have;
          for (const auto& [n, t] : c.field_types) have += concat(have.empty() ? "" : ", ", n, " (", name_of(t), ")");
          throw usage_error(concat("checkpoint ", dir.string(), " has no '", f.name, "' (", name_of(f.type), "), which this optimizer "
                             "holds; it has: ", have, ". Load it with the precision and optimizer it was saved with"));
        }
        if (ft->second != f.type)
          throw usage_error(concat("checkpoint ", dir.string(), ": '", f.name, "' is ", name_of(ft->second), " there and ", name_of(f.type),
                             " here; load it with the precision it was saved with"));
      }
      used.clear();
      for (const auto& [name, t] : c.tensors) used.push_back(layout.placements().count(name) != 0 ? 1.0f : 0.0f);
    });
    // ... and the other way round: every tensor of the checkpoint is loaded by some rank (the
    // same verdict on every rank: every rank read the same list).
    {
      using space = typename Comm::space;
      if constexpr (space::host_accessible) {
        comm.all_reduce(std::span<float>(used), reduce_op::max);
      } else {
        buffer<float, space> staged(used.size(), mem_category::communication);
        stage_in(used.data(), used.size(), staged);
        comm.all_reduce(staged, reduce_op::max);
        comm.synchronize();
        trident::copy(space_span<const float, space>(staged.data(), used.size()), space_span<float, host_space>(used));
      }
      std::string unused;
      std::size_t i = 0;
      for (const auto& [name, t] : c.tensors)
        if (used[i++] == 0.0f) unused += concat(unused.empty() ? "" : ", ", name);
      if (!unused.empty())
        throw usage_error(concat("checkpoint ", dir.string(), " holds tensors that no rank's model has: ", unused,
                                 "; it was saved from another model"));
    }
  } catch (const usage_error&) {
    check_files({});
    throw;
  }
  // This rank's reads in the layout that saved (host memory, the same division): planned per
  // file, done during the checksum pass for the files this rank checks and after it for others.
  std::vector<std::vector<direct_read>> reads(listed.size());
  std::vector<std::pair<std::size_t, direct_read>> elsewhere;  // (opened file, read)
  agreed(comm, what, [&] {
    if constexpr (Zero::space::host_accessible) {
      std::map<std::string, std::size_t> listed_at;
      for (std::size_t i = 0; i < listed.size(); ++i) listed_at[listed[i].first] = i;
      for (const auto& f : fields) {
        const std::size_t elem = size_of(f.type);
        for (const auto& r : f.held) {
          const auto& spec = layout.spec_at(r.tensor);
          if (c.tensors.at(spec.name).split() != spec.global) continue;
          std::byte* const into = static_cast<std::byte*>(f.data) + r.at * elem;
          c.locate(f.name, spec.name, spec.global.is_split() ? spec.part : 0, r.begin, r.count, std::span<std::byte>(into, r.count * elem),
                   [&](std::size_t file, std::uint64_t offset, std::span<std::byte> out) {
                     const direct_read d{offset, out.data(), out.size()};
                     if (file_checker(c.files[file], comm.size()) == comm.rank())
                       reads[listed_at.at(c.files[file])].push_back(d);
                     else
                       elsewhere.emplace_back(file, d);
                   });
        }
      }
      for (auto& per_file : reads)
        std::sort(per_file.begin(), per_file.end(), [](const direct_read& x, const direct_read& y) { return x.offset < y.offset; });
    }
  });
  check_files(reads);
  agreed(comm, what, [&] {
    // Fill every held range (on a device, after the optimizer's queued work: the copies are not
    // on the communicator's stream). A tensor saved in the same parts as this rank's model
    // holds it is read piece by piece; one saved otherwise is assembled whole and cut anew.
    if constexpr (!Zero::space::host_accessible) comm.synchronize();
    for (const auto& [file, d] : elsewhere) c.opened[file].read_at(std::span<std::byte>(d.into, d.bytes), d.offset);
    std::vector<std::byte> host;
    std::byte* last_written = nullptr;
    for (const auto& f : fields) {
      const std::size_t elem = size_of(f.type);
      for (const auto& r : f.held) {
        const auto& spec = layout.spec_at(r.tensor);
        const sharding saved = c.tensors.at(spec.name).split();
        std::byte* const into = static_cast<std::byte*>(f.data) + r.at * elem;
        if (Zero::space::host_accessible && saved == spec.global) continue;  // read straight into place (above, below)
        host.assign(r.count * elem, std::byte{0});
        if (saved == spec.global) {
          c.read_local(f.name, spec.name, spec.global.is_split() ? spec.part : 0, r.begin, r.count, host);
        } else {
          const std::vector<std::byte> global = c.read_global(f.name, spec.name);
          std::vector<std::byte> local(spec.global.local_numel() * elem, std::byte{0});
          trident::detail::for_each_run(spec.global, spec.part, [&](std::size_t g, std::size_t l, std::size_t n) {
            std::memcpy(local.data() + l * elem, global.data() + g * elem, n * elem);
          });
          std::memcpy(host.data(), local.data() + r.begin * elem, r.count * elem);
        }
        trident::detail::copy_bytes(into, Zero::space::host_accessible, host.data(), true, host.size());
        last_written = into;
      }
    }
    // A copy from pageable memory to a device may return before its DMA lands; one byte copied
    // back on the same (legacy) stream returns only after it, so the optimizer's next work on
    // its own stream sees the loaded state.
    (void)last_written;
    if constexpr (!Zero::space::host_accessible)
      if (last_written != nullptr) {
        std::byte probe{};
        trident::detail::copy_bytes(&probe, true, last_written, false, 1);
      }
    zero.restore_counters(counters);
  });
  return result;
}

//! Loads the newest checkpoint under `root` that verifies and loads, going past broken ones
//! (corrupt_checkpoint: a save cut short, a corrupt file; their messages go to `skipped`: on a
//! rank that did not find the fault, the echo naming the rank that did, unless `echoes` is
//! false); nullopt when there is none. Any other failure (another model or precision) is
//! raised. Collective.
template <communicator Comm, class Zero>
std::optional<load_result> load_latest(Comm& comm, Zero& zero, const std::filesystem::path& root,
                                       std::vector<std::string>* skipped = nullptr, bool echoes = true) {
  // Rank 0's listing is everyone's: ranks must try the same directories in the same order.
  std::vector<std::filesystem::path> found;
  if (comm.rank() == 0) found = checkpoints(root);
  std::vector<std::uint64_t> n{found.size()};
  detail::broadcast_values(comm, n, 0);
  for (std::uint64_t i = 0; i < n[0]; ++i) {
    std::string name = comm.rank() == 0 ? found[i].filename().string() : std::string();
    std::vector<std::uint64_t> len{name.size()};
    detail::broadcast_values(comm, len, 0);
    std::vector<std::uint8_t> bytes(name.begin(), name.end());
    bytes.resize(len[0]);
    detail::broadcast_values(comm, bytes, 0);
    const auto dir = root / std::string(bytes.begin(), bytes.end());
    try {
      return load(comm, zero, dir);
    } catch (const corrupt_checkpoint& e) {
      if (skipped && (echoes || !e.echo())) skipped->push_back(e.what());
    } catch (const format_error& e) {  // a rank file that is not safetensors (this rank found it)
      if (skipped && (echoes || !e.echo())) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

//! Writes the checkpoint in `dir` as ONE safetensors file of whole tensors: every tensor under
//! its name with its global shape, assembled from the parts and pieces every rank wrote (the
//! consolidated export, which Python's safetensors, PyTorch or a reference implementation
//! reads). `field` chooses what: "master" (the fp32 master weights; the default where there
//! are any), "parameters" (the working weights, in their precision), "state0", ... Verifies
//! the checkpoint first. Needs no communicator: one process reads every file.
//!
//!   trident::checkpoint::export_safetensors("ckpt/step_00001000", "model.safetensors");
//!   // Python: safetensors.numpy.load_file("model.safetensors")["h0.mlp.fc1.weight"].shape
inline void export_safetensors(const std::filesystem::path& dir, const std::filesystem::path& out, std::string field = {}) {
  using namespace detail;
  verify(dir);
  const opened_checkpoint c = open_checkpoint(dir, read_manifest(dir));
  if (field.empty()) field = c.field_types.count("master") ? "master" : "parameters";
  const auto type = c.field_types.find(field);
  if (type == c.field_types.end()) {
    std::string have;
    for (const auto& [n, t] : c.field_types) have += concat(have.empty() ? "" : ", ", n);
    throw usage_error(concat("checkpoint::export_safetensors(", dir.string(), "): no field '", field, "'; it has ", have));
  }
  std::vector<std::vector<std::byte>> data;
  data.reserve(c.tensors.size());
  safetensors_writer w;
  for (const auto& [name, t] : c.tensors) {
    data.push_back(c.read_global(field, name));
    w.add(name, type->second, std::vector<std::uint64_t>(t.shape.begin(), t.shape.end()), data.back());
  }
  w.set_metadata("format", "pt");  // what PyTorch's save_file writes: transformers reads it as PyTorch weights
  w.set_metadata("trident.checkpoint", dir.filename().string());
  w.set_metadata("trident.field", field);
  w.set_metadata("trident.step", c.get("step"));
  auto partial = out;
  partial += ".partial";
  w.write(partial, true);
  std::filesystem::rename(partial, out);
}

//! What import_safetensors did not use.
struct import_result {
  std::vector<std::string> unused;  // tensors of the file that the model does not have
};

//! Starts `zero` from the weights in a safetensors file of whole tensors (one that PyTorch's
//! safetensors.torch.save_file, export_safetensors or a converter wrote): every tensor of this
//! rank's model is read by name, its global shape checked, converted to float (F32, F64, F16,
//! BF16), cut as this rank's part and set as its parameters (master and working weights). The
//! optimizer's states and counters are left as they are: this is a start, not a resume.
//! Tensors of the file that the model lacks are returned, not an error (a state dict also
//! holds buffers); a tensor of the model missing from the file is a usage_error. Collective
//! over `comm` (every rank agrees that it worked).
//!
//!   auto r = trident::checkpoint::import_safetensors(grid.world(), zero, "gpt2.safetensors");
template <communicator Comm, class Zero>
import_result import_safetensors(Comm& comm, Zero& zero, const std::filesystem::path& file) {
  using namespace detail;
  import_result result;
  const auto& layout = zero.layout();
  agreed(comm, concat("checkpoint::import_safetensors(", file.string(), ")"), [&] {
    const safetensors_file f(file);
    std::vector<float> global, local;
    for (std::size_t i = 0; i < layout.tensors(); ++i) {
      const auto& spec = layout.spec_at(i);
      const tensor_entry* t = f.find(spec.name);
      if (t == nullptr) throw usage_error(concat("import_safetensors: ", file.string(), " has no tensor '", spec.name, "', which the model has"));
      const std::vector<std::uint64_t> want(spec.global.shape().begin(), spec.global.shape().end());
      if (t->shape != want)
        throw usage_error(concat("import_safetensors: ", file.string(), ": '", spec.name, "' has shape ", shape_text(t->shape),
                                 " there; the model's is ", shape_text(want)));
      global.resize(spec.global.numel());
      switch (t->type) {
        case dtype::float32: f.read(spec.name, std::span<float>(global)); break;
        case dtype::float64: convert_from<double>(f, spec.name, global); break;
        case dtype::float16: convert_from<fp16>(f, spec.name, global); break;
        case dtype::bfloat16: convert_from<bf16>(f, spec.name, global); break;
        default:
          throw usage_error(concat("import_safetensors: ", file.string(), ": '", spec.name, "' is ", name_of(t->type),
                                   "; expected a floating-point tensor (F32, F64, F16, BF16)"));
      }
      local.resize(spec.global.local_numel());
      take_part<float>(spec.global, spec.part, global, local);
      zero.set_parameter(spec.name, local);
    }
    for (const auto& t : f.header().tensors) {
      if (layout.placements().count(t.name) == 0) result.unused.push_back(t.name);
    }
  });
  return result;
}

}  // namespace trident::checkpoint
