// trident/offload/nvme.hpp — the optimizer's fp32 state in files: ZeRO-Infinity's NVMe tier.
//
// Synopsis
//   struct offload::nvme_options { buffers, direct }
//   std::shared_ptr<const placement> offload::nvme(directory, nvme_options = {})
//
// Each rank's state is one file in `directory`, made when the optimizer is constructed (its
// full size reserved with posix_fallocate, so a disk without room is an error then, not in the
// middle of a step) and removed when it is destroyed. A piece (one bucket's share of every
// state array) is one record of the file: each field padded to 4 KiB, so that one read and one
// write of O_DIRECT move it between the disk and an aligned host buffer without the page cache.
// A step is a pass over the pieces in bucket order: while the host optimizer updates piece b,
// piece b+1 (and b+2 with 3 buffers) is being read and piece b-1 written (ZeRO-Infinity's
// overlap of the optimizer with NVMe traffic).
//
// The I/O goes through io_uring (liburing) when this header is compiled with
// TRIDENT_HAS_LIBURING=1 and linked with -luring (Debian's liburing-dev), and the kernel allows
// it; otherwise through a thread of its own calling pread/pwrite: the same overlap, one system
// call per record. store_engine() says which one a store uses.
//
// What goes wrong is an error naming the file and what was expected, never silently wrong
// state: a directory that does not exist, is not a directory or cannot take files (at
// construction); a disk without room (at construction: fallocate; or a later write); a file
// truncated or replaced behind trident's back (checked by verify() before a step changes
// anything, and by every read); an I/O error. After a failed read or write the store refuses
// all further use: the step it failed in may have updated some pieces and not others, so the
// optimizer's state is lost and training resumes from a checkpoint.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/offload/store.hpp"

#if defined(TRIDENT_HAS_LIBURING) && TRIDENT_HAS_LIBURING
#include <liburing.h>
#endif

namespace trident::offload {

struct nvme_options {
  //! Pieces held in host memory at once: one updated, the others read ahead or written behind.
  //! At least 2; 3 lets a read and a write both overlap each update.
  std::size_t buffers = 3;
  //! O_DIRECT (no page cache: the bandwidth is the disk's, and the host memory stays the
  //! optimizer's). A filesystem that refuses it (tmpfs) gets buffered I/O instead.
  bool direct = true;
};

namespace detail {

inline constexpr std::size_t io_alignment = 4096;  // O_DIRECT: offsets, lengths and buffers

constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) / a * a; }

inline std::string errno_text(int e) { return std::strerror(e); }

//! Reads and writes queued to a file, completed in any order and awaited by ticket.
class io_queue {
 public:
  virtual ~io_queue() = default;
  virtual const char* name() const noexcept = 0;
  //! Queues a read (write = false) or write of len bytes at `offset`; returns a ticket.
  virtual std::uint64_t submit(bool write, int fd, void* data, std::size_t len, std::uint64_t offset) = 0;
  //! Waits for a ticket: the bytes moved, or -errno.
  virtual long wait(std::uint64_t ticket) = 0;
};

//! pread/pwrite on a thread of its own, in submission order.
class thread_queue final : public io_queue {
 public:
  thread_queue() : worker_([this] { run(); }) {}
  ~thread_queue() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  const char* name() const noexcept override { return "pread/pwrite thread"; }
  std::uint64_t submit(bool write, int fd, void* data, std::size_t len, std::uint64_t offset) override {
    std::lock_guard lock(mutex_);
    const std::uint64_t ticket = next_++;
    queue_.push_back({ticket, write, fd, data, len, offset});
    wake_.notify_all();
    return ticket;
  }
  long wait(std::uint64_t ticket) override {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return results_.count(ticket) != 0; });
    const long r = results_[ticket];
    results_.erase(ticket);
    return r;
  }

 private:
  struct op {
    std::uint64_t ticket;
    bool write;
    int fd;
    void* data;
    std::size_t len;
    std::uint64_t offset;
  };
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, nothing left
      const op o = queue_.front();
      queue_.pop_front();
      lock.unlock();
      const long r = o.write ? ::pwrite(o.fd, o.data, o.len, static_cast<off_t>(o.offset))
                             : ::pread(o.fd, o.data, o.len, static_cast<off_t>(o.offset));
      const long result = r < 0 ? -errno : r;
      lock.lock();
      results_[o.ticket] = result;
      done_cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  std::deque<op> queue_;
  std::map<std::uint64_t, long> results_;
  std::uint64_t next_ = 1;
  bool stop_ = false;
  std::thread worker_;
};

#if defined(TRIDENT_HAS_LIBURING) && TRIDENT_HAS_LIBURING
//! io_uring: submissions and completions through rings shared with the kernel, no thread.
class uring_queue final : public io_queue {
 public:
  //! Throws if the kernel refuses io_uring (seccomp in containers, io_uring_disabled).
  explicit uring_queue(unsigned entries = 64) {
    const int r = io_uring_queue_init(entries, &ring_, 0);
    if (r < 0) throw error(trident::detail::concat("io_uring_queue_init: ", errno_text(-r)), "offload::nvme");
  }
  ~uring_queue() override {
    while (in_flight_ > 0) reap();  // the kernel may still write into the caller's buffers
    io_uring_queue_exit(&ring_);
  }
  const char* name() const noexcept override { return "io_uring"; }
  std::uint64_t submit(bool write, int fd, void* data, std::size_t len, std::uint64_t offset) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // the submission ring is full: make room
      reap();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (write) io_uring_prep_write(sqe, fd, data, static_cast<unsigned>(len), offset);
    else io_uring_prep_read(sqe, fd, data, static_cast<unsigned>(len), offset);
    const std::uint64_t ticket = next_++;
    io_uring_sqe_set_data64(sqe, ticket);
    const int r = io_uring_submit(&ring_);
    if (r < 0) throw error(trident::detail::concat("io_uring_submit: ", errno_text(-r)), "offload::nvme");
    ++in_flight_;
    return ticket;
  }
  long wait(std::uint64_t ticket) override {
    while (results_.count(ticket) == 0) reap();
    const long r = results_[ticket];
    results_.erase(ticket);
    return r;
  }

 private:
  void reap() {
    io_uring_cqe* cqe = nullptr;
    int r;
    do r = io_uring_wait_cqe(&ring_, &cqe);
    while (r == -EINTR);
    if (r < 0) throw error(trident::detail::concat("io_uring_wait_cqe: ", errno_text(-r)), "offload::nvme");
    results_[io_uring_cqe_get_data64(cqe)] = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
  }
  io_uring ring_{};
  std::map<std::uint64_t, long> results_;
  std::uint64_t next_ = 1;
  std::size_t in_flight_ = 0;
};
#endif

inline std::unique_ptr<io_queue> make_io_queue() {
#if defined(TRIDENT_HAS_LIBURING) && TRIDENT_HAS_LIBURING
  try {
    return std::make_unique<uring_queue>();
  } catch (const error&) {
    // The kernel or a sandbox refuses io_uring: the thread does the same work.
  }
#endif
  return std::make_unique<thread_queue>();
}

//! One rank's state in one file, records of pieces moved through a few aligned host buffers.
class nvme_store final : public state_store {
 public:
  nvme_store(const store_request& r, const std::filesystem::path& dir, const nvme_options& o)
      : categories_(r.fields), pieces_(r.pieces), ledger_(current_ledger()) {
    check_request(r, "offload::nvme");
    TRIDENT_EXPECT(o.buffers >= 2, "offload::nvme: ", o.buffers, " buffers; expected at least 2 (one updated, one in flight)");
    // Records: each field of a piece padded to the I/O alignment.
    std::size_t at = 0, largest = 0;
    for (const piece& p : pieces_) {
      offsets_.push_back(at);
      const std::size_t record = stride(p) * categories_.size();
      at += record;
      largest = std::max(largest, record);
    }
    file_bytes_ = at;
    open_file(dir, r.rank, o.direct);
    try {
      reserve(r.rank);
      for (const piece& p : pieces_)
        for (mem_category c : categories_) charge(space_kind::nvme, c, stride(p));
      slots_.resize(std::min(o.buffers, std::max<std::size_t>(pieces_.size(), 1)));
      for (slot& s : slots_) {
        s.bytes = std::max(largest, io_alignment);
        s.data = static_cast<std::byte*>(std::aligned_alloc(io_alignment, s.bytes));
        if (s.data == nullptr) throw std::bad_alloc();
        charge(space_kind::host, mem_category::communication, s.bytes);
      }
      pointers_.resize(categories_.size());
      queue_ = make_io_queue();
    } catch (...) {
      release_resources();
      throw;
    }
  }
  ~nvme_store() override { release_resources(); }

  offload::tier where() const noexcept override { return tier::nvme; }
  //! "io_uring" or "pread/pwrite thread".
  const char* store_engine() const noexcept { return queue_->name(); }
  const std::filesystem::path& path() const noexcept { return path_; }
  bool direct() const noexcept { return direct_; }
  std::size_t file_bytes() const noexcept { return file_bytes_; }

  void verify() const override {
    usable("verify");
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw error(trident::detail::concat("offload::nvme: fstat(", path_.string(), "): ", errno_text(errno)), "verify");
    if (static_cast<std::size_t>(st.st_size) < file_bytes_)
      throw error(trident::detail::concat("offload::nvme: ", path_.string(), " holds ", st.st_size, " bytes; expected ", file_bytes_,
                                 ": it was truncated behind trident's back, and this rank's optimizer state with it (resume from "
                                 "a checkpoint)"),
                  "verify");
  }

  void begin_pass(std::span<const std::size_t> order) override {
    usable("begin_pass");
    drain();  // a pass left open (an exception between begin_pass and end_pass) ends here
    for (std::size_t p : order) TRIDENT_EXPECT(p < pieces_.size(), "offload::nvme: piece ", p, " of ", pieces_.size());
    order_.assign(order.begin(), order.end());
    next_read_ = next_acquire_ = 0;
    read_ahead();
  }

  float* const* acquire(std::size_t p) override {
    usable("acquire");
    TRIDENT_EXPECT(next_acquire_ < order_.size() && order_[next_acquire_] == p, "offload::nvme: acquire(", p,
                   ") out of the pass's order");
    if (next_read_ == next_acquire_) issue_read(free_slot());  // no buffer was free before
    slot& s = slot_of(p, slot::reading);
    finish(s);
    s.state = slot::held;
    ++next_acquire_;
    for (std::size_t f = 0; f < categories_.size(); ++f)
      pointers_[f] = reinterpret_cast<float*>(s.data + f * stride(pieces_[p]));
    return pointers_.data();
  }

  void release(std::size_t p, bool modified) override {
    usable("release");
    slot& s = slot_of(p, slot::held);
    if (modified) {
      s.state = slot::writing;
      s.ticket = queue_->submit(true, fd_, s.data, record(p), offsets_[p]);
    } else {
      s.state = slot::idle;
    }
    read_ahead();
  }

  //! Also ends a pass early (pieces never acquired are not written).
  void end_pass() override {
    usable("end_pass");
    drain();
  }

  float* resident(std::size_t) noexcept override { return nullptr; }

 private:
  struct slot {
    enum state_t { idle, reading, held, writing } state = idle;
    std::byte* data = nullptr;
    std::size_t bytes = 0;
    std::size_t piece = 0;
    std::uint64_t ticket = 0;
  };

  std::size_t stride(const piece& p) const noexcept { return align_up(p.size * sizeof(float), io_alignment); }
  std::size_t record(std::size_t p) const noexcept { return stride(pieces_[p]) * categories_.size(); }

  void charge(space_kind s, mem_category c, std::size_t bytes) {
    ledger_->charge(s, c, bytes);
    charges_.push_back({s, c, bytes});
  }

  void open_file(const std::filesystem::path& dir, int rank, bool direct) {
    std::error_code ec;
    const auto status = std::filesystem::status(dir, ec);
    TRIDENT_EXPECT(std::filesystem::exists(status), "offload::nvme: the directory '", dir.string(), "' does not exist");
    TRIDENT_EXPECT(std::filesystem::is_directory(status), "offload::nvme: '", dir.string(), "' is not a directory");
    static std::atomic<unsigned> counter{0};
    path_ = dir / trident::detail::concat("trident-offload-", ::getpid(), "-", counter.fetch_add(1), "-rank", rank, ".state");
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    fd_ = direct ? ::open(path_.c_str(), flags | O_DIRECT, 0600) : -1;
    direct_ = fd_ >= 0;
    if (fd_ < 0 && (!direct || errno == EINVAL)) fd_ = ::open(path_.c_str(), flags, 0600);  // tmpfs: no O_DIRECT
    if (fd_ < 0) {
      const int e = errno;
      throw usage_error(trident::detail::concat("offload::nvme: cannot create ", path_.string(), ": ", errno_text(e),
                                       e == EACCES || e == EROFS || e == EPERM ? " (the directory is not writable)" : ""),
                        "offload::nvme");
    }
  }

  void reserve(int rank) {
    if (file_bytes_ == 0) return;
    const int r = ::posix_fallocate(fd_, 0, static_cast<off_t>(file_bytes_));
    if (r == 0) return;
    if (r == ENOSPC || r == EFBIG || r == EDQUOT)
      throw usage_error(trident::detail::concat("offload::nvme: no room for rank ", rank, "'s ", file_bytes_,
                                       " bytes of optimizer state in '", path_.parent_path().string(), "': ", errno_text(r)),
                        "offload::nvme");
    // A filesystem without fallocate: a sparse file reads as zeros all the same.
    if (::ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0)
      throw error(trident::detail::concat("offload::nvme: ftruncate(", path_.string(), "): ", errno_text(errno)), "offload::nvme");
  }

  slot& slot_of(std::size_t p, slot::state_t state) {
    for (slot& s : slots_)
      if (s.state == state && s.piece == p) return s;
    throw usage_error(trident::detail::concat("offload::nvme: piece ", p, " is not ", state == slot::held ? "acquired" : "read ahead"),
                      "offload::nvme");
  }

  // A buffer for the next read: an idle one, else the one whose write was issued first.
  slot& free_slot() {
    for (slot& s : slots_)
      if (s.state == slot::idle) return s;
    slot* oldest = nullptr;
    for (slot& s : slots_)
      if (s.state == slot::writing && (oldest == nullptr || s.ticket < oldest->ticket)) oldest = &s;
    TRIDENT_EXPECT(oldest != nullptr, "offload::nvme: every buffer is in use (acquire each piece before the next)");
    finish(*oldest);
    oldest->state = slot::idle;
    return *oldest;
  }

  void issue_read(slot& s) {
    const std::size_t p = order_[next_read_++];
    s.piece = p;
    s.state = slot::reading;
    s.ticket = queue_->submit(false, fd_, s.data, record(p), offsets_[p]);
  }

  void drain() {
    for (slot& s : slots_)
      if (s.state == slot::writing || s.state == slot::reading) finish(s);
    for (slot& s : slots_) s.state = slot::idle;
    order_.clear();
    next_read_ = next_acquire_ = 0;
  }

  // Keeps up to buffers - 1 reads ahead of the update.
  void read_ahead() {
    while (next_read_ < order_.size() && next_read_ - next_acquire_ < slots_.size() - 1) issue_read(free_slot());
  }

  // Waits for a slot's read or write; a short transfer is finished synchronously, end of file
  // (a truncated file) and errors poison the store.
  void finish(slot& s) {
    const bool write = s.state == slot::writing;
    const std::size_t len = record(s.piece), off = offsets_[s.piece];
    long done = queue_->wait(s.ticket);
    s.state = slot::idle;  // its ticket is spent, whatever follows
    if (len == 0 && done >= 0) return;  // an empty piece moves no bytes: not an end of file
    std::size_t moved = 0;
    while (done > 0 && moved + static_cast<std::size_t>(done) < len) {
      moved += static_cast<std::size_t>(done);
      done = write ? ::pwrite(fd_, s.data + moved, len - moved, static_cast<off_t>(off + moved))
                   : ::pread(fd_, s.data + moved, len - moved, static_cast<off_t>(off + moved));
      if (done < 0) done = -errno;
    }
    if (done > 0) return;
    const std::string what = done == 0 ? trident::detail::concat("end of file at byte ", off + moved, " of a ", file_bytes_,
                                                        "-byte file: it was truncated behind trident's back")
                                       : errno_text(static_cast<int>(-done));
    broken_ = trident::detail::concat("offload::nvme: ", write ? "writing" : "reading", " piece ", s.piece, " (", len, " bytes at ", off,
                             ") of ", path_.string(), ": ", what,
                             ". This rank's optimizer state is lost (the step may have updated some pieces and not others): "
                             "resume from a checkpoint");
    throw error(broken_, write ? "offload::nvme write" : "offload::nvme read");
  }

  void usable(const char* call) const {
    if (!broken_.empty()) throw error(trident::detail::concat(call, ": the store failed before: ", broken_), "offload::nvme");
  }

  void release_resources() noexcept {
    if (queue_) {
      for (slot& s : slots_)
        if (s.state == slot::reading || s.state == slot::writing) (void)queue_->wait(s.ticket);
      queue_.reset();
    }
    for (slot& s : slots_) std::free(s.data);
    slots_.clear();
    for (const auto& c : charges_) ledger_->discharge(c.space, c.category, c.bytes);
    charges_.clear();
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
      fd_ = -1;
    }
  }

  struct charged {
    space_kind space;
    mem_category category;
    std::size_t bytes;
  };
  std::vector<mem_category> categories_;
  std::vector<piece> pieces_;
  std::vector<std::size_t> offsets_;
  std::size_t file_bytes_ = 0;
  std::shared_ptr<memory_ledger> ledger_;
  std::vector<charged> charges_;
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
  std::vector<slot> slots_;
  std::vector<float*> pointers_;
  std::unique_ptr<io_queue> queue_;
  std::vector<std::size_t> order_;
  std::size_t next_read_ = 0, next_acquire_ = 0;
  std::string broken_;
};

class nvme_placement final : public placement {
 public:
  nvme_placement(std::filesystem::path dir, nvme_options o) : dir_(std::move(dir)), options_(o) {}
  offload::tier where() const noexcept override { return tier::nvme; }
  std::unique_ptr<state_store> make(const store_request& r) const override {
    return std::make_unique<nvme_store>(r, dir_, options_);
  }

 private:
  std::filesystem::path dir_;
  nvme_options options_;
};

}  // namespace detail

//! The optimizer's fp32 state in files under `directory` (one per rank, removed with the
//! optimizer): ZeRO-Infinity's NVMe tier. The directory is checked here; each rank's file is
//! made, at its full size, when the optimizer is constructed.
//!
//!   zero::zero_options o;
//!   o.offload = trident::offload::nvme("/mnt/nvme0/offload");
//!   zero::zero_optimizer<3, optim::adamw, local_comm, mixed_precision<bf16>> zero(comm, spec, adamw, o);
inline std::shared_ptr<const placement> nvme(std::filesystem::path directory, nvme_options options = {}) {
  std::error_code ec;
  const auto status = std::filesystem::status(directory, ec);
  TRIDENT_EXPECT(std::filesystem::exists(status), "offload::nvme: the directory '", directory.string(), "' does not exist");
  TRIDENT_EXPECT(std::filesystem::is_directory(status), "offload::nvme: '", directory.string(), "' is not a directory");
  TRIDENT_EXPECT(options.buffers >= 2, "offload::nvme: ", options.buffers,
                 " buffers; expected at least 2 (one updated, one in flight)");
  return std::make_shared<detail::nvme_placement>(std::move(directory), options);
}

}  // namespace trident::offload
