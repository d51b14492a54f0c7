// trident-requires: mpi
// trident/comm/mpi.hpp — the MPI backend of the communicator concept.
//
// Synopsis
//   class mpi_environment        RAII MPI_Init_thread / MPI_Finalize (a no-op when MPI is already up)
//   class mpi_request            an operation in flight: wait(), test(); waits when destroyed
//   class mpi_comm               collectives<mpi_comm, host_space> over a private MPI_Comm
//     static mpi_comm world()                  a duplicate of MPI_COMM_WORLD
//     explicit mpi_comm(MPI_Comm[, bool])      a duplicate of any communicator
//     MPI_Comm native() const; int rank() const; int size() const
//     void check_arguments(bool) / bool check_arguments() const    the cross-rank check, on by default
//     execute/start (collective_call | span<const p2p_op>), barrier(), synchronize(), split()
//
// Launch with mpirun, or with Slurm's srun (`srun --mpi=pmix`: Debian's OpenMPI wires up through
// PMIx; the comm.srun test runs the whole MPI suite that way).
//
// Needs MPI: link trident::mpi (which defines TRIDENT_HAS_MPI). Host memory only: hand device
// memory to nccl_comm, or to a CUDA-aware MPI through a space_span you vouch for.
//
// How the communicator's contract maps onto MPI:
//   * every communicator is a duplicate with MPI_ERRORS_RETURN, so failures come back as
//     trident::mpi_error (MPI's error string, the call) instead of aborting the job, and
//     trident's traffic never matches a message of the application's own communicators;
//   * avg is MPI_SUM followed by detail::host_divide on the result (on the root only, for reduce):
//     MPI has no average; over fp16/bf16 the inputs are scaled by 1/n into a copy first and
//     summed (detail::premultiplied_avg), like the other backends, so the sum cannot overflow;
//   * fp16 and bf16 are reduced by user-defined operations (created once per process, freed when
//     MPI_Finalize destroys MPI_COMM_SELF) that call detail::host_combine: MPI 3.1 has no 16-bit
//     floating-point types, and its predefined ops refuse the opaque two-byte types of to_mpi();
//     so are max and min over float32/float64, because MPI_MAX may keep or drop a NaN depending
//     on which rank holds it, and trident's host backends propagate NaN from any rank
//     (mpi_comm::max_min_nan; NCCL drops it instead, see nan_in_max_min);
//   * counts are MPI `int`s: a call of more than INT_MAX elements is a usage_error, never a
//     silently truncated count;
//   * MPI trusts every rank to pass the same kind, count, type, op and root, and a count that
//     differs lets it write past the smaller buffer (Open MPI 4.1 corrupts the heap with 8
//     against 8M floats). So each collective and barrier first compares them across ranks in one
//     small all-reduce and throws usage_error on every rank on a mismatch: on by default;
//     TRIDENT_CHECK_COLLECTIVES=0 or mpi_comm(comm, false) turns it off for speed, and then a
//     mismatch hangs until the watchdog ends the job, or corrupts memory first.
#pragma once

#include "trident/core/config.hpp"

#if !TRIDENT_HAS_MPI
#error "trident/comm/mpi.hpp needs MPI: link the trident::mpi target (it defines TRIDENT_HAS_MPI=1)"
#endif

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/comm/host_reduce.hpp"
#include "trident/comm/mpi/base.hpp"
#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/memory_space.hpp"

namespace trident {

namespace detail {

//! Seconds from an environment variable (a whole number >= 0), or `fallback` when unset.
inline std::chrono::milliseconds mpi_seconds_from_environment(const char* name, std::chrono::milliseconds fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long long seconds = std::strtoll(value, &end, 10);
  if (*end != '\0' || seconds < 0)
    throw usage_error(concat("environment variable ", name, "='", value, "' is not a whole number of seconds >= 0"));
  return std::chrono::seconds(seconds);
}

//! What this process knows about the job's health at exit: whether a trident MPI call failed
//! here (the peers may be waiting for this rank inside a collective it abandoned).
struct mpi_exit_state {
  std::atomic<bool> failed{false};
  std::atomic<const char*> last_failure{nullptr};
  // A failure nobody was told of: a request that failed and was destroyed without wait().
  std::atomic<bool> lost{false};
  std::atomic<const char*> lost_failure{nullptr};
  static mpi_exit_state& instance() noexcept {
    static mpi_exit_state state;
    return state;
  }
};

// MPI cannot cancel a collective, so a wait that a peer will never end (a different collective,
// a rank that left) is bounded by a watchdog: one thread per process that looks at every
// blocking trident MPI call in progress and ends the job with MPI_Abort, after saying which
// call on which rank waited how long, once one exceeds its communicator's timeout. The fast
// path pays two stores to this thread's slot.
class mpi_watchdog {
 public:
  struct slot {
    std::atomic<std::int64_t> since_ns{0};  // steady-clock start of the call in progress; 0 = none
    std::atomic<std::int64_t> limit_ms{0};
    std::atomic<const char*> what{nullptr};
    std::atomic<int> rank{-1};
  };

  static mpi_watchdog& instance() {
    static mpi_watchdog dog;
    return dog;
  }

  //! This thread's slot (made on first use, kept for the life of the process).
  slot& mine() {
    thread_local slot* s = nullptr;
    if (s == nullptr) {
      std::lock_guard lock(mutex_);
      s = &slots_.emplace_back();
      if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
    }
    return *s;
  }

  //! Stops the thread (before MPI_Finalize: it must not call MPI afterwards).
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }
  ~mpi_watchdog() { stop(); }

 private:
  mpi_watchdog() = default;

  void watch() {
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const auto now = std::chrono::steady_clock::now().time_since_epoch();
      for (const slot& s : slots_) {
        const std::int64_t since = s.since_ns.load(std::memory_order_acquire);
        const std::int64_t limit = s.limit_ms.load(std::memory_order_relaxed);
        if (since == 0 || limit <= 0) continue;
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - std::chrono::nanoseconds(since));
        if (waited.count() < limit) continue;
        const char* what = s.what.load(std::memory_order_relaxed);
        std::fprintf(stderr,
                     "trident: rank %d waited %lld ms in %s (timeout %lld ms): a peer is not taking part (a different "
                     "collective or argument, or it has left). MPI cannot cancel a collective, so the job is ended "
                     "with MPI_Abort instead of hanging. TRIDENT_MPI_TIMEOUT (seconds, 0 = off) sets the timeout; "
                     "the argument check (on unless TRIDENT_CHECK_COLLECTIVES=0) turns mismatches into errors.\n",
                     s.rank.load(std::memory_order_relaxed), static_cast<long long>(waited.count()), what ? what : "an MPI call",
                     static_cast<long long>(limit));
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
        return;
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::list<slot> slots_;  // stable addresses
  std::thread thread_;
  bool stop_ = false;
};

//! Marks one blocking MPI call as in progress on this thread for the watchdog.
class mpi_deadline {
 public:
  mpi_deadline(const char* what, int rank, std::chrono::milliseconds limit) {
    if (limit.count() <= 0) return;
    slot_ = &mpi_watchdog::instance().mine();
    slot_->what.store(what, std::memory_order_relaxed);
    slot_->rank.store(rank, std::memory_order_relaxed);
    slot_->limit_ms.store(limit.count(), std::memory_order_relaxed);
    slot_->since_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
  }
  ~mpi_deadline() {
    if (slot_) slot_->since_ns.store(0, std::memory_order_release);
  }
  mpi_deadline(const mpi_deadline&) = delete;
  mpi_deadline& operator=(const mpi_deadline&) = delete;

 private:
  mpi_watchdog::slot* slot_ = nullptr;
};

}  // namespace detail

//! Initialises MPI for the lifetime of the object (MPI_Init_thread asking for
//! MPI_THREAD_MULTIPLE; provided() says what the library granted) and finalises it on
//! destruction. When MPI is already initialised (by the application, or by another
//! environment) it does nothing and does not finalise either, so libraries can create one
//! defensively.
//!
//!   int main(int argc, char** argv) {
//!     trident::mpi_environment env(argc, argv);
//!     auto world = trident::mpi_comm::world();
//!     ...
//!   }   // communicators first, then MPI_Finalize
//!
//! Leaving after an error. When a trident MPI call failed on this rank (or an exception is
//! unwinding through the environment), the peers may be waiting for this rank inside a
//! collective it abandoned, and MPI_Finalize would wait for them for good. So every rank first
//! meets the others in a non-blocking barrier: a healthy job passes it at once and finalises; a
//! rank that saw a failure waits for it at most TRIDENT_MPI_EXIT_TIMEOUT seconds (default 10)
//! and otherwise ends the job with MPI_Abort, saying why, so the peers do not hang. A failure
//! that was never raised (a failed request destroyed without wait()) ends the job with
//! MPI_Abort even when every rank reached the end, saying which call failed.
class mpi_environment {
 public:
  mpi_environment() : mpi_environment(nullptr, nullptr) {}
  mpi_environment(int& argc, char**& argv) : mpi_environment(&argc, &argv) {}

  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;

  ~mpi_environment() {
    if (!owner_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    auto& state = detail::mpi_exit_state::instance();
    const bool failed = state.failed.load() || std::uncaught_exceptions() > 0;
    if (exit_comm_ != MPI_COMM_NULL && !meet_at_exit(failed)) {
      const char* why = state.last_failure.load();
      end_job(" leaves after an error (", why ? why : "an exception", ") while other ranks have not reached the end within ",
              exit_timeout_.count() / 1000, " s; they may be waiting for it in a collective, so the job is ended with "
              "MPI_Abort instead of hanging in MPI_Finalize (TRIDENT_MPI_EXIT_TIMEOUT sets the wait)");
    }
    if (state.lost.load()) {
      // Every rank got here, so nobody hangs; but an error that was never raised must not let
      // the job pass for a success.
      const char* why = state.lost_failure.load();
      end_job(": an asynchronous operation (", why ? why : "unknown", ") failed and its request was destroyed without "
              "wait(), so its error was never raised; the job is ended with MPI_Abort so that it does not pass for a "
              "success (call wait() on every request to handle such errors)");
    }
    detail::mpi_watchdog::instance().stop();
    if (exit_comm_ != MPI_COMM_NULL) MPI_Comm_free(&exit_comm_);
    MPI_Finalize();  // a destructor cannot report a failure; MPI prints its own
  }

  //! The thread level MPI granted: MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE.
  int provided() const noexcept { return provided_; }
  //! True when this object initialised MPI (and will finalise it).
  bool owns_mpi() const noexcept { return owner_; }

 private:
  mpi_environment(int* argc, char*** argv) {
    int initialized = 0;
    detail::mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized) {
      detail::mpi_check(MPI_Query_thread(&provided_), "MPI_Query_thread");
      return;
    }
    int finalized = 0;
    detail::mpi_check(MPI_Finalized(&finalized), "MPI_Finalized");
    if (finalized) throw usage_error("mpi_environment: MPI was already finalised and cannot be initialised again");
    exit_timeout_ = detail::mpi_seconds_from_environment("TRIDENT_MPI_EXIT_TIMEOUT", std::chrono::seconds(10));
    detail::mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_), "MPI_Init_thread");
    owner_ = true;
    detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &exit_comm_), "MPI_Comm_dup");
  }

  // Says why on stderr, naming this rank, and ends the whole job.
  template <class... Parts>
  static void end_job(const Parts&... parts) noexcept {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      const std::string line = detail::concat("trident: rank ", rank, parts..., "\n");
      std::fputs(line.c_str(), stderr);
    } catch (...) {
      std::fputs("trident: ending the job with MPI_Abort\n", stderr);
    }
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  // Every rank enters a non-blocking barrier; a rank that saw a failure waits for it at most
  // exit_timeout_. Returns whether it completed.
  bool meet_at_exit(bool failed) noexcept {
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(exit_comm_, &request) != MPI_SUCCESS) return !failed;
    const auto deadline = std::chrono::steady_clock::now() + exit_timeout_;
    for (;;) {
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return !failed;
      if (done) return true;
      if (failed && std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  int provided_ = MPI_THREAD_SINGLE;
  bool owner_ = false;
  MPI_Comm exit_comm_ = MPI_COMM_NULL;
  std::chrono::milliseconds exit_timeout_{std::chrono::seconds(10)};
};

namespace detail {

//! An MPI count from a size_t, or a usage_error: MPI 3.1 counts are ints.
inline int mpi_count(std::size_t n, const char* what) {
  TRIDENT_EXPECT(n <= static_cast<std::size_t>(INT_MAX), what, ": ", n, " elements exceed what one MPI call can carry (",
                 INT_MAX, "); split the operation");
  return static_cast<int>(n);
}

// ---- fp16 / bf16 reductions ------------------------------------------------------------------
// One user-defined op per (half type, reduction), so the element type is known statically and
// does not depend on which datatype handle an MPI implementation passes to the callback.

template <class T, reduce_op Op>
void mpi_half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  // MPI's contract: inout[i] = in[i] op inout[i]; host_combine allows dst to alias an operand.
  combine_typed<T, Op>(static_cast<T*>(inout), static_cast<const T*>(in), static_cast<const T*>(inout),
                       static_cast<std::size_t>(*len));
}

struct mpi_half_ops {
  // [0] fp16, [1] bf16, [2] float32, [3] float64; by reduce_op sum, max, min, prod (avg uses sum).
  MPI_Op ops[4][4] = {};

  MPI_Op get(dtype t, reduce_op op) const noexcept {
    const int type = t == dtype::float16 ? 0 : t == dtype::bfloat16 ? 1 : t == dtype::float32 ? 2 : 3;
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: return ops[type][0];
      case reduce_op::max: return ops[type][1];
      case reduce_op::min: return ops[type][2];
      case reduce_op::prod: return ops[type][3];
    }
    return MPI_OP_NULL;
  }
};

template <class T>
void make_half_ops(MPI_Op (&ops)[4]) {
  detail::mpi_check(MPI_Op_create(&mpi_half_reduce<T, reduce_op::sum>, 1, &ops[0]), "MPI_Op_create(sum)");
  detail::mpi_check(MPI_Op_create(&mpi_half_reduce<T, reduce_op::max>, 1, &ops[1]), "MPI_Op_create(max)");
  detail::mpi_check(MPI_Op_create(&mpi_half_reduce<T, reduce_op::min>, 1, &ops[2]), "MPI_Op_create(min)");
  detail::mpi_check(MPI_Op_create(&mpi_half_reduce<T, reduce_op::prod>, 1, &ops[3]), "MPI_Op_create(prod)");
}

// MPI_Finalize frees MPI_COMM_SELF first, which runs the delete callbacks of its attributes:
// the standard place to release objects that must go before MPI does.
inline int free_half_ops(MPI_Comm, int, void* attribute, void*) {
  auto* table = static_cast<mpi_half_ops*>(attribute);
  for (auto& by_type : table->ops)
    for (MPI_Op& op : by_type)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  return MPI_SUCCESS;
}

//! The user-defined ops for fp16 and bf16, made on first use (thread-safe static), freed at
//! MPI_Finalize.
inline const mpi_half_ops& half_ops() {
  static mpi_half_ops table = [] {
    mpi_half_ops t;
    make_half_ops<fp16>(t.ops[0]);
    make_half_ops<bf16>(t.ops[1]);
    make_half_ops<float>(t.ops[2]);
    make_half_ops<double>(t.ops[3]);
    return t;
  }();
  static const bool registered = [] {
    int keyval = MPI_KEYVAL_INVALID;
    detail::mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_ops, &keyval, nullptr),
                      "MPI_Comm_create_keyval");
    detail::mpi_check(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, &table), "MPI_Comm_set_attr(MPI_COMM_SELF)");
    return true;
  }();
  (void)registered;
  return table;
}

//! The MPI_Op for a reduction of dtype t.
inline MPI_Op mpi_op(dtype t, reduce_op op) {
  if (t == dtype::float16 || t == dtype::bfloat16) return half_ops().get(t, op);
  if ((t == dtype::float32 || t == dtype::float64) && (op == reduce_op::max || op == reduce_op::min))
    return half_ops().get(t, op);  // NaN-propagating, unlike MPI_MAX / MPI_MIN
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return MPI_SUM;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    case reduce_op::prod: return MPI_PROD;
  }
  throw usage_error(concat("unknown reduce_op ", static_cast<int>(op)));
}

// ---- completion ------------------------------------------------------------------------------

//! What remains to do on the host once MPI reports an operation complete.
struct mpi_completion {
  dtype type{};
  //! avg: divide `count` elements of the result by `divisor` (0: no division).
  void* result = nullptr;
  std::size_t count = 0;
  int divisor = 0;
  //! In-place reduce_scatter: MPI wrote the result here (MPI forbids overlapping buffers);
  //! it is copied to `copy_to`, this rank's chunk of the input.
  std::vector<std::byte> staging;
  //! fp16/bf16 avg: this rank's input scaled by 1/n, what MPI sums (kept until completion).
  std::vector<std::byte> prescaled;
  void* copy_to = nullptr;
  //! Grouped receives: what each expected, so that a short message is an error, not silence.
  struct expected_receive {
    std::size_t index;  // into the request's handles
    std::size_t count;
    MPI_Datatype type;
    int peer;
  };
  std::vector<expected_receive> receives;

  bool needs_statuses() const noexcept { return !receives.empty(); }

  void run(const MPI_Status* statuses) {
    void* where = staging.empty() ? result : static_cast<void*>(staging.data());
    if (divisor > 1 && count > 0) host_divide(type, where, count, divisor);
    if (!staging.empty()) std::memcpy(copy_to, staging.data(), staging.size());
    for (const auto& r : receives) {
      int got = 0;
      mpi_check(MPI_Get_count(&statuses[r.index], r.type, &got), "MPI_Get_count");
      TRIDENT_EXPECT(got >= 0 && static_cast<std::size_t>(got) == r.count, "exchange: a receive of ", r.count,
                     " elements from rank ", r.peer, " got a message of ", got,
                     " elements; both sides must agree on the size");
    }
  }

  //! Turns a failed wait/test into the right exception: a message longer than its receive is
  //! the caller's mistake (usage_error); anything else is MPI's (mpi_error).
  [[noreturn]] void fail(int status, const MPI_Status* statuses, std::size_t n, const char* operation) const {
    int code = status;
    std::size_t failed_index = n;
    if (status == MPI_ERR_IN_STATUS && statuses != nullptr) {
      for (std::size_t i = 0; i < n; ++i) {
        if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
          code = statuses[i].MPI_ERROR;
          failed_index = i;
          break;
        }
      }
    }
    int error_class = code;
    MPI_Error_class(code, &error_class);
    if (error_class == MPI_ERR_TRUNCATE) {
      for (const auto& r : receives) {
        if (failed_index == n || r.index == failed_index) {
          throw usage_error(concat("exchange: the message from rank ", r.peer, " is longer than its receive of ",
                                   r.count, " elements; both sides must agree on the size"),
                            operation);
        }
      }
    }
    mpi_check(code, operation);  // throws: code is never MPI_SUCCESS here
    throw mpi_error(code, "MPI reported a failure", operation);
  }
};

//! Releases requests that will not be waited for (a wait failed, or posting a group failed
//! half way): receives are cancelled, sends finish in the background. Waiting instead could
//! hang forever on a peer that has already given up.
inline void abandon(std::vector<MPI_Request>& handles, const std::vector<mpi_completion::expected_receive>& receives) noexcept {
  for (const auto& r : receives)
    if (r.index < handles.size() && handles[r.index] != MPI_REQUEST_NULL) MPI_Cancel(&handles[r.index]);
  for (MPI_Request& h : handles)
    if (h != MPI_REQUEST_NULL) MPI_Request_free(&h);
  handles.clear();
}

//! The default of mpi_comm::check_arguments(): on, unless TRIDENT_CHECK_COLLECTIVES=0. Any other
//! value counts as on, so a typo never drops the safety net.
inline bool check_collectives_from_environment() noexcept {
  const char* value = std::getenv("TRIDENT_CHECK_COLLECTIVES");
  return value == nullptr || std::string_view(value) != "0";
}

}  // namespace detail

class mpi_comm;

//! An MPI operation in flight (one non-blocking collective, or a group of sends and receives).
//! wait() blocks until it completes, finishes it on the host (avg's division, ...) and throws
//! on failure, at most once; test() polls. Destroying an unfinished request waits for it, so
//! no MPI request outlives the buffers it writes to.
//!
//!   auto pending = world.all_reduce_async(grads, trident::reduce_op::avg);
//!   compute_something_else();
//!   pending.wait();   // grads hold the average now
class mpi_request {
 public:
  //! An empty request: complete, wait() does nothing.
  mpi_request() noexcept = default;

  mpi_request(mpi_request&& other) noexcept
      : handles_(std::move(other.handles_)), after_(std::move(other.after_)), pending_(std::exchange(other.pending_, false)),
        what_(other.what_), rank_(other.rank_), limit_(other.limit_) {}

  //! Finishes the request being replaced (as its destructor would) before taking `other`.
  mpi_request& operator=(mpi_request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      handles_ = std::move(other.handles_);
      after_ = std::move(other.after_);
      pending_ = std::exchange(other.pending_, false);
      what_ = other.what_;
      rank_ = other.rank_;
      limit_ = other.limit_;
    }
    return *this;
  }

  mpi_request(const mpi_request&) = delete;
  mpi_request& operator=(const mpi_request&) = delete;

  ~mpi_request() { finish_quietly(); }

  //! Blocks until complete; throws mpi_error (or usage_error for a receive of the wrong size).
  //! A second call does nothing.
  void wait() {
    if (!pending_) return;
    pending_ = false;  // at most one report, even when this throws
    std::vector<MPI_Status> statuses(handles_.size());
    int status = MPI_SUCCESS;
    {
      const detail::mpi_deadline deadline(what_, rank_, limit_);
      status = MPI_Waitall(static_cast<int>(handles_.size()), handles_.data(), statuses.data());
    }
    try {
      complete(status, statuses, "MPI_Waitall");
    } catch (...) {
      detail::mpi_exit_state::instance().last_failure.store(what_);
      detail::mpi_exit_state::instance().failed.store(true);
      throw;
    }
  }

  //! True once the operation has completed (and been finished on the host); never blocks.
  bool test() {
    if (!pending_) return true;
    std::vector<MPI_Status> statuses(handles_.size());
    int flag = 0;
    const int status = MPI_Testall(static_cast<int>(handles_.size()), handles_.data(), &flag, statuses.data());
    if (status == MPI_SUCCESS && !flag) return false;
    pending_ = false;
    complete(status, statuses, "MPI_Testall");
    return true;
  }

 private:
  friend class mpi_comm;

  void complete(int status, const std::vector<MPI_Status>& statuses, const char* operation) {
    if (status != MPI_SUCCESS) {
      detail::abandon(handles_, after_.receives);
      after_.fail(status, statuses.data(), statuses.size(), operation);
    }
    handles_.clear();
    after_.run(statuses.data());
  }

  void finish_quietly() noexcept {
    if (!pending_) return;
    pending_ = false;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // nothing can be waited for any more
    try {
      const detail::mpi_deadline deadline(what_, rank_, limit_);
      std::vector<MPI_Status> statuses(handles_.size());
      if (MPI_Waitall(static_cast<int>(handles_.size()), handles_.data(), statuses.data()) == MPI_SUCCESS) {
        after_.run(statuses.data());
      } else {
        detail::abandon(handles_, after_.receives);
        throw mpi_error(MPI_ERR_OTHER, "failed");
      }
    } catch (...) {
      // A destructor must not throw, and the error was the caller's to collect with wait(); it
      // is not forgotten either: the job counts as failed at exit (see mpi_environment).
      auto& state = detail::mpi_exit_state::instance();
      state.last_failure.store(what_);
      state.lost_failure.store(what_);
      state.failed.store(true);
      state.lost.store(true);
    }
  }

  std::vector<MPI_Request> handles_;
  detail::mpi_completion after_;
  bool pending_ = false;
  // For the watchdog while waiting: what this is, on which rank, and the communicator's timeout.
  const char* what_ = "an asynchronous operation";
  int rank_ = -1;
  std::chrono::milliseconds limit_{0};
};

//! A communicator over MPI, for host memory. It owns a duplicate of the MPI_Comm it is built
//! from (so its messages never mix with the application's) with MPI_ERRORS_RETURN (so every
//! failure is a trident::mpi_error). Collectives complete on return; the *_async forms return
//! an mpi_request.
//!
//!   trident::mpi_environment env(argc, argv);
//!   auto world = trident::mpi_comm::world();
//!   std::vector<float> grads(n);
//!   world.all_reduce(grads, trident::reduce_op::avg);
//!   auto node = world.split(world.rank() / 8, world.rank());   // groups of 8
//!
//! Every rank must call collectives in the same order with matching arguments. By default each
//! collective (and barrier) first compares kind, count, element type, op and root across ranks,
//! and a mismatch throws usage_error on every rank instead of hanging or corrupting memory. It
//! costs one small all-reduce per call (0.3-0.4 us between two ranks in shared memory, a
//! network round trip across nodes; bench/RESULTS.md), which matters only for small messages: TRIDENT_CHECK_COLLECTIVES=0 in the environment, mpi_comm(comm,
//! false) or check_arguments(false) turns it off, at the price of a hang until the watchdog
//! ends the job, or corrupted memory, when the ranks do disagree.
//!
//! Operations in flight together (several *_async requests) must use disjoint buffers: MPI
//! orders their start, not their memory accesses. One mpi_comm is used by one thread at a time;
//! distinct communicators may be driven from distinct threads when
//! mpi_environment::provided() == MPI_THREAD_MULTIPLE.
class mpi_comm : public collectives<mpi_comm, host_space> {
 public:
  using request = mpi_request;
  //! max and min give NaN wherever any rank holds one (user ops over detail::host_combine).
  static constexpr nan_in_max_min max_min_nan = nan_in_max_min::propagate;

  //! A communicator over all processes (a duplicate of MPI_COMM_WORLD).
  static mpi_comm world() { return mpi_comm(MPI_COMM_WORLD); }

  //! A duplicate of `comm` (collective over comm). The argument check is on unless
  //! TRIDENT_CHECK_COLLECTIVES=0.
  explicit mpi_comm(MPI_Comm comm) : mpi_comm(comm, detail::check_collectives_from_environment()) {}
  //! The same, with the cross-rank argument check on or off.
  mpi_comm(MPI_Comm comm, bool check_arguments) : check_(check_arguments) {
    require_initialized();
    TRIDENT_EXPECT(comm != MPI_COMM_NULL, "mpi_comm: MPI_COMM_NULL is not a communicator");
    MPI_Comm dup = MPI_COMM_NULL;
    TRIDENT_MPI_CHECK(MPI_Comm_dup(comm, &dup));
    adopt(dup);
  }

  mpi_comm(mpi_comm&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        rank_(std::exchange(other.rank_, 0)),
        size_(std::exchange(other.size_, 0)),
        check_(other.check_),
        timeout_(other.timeout_) {}
  mpi_comm& operator=(mpi_comm&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = std::exchange(other.rank_, 0);
      size_ = std::exchange(other.size_, 0);
      check_ = other.check_;
      timeout_ = other.timeout_;
    }
    return *this;
  }
  mpi_comm(const mpi_comm&) = delete;
  mpi_comm& operator=(const mpi_comm&) = delete;

  ~mpi_comm() { release(); }

  //! The owned MPI communicator (MPI_COMM_NULL after a move), for calls trident does not wrap.
  MPI_Comm native() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  //! Turns the cross-rank argument check on or off (see the class comment). Every rank must
  //! choose the same, since the check is itself a collective.
  void check_arguments(bool on) noexcept { check_ = on; }
  bool check_arguments() const noexcept { return check_; }

  //! The longest one blocking call (or wait()) may take before the watchdog ends the job with
  //! MPI_Abort, naming the call and the rank: MPI cannot cancel a collective that a peer never
  //! joins. Default TRIDENT_MPI_TIMEOUT seconds, else 300 s; 0 turns it off. Inherited by split().
  void timeout(std::chrono::milliseconds limit) {
    TRIDENT_EXPECT(limit.count() >= 0, "mpi_comm::timeout: expected >= 0 ms (0 = off), got ", limit.count());
    timeout_ = limit;
  }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  //! Called by the front-end when one of this communicator's calls throws on this rank: the
  //! peers may be left waiting for it, which mpi_environment deals with at exit.
  void note_failure(const char* what) noexcept {
    auto& state = detail::mpi_exit_state::instance();
    state.last_failure.store(what);
    state.failed.store(true);
  }

  // ---- what collectives<> calls ----------------------------------------------------------------

  //! Runs one collective; complete on return.
  void execute(const collective_call& call) {
    plan p = make_plan(call);
    const detail::mpi_deadline deadline(name_of(call.kind).data(), rank_, timeout_);  // name_of views literals
    switch (call.kind) {
      case collective::all_reduce:
        TRIDENT_MPI_CHECK(MPI_Allreduce(p.send, p.recv, p.count, p.type, p.op, comm_));
        break;
      case collective::reduce_scatter:
        TRIDENT_MPI_CHECK(MPI_Reduce_scatter_block(p.send, p.recv, p.count, p.type, p.op, comm_));
        break;
      case collective::all_gather:
        TRIDENT_MPI_CHECK(MPI_Allgather(p.send, p.count, p.type, p.recv, p.count, p.type, comm_));
        break;
      case collective::broadcast:
        TRIDENT_MPI_CHECK(MPI_Bcast(p.recv, p.count, p.type, p.root, comm_));
        break;
      case collective::reduce:
        TRIDENT_MPI_CHECK(MPI_Reduce(p.send, p.recv, p.count, p.type, p.op, p.root, comm_));
        break;
      case collective::all_to_all:
        TRIDENT_MPI_CHECK(MPI_Alltoall(p.send, p.count, p.type, p.recv, p.count, p.type, comm_));
        break;
    }
    p.after.run(nullptr);
  }

  //! Starts one collective (MPI_I*); the request finishes it.
  mpi_request start(const collective_call& call) {
    plan p = make_plan(call);
    mpi_request r;
    r.handles_.assign(1, MPI_REQUEST_NULL);
    MPI_Request* h = r.handles_.data();
    switch (call.kind) {
      case collective::all_reduce:
        TRIDENT_MPI_CHECK(MPI_Iallreduce(p.send, p.recv, p.count, p.type, p.op, comm_, h));
        break;
      case collective::reduce_scatter:
        TRIDENT_MPI_CHECK(MPI_Ireduce_scatter_block(p.send, p.recv, p.count, p.type, p.op, comm_, h));
        break;
      case collective::all_gather:
        TRIDENT_MPI_CHECK(MPI_Iallgather(p.send, p.count, p.type, p.recv, p.count, p.type, comm_, h));
        break;
      case collective::broadcast:
        TRIDENT_MPI_CHECK(MPI_Ibcast(p.recv, p.count, p.type, p.root, comm_, h));
        break;
      case collective::reduce:
        TRIDENT_MPI_CHECK(MPI_Ireduce(p.send, p.recv, p.count, p.type, p.op, p.root, comm_, h));
        break;
      case collective::all_to_all:
        TRIDENT_MPI_CHECK(MPI_Ialltoall(p.send, p.count, p.type, p.recv, p.count, p.type, comm_, h));
        break;
    }
    // Moving the staging vector keeps its heap block, which MPI is writing into.
    r.after_ = std::move(p.after);
    r.pending_ = true;
    r.what_ = name_of(call.kind).data();
    r.rank_ = rank_;
    r.limit_ = timeout_;
    return r;
  }

  //! Grouped point-to-point: every MPI_Isend / MPI_Irecv posted, then MPI_Waitall.
  void execute(std::span<const p2p_op<host_space>> ops) { start(ops).wait(); }

  //! The same, returning the request that holds the MPI requests.
  mpi_request start(std::span<const p2p_op<host_space>> ops) {
    // Everything that can throw before MPI is involved happens first, so a failure never
    // leaves half a group posted.
    std::vector<int> counts(ops.size());
    std::vector<MPI_Datatype> types(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      counts[i] = detail::mpi_count(ops[i].count, ops[i].kind == p2p_kind::send ? "send" : "recv");
      types[i] = to_mpi(ops[i].type);
    }
    mpi_request r;
    r.handles_.reserve(ops.size());
    r.after_.receives.reserve(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto& op = ops[i];
      MPI_Request h = MPI_REQUEST_NULL;
      const bool is_send = op.kind == p2p_kind::send;
      const int status = is_send ? MPI_Isend(op.data, counts[i], types[i], op.peer, p2p_tag, comm_, &h)
                                 : MPI_Irecv(op.data, counts[i], types[i], op.peer, p2p_tag, comm_, &h);
      if (status != MPI_SUCCESS) {
        detail::abandon(r.handles_, r.after_.receives);
        detail::mpi_check(status, is_send ? "MPI_Isend" : "MPI_Irecv");
      }
      r.handles_.push_back(h);  // capacity reserved: cannot throw
      if (!is_send) r.after_.receives.push_back({i, op.count, types[i], op.peer});
    }
    r.pending_ = !r.handles_.empty();
    r.what_ = "exchange (send/recv)";
    r.rank_ = rank_;
    r.limit_ = timeout_;
    return r;
  }

  void barrier() {
    try {
      // The argument check covers barriers too: a barrier against any other collective is then
      // a usage_error on every rank, not a hang.
      if (check_) check_agreement(collective_call{}, /*barrier=*/true);
      const detail::mpi_deadline deadline("barrier", rank_, timeout_);
      TRIDENT_MPI_CHECK(MPI_Barrier(comm_));
    } catch (...) {
      note_failure("barrier");
      throw;
    }
  }
  //! Nothing to do: MPI operations are complete when they return (async ones when waited for).
  void synchronize() noexcept {}

  //! The ranks with the same `color` form a new communicator, ordered by `key` (then by rank
  //! here). Collective; the result owns its MPI_Comm and inherits check_arguments().
  //!
  //!   auto row = grid.split(grid.rank() / columns, grid.rank() % columns);
  mpi_comm split(int color, int key) {
    try {
      return split_checked(color, key);
    } catch (...) {
      note_failure("split");
      throw;
    }
  }

 private:
  mpi_comm split_checked(int color, int key) {
    if (check_) {
      // One rank's bad colour must fail every rank, not leave the others inside MPI_Comm_split.
      int lowest = color;
      TRIDENT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, comm_));
      TRIDENT_EXPECT(lowest >= 0, "split: colour ", lowest, " (on some rank) is negative; colours must be >= 0");
    }
    TRIDENT_EXPECT(color >= 0, "split: colour ", color, " is negative; colours must be >= 0 (every rank must "
                   "belong to a group)");
    MPI_Comm part = MPI_COMM_NULL;
    {
      const detail::mpi_deadline deadline("split", rank_, timeout_);
      TRIDENT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
    }
    mpi_comm result(adopt_tag{}, part, check_);
    result.timeout_ = timeout_;
    return result;
  }

  // A fixed tag: MPI's non-overtaking rule per (source, tag, communicator) then makes messages
  // between a pair match in the order they were issued, which exchange() promises.
  static constexpr int p2p_tag = 0x7d;

  struct adopt_tag {};
  mpi_comm(adopt_tag, MPI_Comm owned, bool check_arguments) : check_(check_arguments) { adopt(owned); }

  //! What one collective_call becomes in MPI's terms.
  struct plan {
    const void* send = nullptr;
    void* recv = nullptr;
    int count = 0;  // per rank, as MPI counts it
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    int root = 0;
    detail::mpi_completion after;
  };

  static void require_initialized() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int finalized = 0;
    MPI_Finalized(&finalized);
    TRIDENT_EXPECT(initialized && !finalized, "mpi_comm: MPI is not initialised (or already finalised); create a "
                   "trident::mpi_environment first");
  }

  void adopt(MPI_Comm comm) {
    comm_ = comm;
    try {
      TRIDENT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
      TRIDENT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
      TRIDENT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    } catch (...) {
      release();
      throw;
    }
  }

  void release() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  plan make_plan(const collective_call& c) {
    if (check_) check_agreement(c);
    const char* what = name_of(c.kind).data();
    const std::size_t bytes_per = size_of(c.type);
    const bool reduction =
        c.kind == collective::all_reduce || c.kind == collective::reduce_scatter || c.kind == collective::reduce;
    plan p;
    p.type = to_mpi(c.type);
    p.root = c.root;
    p.after.type = c.type;
    if (reduction) p.op = detail::mpi_op(c.type, c.op);
    int divisor = reduction && c.op == reduce_op::avg ? size_ : 0;
    // fp16/bf16 avg: sum the inputs scaled by 1/n (a separate buffer, so nothing is in place).
    const void* input = c.send;
    if (reduction && detail::premultiplied_avg(c.type, c.op) && size_ > 1) {
      p.after.prescaled.resize(c.send_count * bytes_per);
      if (c.send_count != 0) detail::host_prescale(c.type, p.after.prescaled.data(), c.send, c.send_count, size_);
      input = p.after.prescaled.data();
      divisor = 0;
    }
    switch (c.kind) {
      case collective::all_reduce:
        p.count = detail::mpi_count(c.send_count, what);
        p.send = input == c.recv ? MPI_IN_PLACE : input;
        p.recv = c.recv;
        p.after.result = c.recv;
        p.after.count = c.recv_count;
        p.after.divisor = divisor;
        break;
      case collective::reduce_scatter: {
        p.count = detail::mpi_count(c.recv_count, what);
        detail::mpi_count(c.send_count, what);
        p.send = input;
        p.recv = c.recv;
        const bool in_place = c.recv_count > 0 && static_cast<const std::byte*>(input) +
                                                          static_cast<std::size_t>(rank_) * c.recv_count * bytes_per ==
                                                      static_cast<const std::byte*>(c.recv);
        if (in_place) {
          // MPI's in-place form reads the whole input from recvbuf and leaves the result at
          // its start, clobbering chunk 0; staging the chunk keeps the rest of the input intact.
          p.after.staging.resize(c.recv_count * bytes_per);
          p.recv = p.after.staging.data();
          p.after.copy_to = c.recv;
        } else {
          p.after.result = c.recv;
        }
        p.after.count = c.recv_count;
        p.after.divisor = divisor;
        break;
      }
      case collective::all_gather: {
        p.count = detail::mpi_count(c.send_count, what);
        detail::mpi_count(c.recv_count, what);
        p.send = c.send;
        p.recv = c.recv;
        const auto* s = static_cast<const std::byte*>(c.send);
        auto* r = static_cast<std::byte*>(c.recv);
        const std::size_t chunk = c.send_count * bytes_per;
        if (chunk > 0 && s < r + c.recv_count * bytes_per && r < s + chunk) {
          // The input lies inside the output: MPI_IN_PLACE takes this rank's part from its own
          // slot, so put it there first (nothing when it already is: NCCL's in-place form).
          std::byte* slot = r + static_cast<std::size_t>(rank_) * chunk;
          if (slot != s) std::memmove(slot, s, chunk);
          p.send = MPI_IN_PLACE;
        }
        break;
      }
      case collective::broadcast:
        p.count = detail::mpi_count(c.send_count, what);
        p.send = c.recv;
        p.recv = c.recv;
        break;
      case collective::reduce:
        // Every rank contributes send_count elements; only the root has a receive buffer.
        p.count = detail::mpi_count(c.send_count, what);
        p.recv = c.recv;
        p.send = rank_ == c.root && input == c.recv ? MPI_IN_PLACE : input;
        if (rank_ == c.root) {
          p.after.result = c.recv;
          p.after.count = c.recv_count;
          p.after.divisor = divisor;
        }
        break;
      case collective::all_to_all:
        p.count = detail::mpi_count(c.send_count / static_cast<std::size_t>(size_), what);
        p.send = c.send;
        p.recv = c.recv;
        break;
    }
    return p;
  }

  //! The argument check: one all-reduce of (x, -x) with MPI_MAX gives every rank the maximum
  //! and the minimum of each field, so all ranks reach the same verdict.
  // A barrier takes part as kind 100 with no other fields.
  void check_agreement(const collective_call& c, bool barrier = false) {
    const bool reduction = !barrier && (c.kind == collective::all_reduce || c.kind == collective::reduce_scatter ||
                                        c.kind == collective::reduce);
    const bool rooted = !barrier && (c.kind == collective::broadcast || c.kind == collective::reduce);
    enum field { kind, count, type, op, root, fields };
    constexpr std::int64_t barrier_kind = 100;
    std::int64_t values[2 * fields] = {};
    values[kind] = barrier ? barrier_kind : static_cast<std::int64_t>(c.kind);
    values[count] = barrier ? 0 : static_cast<std::int64_t>(c.send_count);  // for reduce, the one count every rank has
    values[type] = barrier ? -1 : static_cast<std::int64_t>(c.type);
    values[op] = reduction ? static_cast<std::int64_t>(c.op) : -1;
    values[root] = rooted ? c.root : -1;
    for (int i = 0; i < fields; ++i) values[fields + i] = -values[i];
    {
      // The watchdog keeps the pointer: a string literal per collective, naming the call.
      const char* label = "barrier (its argument check)";
      if (!barrier) switch (c.kind) {
          case collective::all_reduce: label = "all_reduce (its argument check)"; break;
          case collective::reduce_scatter: label = "reduce_scatter (its argument check)"; break;
          case collective::all_gather: label = "all_gather (its argument check)"; break;
          case collective::broadcast: label = "broadcast (its argument check)"; break;
          case collective::reduce: label = "reduce (its argument check)"; break;
          case collective::all_to_all: label = "all_to_all (its argument check)"; break;
        }
      const detail::mpi_deadline deadline(label, rank_, timeout_);
      TRIDENT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, 2 * fields, MPI_INT64_T, MPI_MAX, comm_));
    }
    const auto low = [&](int f) { return -values[fields + f]; };
    const auto high = [&](int f) { return values[f]; };
    const auto kind_name = [&](std::int64_t k) { return k == barrier_kind ? "barrier" : name_of(static_cast<collective>(k)); };
    const char* what = barrier ? "barrier" : name_of(c.kind).data();
    const char* where = " (found by check_arguments / TRIDENT_CHECK_COLLECTIVES)";
    if (low(kind) != high(kind))
      throw usage_error(detail::concat(what, ": ranks disagree on the collective: ", kind_name(low(kind)), " to ",
                                       kind_name(high(kind)), where));
    if (low(count) != high(count))
      throw usage_error(detail::concat(what, ": ranks disagree on the element count: ", low(count), " to ", high(count), where));
    if (low(type) != high(type))
      throw usage_error(detail::concat(what, ": ranks disagree on the element type: ", name_of(static_cast<dtype>(low(type))),
                                       " to ", name_of(static_cast<dtype>(high(type))), where));
    if (low(op) != high(op))
      throw usage_error(detail::concat(what, ": ranks disagree on the reduction: ", name_of(static_cast<reduce_op>(low(op))),
                                       " to ", name_of(static_cast<reduce_op>(high(op))), where));
    if (low(root) != high(root))
      throw usage_error(detail::concat(what, ": ranks disagree on the root: ", low(root), " to ", high(root), where));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool check_ = true;
  std::chrono::milliseconds timeout_ = detail::mpi_seconds_from_environment("TRIDENT_MPI_TIMEOUT", std::chrono::seconds(300));
};

static_assert(request<mpi_request>);
static_assert(communicator<mpi_comm>);

}  // namespace trident
