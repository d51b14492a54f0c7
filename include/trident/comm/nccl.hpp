// trident-requires: nccl
// trident/comm/nccl.hpp — the NCCL backend of the communicator concept: one ncclComm_t per
// communicator, collectives enqueued on the communicator's CUDA stream.
//
// Synopsis
//   ncclUniqueId nccl_unique_id_from_mpi(MPI_Comm, int root = 0)            (with trident::mpi)
//   ncclUniqueId nccl_unique_id_from_file(path, rank, timeout)             shared-file bootstrap
//   (and, included from launch/: launch_env, select_device, publish_file, await_file,
//    share_via_file)
//   constexpr ncclRedOp_t to_nccl(reduce_op)
//   struct nccl_options                    timeout, host_id_per_rank (tests), stream
//   class nccl_comm                        models trident::communicator over cuda_space
//     max_min_nan = nan_in_max_min::drop   (NaN in max / min: below)
//     static init(id, rank, size, options), static from_mpi(MPI_Comm, options)
//     rank(), size(), device(), stream(), native()
//     execute / start (collectives and grouped point-to-point), barrier, synchronize, split
//   class nccl_comm::request               wait(), test(); a CUDA event behind it
//
// Completion is stream-ordered: a collective's "synchronous" form returns once it is enqueued
// on stream(), exactly like NCCL itself; synchronize(), barrier() or a request's wait() block
// the host. Work producing the inputs on another stream must be ordered before it by the
// caller (an event, or by passing that stream as nccl_options::stream).
//
// NaN in max and min: dropped, unlike the host backends. NCCL's kernels (src/device/
// reduce_kernel.h) combine float32 with fmaxf / fminf, float64 with fmax / fmin, and fp16 / bf16
// with __hmax / __hmin on sm_80 and later (fmaxf / fminf of the widened values before): each
// returns the other operand when one is NaN. So an element is NaN only when every rank holds NaN
// there; otherwise it is the max / min of the ranks that do not, whichever rank holds the NaN.
// The thread and MPI backends propagate NaN from any rank instead (nccl_comm::max_min_nan is
// nan_in_max_min::drop, theirs propagate). To learn whether any rank saw a NaN, reduce a count
// or a flag with sum, not the data with max.
//
// No hangs: every communicator is non-blocking (NCCL's `blocking = 0`), and every wait on it —
// initialisation, an enqueue that NCCL reports as in progress, synchronize(), a request — polls
// ncclCommGetAsyncError with nccl_options::timeout. An asynchronous NCCL error or a timeout
// aborts the communicator (ncclCommAbort, which also releases the kernels stuck on the GPU)
// and throws trident::nccl_error naming the operation; the communicator is unusable afterwards
// (each later call is a usage_error saying why).
//
// Needs NCCL and CUDA (link trident::nccl); host C++ only, no nvcc needed. The MPI parts
// (nccl_unique_id_from_mpi, nccl_comm::from_mpi) exist when trident::mpi is linked too.
#pragma once

#include "trident/core/config.hpp"

#if !TRIDENT_HAS_NCCL
#error "trident/comm/nccl.hpp needs NCCL: link the trident::nccl target (it defines TRIDENT_HAS_NCCL=1)"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>  // getpid, gethostname

#include <algorithm>
#include <charconv>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "trident/comm/communicator.hpp"
#include "trident/comm/nccl/base.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/launch/device.hpp"
#include "trident/launch/launch_env.hpp"
#include "trident/launch/rendezvous.hpp"

#if TRIDENT_HAS_MPI
#include "trident/comm/mpi/base.hpp"
#endif

namespace trident {

// ---- bootstrap: getting one ncclUniqueId to every rank (launch/rendezvous.hpp does the files) ----

//! The NCCL unique id through a shared file: rank 0 creates it (ncclGetUniqueId) and writes it
//! atomically, the other ranks wait for the file up to `timeout`. The bootstrap of llm.c without
//! MPI; the path must be new for every job (see share_via_file).
//!
//!   auto id = trident::nccl_unique_id_from_file("/shared/job42.ncclid", env.rank, std::chrono::minutes(5));
inline ncclUniqueId nccl_unique_id_from_file(const std::filesystem::path& path, int rank,
                                             std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  return share_via_file<ncclUniqueId>(path, rank, timeout, [] {
    ncclUniqueId id;
    TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  });
}

#if TRIDENT_HAS_MPI
//! The NCCL unique id, made on `root` and broadcast over MPI. A failure on the root is reported
//! on every rank (the broadcast still happens), so no rank hangs.
//!
//!   ncclUniqueId id = trident::nccl_unique_id_from_mpi(MPI_COMM_WORLD);
inline ncclUniqueId nccl_unique_id_from_mpi(MPI_Comm comm, int root = 0) {
  int rank = 0;
  int size = 0;
  TRIDENT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  TRIDENT_MPI_CHECK(MPI_Comm_size(comm, &size));
  TRIDENT_EXPECT(root >= 0 && root < size, "nccl_unique_id_from_mpi: root ", root, " is not a rank of this MPI "
                 "communicator of ", size, " (expected 0..", size - 1, ")");
  struct message {
    ncclUniqueId id;
    int ok;
  } m{};
  std::exception_ptr failure;
  if (rank == root) {
    try {
      TRIDENT_NCCL_CHECK(ncclGetUniqueId(&m.id));
      m.ok = 1;
    } catch (...) {
      failure = std::current_exception();
    }
  }
  TRIDENT_MPI_CHECK(MPI_Bcast(&m, static_cast<int>(sizeof m), MPI_BYTE, root, comm));
  if (failure) std::rethrow_exception(failure);
  if (m.ok == 0) {
    throw error(detail::concat("rank ", root, " could not create the NCCL unique id (see its error)"),
                "nccl_unique_id_from_mpi");
  }
  return m.id;
}
#endif

// ---- the communicator -----------------------------------------------------------------------------

//! NCCL's reduction for a trident reduce_op (avg is ncclAvg: for integers the truncated sum / n).
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::prod: return ncclProd;
  }
  return ncclSum;  // unreachable for a valid reduce_op
}

//! How an nccl_comm is made and waited on.
struct nccl_options {
  //! The longest any wait on the communicator may take (initialisation, synchronize(), a
  //! request's wait(), an enqueue NCCL reports as in progress) before it is aborted.
  std::chrono::milliseconds timeout{300000};
  //! Test mode only: lets several ranks (processes) share one GPU, which NCCL otherwise refuses
  //! ("duplicate GPU"). Sets the environment variable NCCL_HOSTID to a value unique to this
  //! process, so each rank looks like a host of its own and NCCL talks between them over its
  //! socket transport — correct, but slow. It calls setenv (not thread-safe) and takes effect
  //! only if it happens before the first NCCL call of the process: the factory functions set it
  //! first thing, so create the first communicator before any other NCCL use. Never in
  //! production: NCCL then believes every rank is on a different node.
  bool host_id_per_rank = false;
  //! The stream collectives are enqueued on; nullptr: the communicator creates and owns a
  //! stream of its own (split() communicators then get their own too).
  cudaStream_t stream = nullptr;
  //! Only for a stream the communicator creates. false (default): an ordinary stream, which is
  //! ordered with the legacy default stream, so trident::copy and fill_zero (cudaMemcpy and
  //! cudaMemset there; a pageable host-to-device cudaMemcpy may return before its DMA lands)
  //! complete before a collective that follows them, and a copy back waits for it. true:
  //! cudaStreamNonBlocking, for programs that order their streams with events themselves and
  //! want communication to overlap work on the default stream.
  bool non_blocking_stream = false;
};

namespace detail {

//! Makes `device` current for a scope and restores the previous one.
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) {
    TRIDENT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TRIDENT_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() {
    if (changed_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

//! Polls with little latency at first, then sleeps, so a long wait does not burn a core.
class poll_backoff {
 public:
  void pause() {
    ++rounds_;
    if (rounds_ < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(rounds_ < 2000 ? 20 : 500));
    }
  }

 private:
  int rounds_ = 0;
};

inline void set_nccl_host_id() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown-host");
  const std::string value = concat("trident-", host, "-pid-", ::getpid());
  if (::setenv("NCCL_HOSTID", value.c_str(), 1) != 0) {
    throw error(concat("setenv(NCCL_HOSTID, ", value, ") failed"), "nccl_options::host_id_per_rank");
  }
}

//! Everything one nccl_comm owns. Shared with its requests, so a request outliving (or moved
//! past) its communicator still refers to a live comm and stream.
struct nccl_state {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int device = 0;
  int* scratch = nullptr;  // barrier()'s one int
  nccl_options options;
  // Device pointers already checked with cudaPointerGetAttributes: training loops hand the same
  // buffers to every call, and the check costs ~0.1-0.2 us of host time each time. The limit:
  // an address freed and then allocated again on another device by the same process (one
  // process driving several GPUs) reaches NCCL unchecked, as a peer device's memory that the
  // kernel reads over peer access or faults on.
  std::array<const void*, 8> checked_pointers{};
  std::size_t next_checked = 0;
  std::string aborted_because;

  explicit nccl_state(const nccl_options& o) : options(o) {
    TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
    if (options.stream != nullptr) {
      stream = options.stream;
    } else {
      TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(
          &stream, options.non_blocking_stream ? cudaStreamNonBlocking : cudaStreamDefault));
      owns_stream = true;
    }
  }
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;

  // Never throws: finalize (flushes what is enqueued), wait for it with the timeout, destroy;
  // abort instead when anything fails or takes too long.
  ~nccl_state() {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    if (previous != device) (void)cudaSetDevice(device);
    if (comm != nullptr) {
      bool ok = false;
      ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        const auto start = std::chrono::steady_clock::now();
        poll_backoff backoff;
        for (;;) {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) break;
          if (async == ncclSuccess) {
            ok = true;
            break;
          }
          if (async != ncclInProgress || std::chrono::steady_clock::now() - start > options.timeout) break;
          backoff.pause();
        }
      }
      if (ok) {
        (void)ncclCommDestroy(comm);  // a failure here leaves nothing to retry: the comm is gone either way
      } else {
        (void)ncclCommAbort(comm);
      }
      comm = nullptr;
    }
    if (scratch != nullptr) (void)cudaFree(scratch);
    if (owns_stream) (void)cudaStreamDestroy(stream);
    if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
  }

  //! The live comm, or a usage_error saying why there is none.
  ncclComm_t live(const char* what) const {
    if (comm == nullptr) {
      throw usage_error(concat(what, ": this NCCL communicator was aborted after an earlier failure (",
                               aborted_because, "); create a new one"),
                        what);
    }
    return comm;
  }

  void abort(const std::string& why) noexcept {
    try {
      if (aborted_because.empty()) aborted_because = why;
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory; aborting matters more than the reason
    }
    if (comm != nullptr) (void)ncclCommAbort(comm);
    comm = nullptr;
  }

  [[noreturn]] void fail(ncclResult_t status, const char* what, const std::source_location& where) {
    const char* last = ncclGetLastError(comm);
    std::string message = concat(ncclGetErrorString(status), last != nullptr && *last != '\0' ? " — " : "",
                                 last != nullptr ? last : "", "; the communicator has been aborted");
    abort(concat(what, ": ", ncclGetErrorString(status)));
    throw nccl_error(static_cast<int>(status), message, what, where);
  }

  [[noreturn]] void fail_timeout(const char* what, const std::source_location& where) {
    std::string message = concat("did not complete within ", options.timeout.count(),
                                 " ms; the communicator has been aborted (is a rank missing, stuck, or calling "
                                 "collectives in a different order? raise nccl_options::timeout if it is just slow)");
    abort(concat(what, " timed out after ", options.timeout.count(), " ms"));
    throw nccl_error(static_cast<int>(ncclInProgress), message, what, where);
  }

  //! Polls until `done(async state)` says so, failing on an asynchronous NCCL error or after the
  //! timeout. ncclCommGetAsyncError's own status is handled here rather than by
  //! TRIDENT_NCCL_CHECK because a failure must abort the communicator before throwing.
  template <class Done>
  void poll_until(const char* what, Done&& done, const std::source_location& where) {
    const auto start = std::chrono::steady_clock::now();
    poll_backoff backoff;
    for (;;) {
      live(what);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess) fail(r, what, where);
      if (async != ncclSuccess && async != ncclInProgress) fail(async, what, where);
      if (done(async)) return;
      if (std::chrono::steady_clock::now() - start > options.timeout) fail_timeout(what, where);
      backoff.pause();
    }
  }

  //! After a non-blocking call: throws for a failed call (via TRIDENT_NCCL_CHECK's function),
  //! waits for NCCL to finish it when it is in progress.
  void settle(ncclResult_t result, const char* what,
              const std::source_location& where = std::source_location::current()) {
    nccl_check(result, what, where);
    if (result == ncclInProgress) wait_ready(what, where);
  }

  void wait_ready(const char* what, const std::source_location& where = std::source_location::current()) {
    poll_until(what, [](ncclResult_t async) { return async == ncclSuccess; }, where);
  }

  //! cudaSuccess: done; cudaErrorNotReady: not yet; anything else throws cuda_error.
  static bool finished(cudaError_t status, const char* operation, const std::source_location& where) {
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) return false;
    cuda_check(status, operation, where);
    return false;
  }

  void wait_stream(const char* what, const std::source_location& where = std::source_location::current()) {
    poll_until(what, [&](ncclResult_t) { return finished(cudaStreamQuery(stream), "cudaStreamQuery", where); },
               where);
  }

  void wait_event(cudaEvent_t event, const char* what,
                  const std::source_location& where = std::source_location::current()) {
    poll_until(what, [&](ncclResult_t) { return finished(cudaEventQuery(event), "cudaEventQuery", where); }, where);
  }

  //! One look: asynchronous NCCL errors throw (and abort), otherwise whether `event` has fired.
  bool event_done(cudaEvent_t event, const char* what,
                  const std::source_location& where = std::source_location::current()) {
    live(what);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess) fail(r, what, where);
    if (async != ncclSuccess && async != ncclInProgress) fail(async, what, where);
    return finished(cudaEventQuery(event), "cudaEventQuery", where);
  }
};

//! Ends an NCCL group on every path: by end() normally, quietly when unwinding (NCCL requires
//! every ncclGroupStart to be matched).
class nccl_group {
 public:
  explicit nccl_group(nccl_state& state) : state_(state) { TRIDENT_NCCL_CHECK(ncclGroupStart()); }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  ~nccl_group() {
    if (open_) (void)ncclGroupEnd();
  }
  void end(const char* what) {
    open_ = false;
    state_.settle(ncclGroupEnd(), what);
  }

 private:
  nccl_state& state_;
  bool open_ = true;
};

}  // namespace detail

//! A communicator over NCCL for memory in cuda_space: one ncclComm_t, one CUDA stream. Models
//! trident::communicator. Move-only; use it from one thread at a time.
//!
//!   // one process per GPU, launched by mpirun, torchrun or srun
//!   auto env = trident::launch_env::detect();
//!   trident::select_device(env);
//!   auto id = trident::nccl_unique_id_from_file("/shared/" + job_id + ".ncclid", env.rank);
//!   auto comm = trident::nccl_comm::init(id, env.rank, env.size);
//!   trident::buffer<float, trident::cuda_space> grads(n);
//!   comm.all_reduce(grads, trident::reduce_op::avg);   // enqueued on comm.stream()
//!   comm.synchronize();                                  // host waits (with the timeout)
//!
//! Buffers are checked at run time to be device (or managed) memory of the communicator's
//! device: host memory handed in through a raw space_span is a usage_error, not a crash.
//! Collectives of zero elements are no-ops on every rank.
class nccl_comm : public collectives<nccl_comm, cuda_space> {
 public:
  class request;
  //! max and min drop NaN unless every rank holds NaN in that element (NCCL's fmaxf / __hmax);
  //! see the header comment.
  static constexpr nan_in_max_min max_min_nan = nan_in_max_min::drop;

  nccl_comm(nccl_comm&&) noexcept = default;
  nccl_comm& operator=(nccl_comm&&) noexcept = default;
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  ~nccl_comm() = default;  // the state's destructor finalizes (or aborts) the comm

  //! Rank `rank` of `size` in the clique named by `id`, on the current CUDA device. Every rank
  //! calls it with the same id and size; it returns once all have joined (or throws after
  //! options.timeout, aborting).
  //!
  //!   ncclUniqueId id; if (rank == 0) ncclGetUniqueId(&id); /* ... send id to every rank ... */
  //!   auto comm = trident::nccl_comm::init(id, rank, size, {.timeout = std::chrono::seconds(60)});
  static nccl_comm init(const ncclUniqueId& id, int rank, int size, nccl_options options = {}) {
    TRIDENT_EXPECT(size >= 1, "nccl_comm::init: size ", size, " must be at least 1");
    TRIDENT_EXPECT(rank >= 0 && rank < size, "nccl_comm::init: rank ", rank, " is not a rank of a group of ", size,
                   " (expected 0..", size - 1, ")");
    if (options.host_id_per_rank) detail::set_nccl_host_id();
    auto state = std::make_shared<detail::nccl_state>(options);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      state->settle(ncclCommInitRankConfig(&state->comm, size, id, rank, &config), "ncclCommInitRankConfig");
    } catch (...) {
      state->abort("ncclCommInitRankConfig failed");
      throw;
    }
    return nccl_comm(std::move(state), rank, size);
  }

#if TRIDENT_HAS_MPI
  //! All ranks of an MPI communicator become one NCCL communicator (same ranks), the unique id
  //! broadcast over MPI. Collective over `comm`.
  //!
  //!   MPI_Init(&argc, &argv);
  //!   trident::select_device(trident::launch_env::detect());
  //!   auto nccl = trident::nccl_comm::from_mpi(MPI_COMM_WORLD);
  static nccl_comm from_mpi(MPI_Comm comm, nccl_options options = {}) {
    int rank = 0;
    int size = 0;
    TRIDENT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    TRIDENT_MPI_CHECK(MPI_Comm_size(comm, &size));
    // Before ncclGetUniqueId, the first NCCL call of a typical program (see host_id_per_rank).
    if (options.host_id_per_rank) detail::set_nccl_host_id();
    const ncclUniqueId id = nccl_unique_id_from_mpi(comm, 0);
    return init(id, rank, size, options);
  }
#endif

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  //! The CUDA device the communicator was created on.
  int device() const noexcept { return state_ ? state_->device : -1; }
  //! The stream every operation is enqueued on.
  cudaStream_t stream() const noexcept { return state_ ? state_->stream : nullptr; }
  //! The NCCL communicator, for calls trident does not wrap; nullptr once aborted or moved from.
  ncclComm_t native() const noexcept { return state_ ? state_->comm : nullptr; }
  const nccl_options& options() const { return state("options").options; }

  //! Enqueues a collective on stream() (the front-end has checked its arguments).
  void execute(const collective_call& call) { enqueue(call); }
  //! Enqueues it and returns a request whose wait() blocks the host until it has completed.
  request start(const collective_call& call);
  //! Sends and receives in one NCCL group (so a ring shift cannot deadlock), on stream().
  void execute(std::span<const p2p_op<cuda_space>> ops) { enqueue(ops); }
  request start(std::span<const p2p_op<cuda_space>> ops);

  //! Every rank waits for the others: an all-reduce of one int, then synchronize().
  void barrier() {
    auto& st = state("barrier");
    const ncclComm_t comm = st.live("barrier");
    detail::cuda_device_guard guard(st.device);
    if (st.scratch == nullptr) {
      TRIDENT_CUDA_CHECK(cudaMalloc(&st.scratch, sizeof(int)));
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(st.scratch, 0, sizeof(int), st.stream));
    }
    st.settle(ncclAllReduce(st.scratch, st.scratch, 1, ncclInt32, ncclSum, comm, st.stream), "ncclAllReduce (barrier)");
    st.wait_stream("barrier");
  }

  //! Blocks the host until everything enqueued on stream() has completed, polling for NCCL
  //! errors; after options().timeout the communicator is aborted and nccl_error thrown.
  void synchronize() { state("synchronize").wait_stream("synchronize"); }

  //! Ranks passing the same color (>= 0) form a new communicator, ordered by key then by rank
  //! (ncclCommSplit). Collective: every rank must call it. The new communicator has the same
  //! options; its own stream unless options().stream was given.
  //!
  //!   auto row = comm.split(comm.rank() / columns, comm.rank());
  nccl_comm split(int color, int key) {
    TRIDENT_EXPECT(color >= 0, "split: colour ", color, " is negative; every rank must pass a colour >= 0 (leaving "
                   "a rank out, NCCL_SPLIT_NOCOLOR, is not offered)");
    auto& st = state("split");
    const ncclComm_t parent = st.live("split");
    detail::cuda_device_guard guard(st.device);
    auto child = std::make_shared<detail::nccl_state>(st.options);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int rank = 0;
    int size = 0;
    try {
      const ncclResult_t r = ncclCommSplit(parent, color, key, &child->comm, &config);
      detail::nccl_check(r, "ncclCommSplit");
      // Non-blocking: the split is still in progress on the parent, and the child handle may
      // only be filled in when it completes (seen with NCCL 2.28 on an H100). Settle the parent
      // first; using it before that fails with "previous operation" errors.
      st.wait_ready("ncclCommSplit (parent)");
      TRIDENT_EXPECT(child->comm != nullptr, "split: NCCL returned no communicator for color ", color);
      child->wait_ready("ncclCommSplit");
      TRIDENT_NCCL_CHECK(ncclCommUserRank(child->comm, &rank));
      TRIDENT_NCCL_CHECK(ncclCommCount(child->comm, &size));
    } catch (...) {
      child->abort("ncclCommSplit failed");
      throw;
    }
    return nccl_comm(std::move(child), rank, size);
  }

 private:
  nccl_comm(std::shared_ptr<detail::nccl_state> state, int rank, int size)
      : state_(std::move(state)), rank_(rank), size_(size) {}

  detail::nccl_state& state(const char* what) const {
    if (!state_) {
      throw usage_error(detail::concat(what, ": this nccl_comm was moved from"), what);
    }
    return *state_;
  }

  // Device (or managed) memory of our device, or a usage_error saying what it is instead.
  void check_device_pointer(const void* pointer, std::size_t count, const char* what, const char* which) const {
    TRIDENT_EXPECT(pointer != nullptr, what, ": ", which, " buffer is a null pointer with ", count, " elements");
    for (const void* p : state_->checked_pointers)
      if (p == pointer) return;
    cudaPointerAttributes attributes{};
    TRIDENT_CUDA_CHECK(cudaPointerGetAttributes(&attributes, pointer));
    switch (attributes.type) {
      case cudaMemoryTypeDevice:
        TRIDENT_EXPECT(attributes.device == state_->device, what, ": ", which, " buffer is memory of CUDA device ",
                       attributes.device, " but this communicator runs on device ", state_->device);
        state_->checked_pointers[state_->next_checked++ % state_->checked_pointers.size()] = pointer;
        return;
      case cudaMemoryTypeManaged: return;
      case cudaMemoryTypeHost:
        throw usage_error(detail::concat(what, ": ", which, " buffer is host memory; the NCCL backend needs device "
                                         "memory (cuda_space) (this is pinned host memory, from cudaMallocHost)"),
                          what);
      default:
        throw usage_error(detail::concat(what, ": ", which, " buffer is host memory; the NCCL backend needs device "
                                         "memory (cuda_space)"),
                          what);
    }
  }

  // The element count NCCL takes for each collective (per rank for reduce_scatter/all_gather).
  std::size_t nccl_count(const collective_call& c) const {
    switch (c.kind) {
      case collective::reduce_scatter: return c.recv_count;
      case collective::all_to_all: return c.send_count / static_cast<std::size_t>(size_);
      default: return c.send_count;
    }
  }

  void enqueue(const collective_call& c) {
    const char* what = name_of(c.kind).data();
    auto& st = state(what);
    const ncclComm_t comm = st.live(what);
    const std::size_t count = nccl_count(c);
    if (count == 0) return;  // every rank agrees on the count, so every rank skips
    check_device_pointer(c.send, c.send_count, what, "send");
    if (c.recv != nullptr && c.recv != c.send) check_device_pointer(c.recv, c.recv_count, what, "receive");
    const ncclDataType_t type = to_nccl(c.type);
    // On one rank the average is the sum. NCCL 2.28's ncclAvg on a single rank returned garbage
    // in the last 19 elements of a 10,000,019-element fp32/fp64 reduction on an H100 (all of
    // all_reduce, reduce_scatter and reduce; ints and halves were right), so it is not used there.
    const ncclRedOp_t op = size_ == 1 && c.op == reduce_op::avg ? ncclSum : to_nccl(c.op);
    switch (c.kind) {
      case collective::all_reduce:
        st.settle(ncclAllReduce(c.send, c.recv, count, type, op, comm, st.stream), "ncclAllReduce");
        return;
      case collective::reduce_scatter:
        st.settle(ncclReduceScatter(c.send, c.recv, count, type, op, comm, st.stream),
                  "ncclReduceScatter");
        return;
      case collective::all_gather:
        st.settle(ncclAllGather(c.send, c.recv, count, type, comm, st.stream), "ncclAllGather");
        return;
      case collective::broadcast:
        st.settle(ncclBroadcast(c.send, c.recv, count, type, c.root, comm, st.stream), "ncclBroadcast");
        return;
      case collective::reduce:
        st.settle(ncclReduce(c.send, c.recv, count, type, op, c.root, comm, st.stream), "ncclReduce");
        return;
      case collective::all_to_all: {
        // NCCL has no all-to-all: one group of a send and a receive per peer (itself included).
        const std::size_t chunk_bytes = count * size_of(c.type);
        const auto* send = static_cast<const std::byte*>(c.send);
        auto* recv = static_cast<std::byte*>(c.recv);
        detail::nccl_group group(st);
        for (int peer = 0; peer < size_; ++peer) {
          const auto offset = static_cast<std::size_t>(peer) * chunk_bytes;
          TRIDENT_NCCL_CHECK(ncclSend(send + offset, count, type, peer, comm, st.stream));
          TRIDENT_NCCL_CHECK(ncclRecv(recv + offset, count, type, peer, comm, st.stream));
        }
        group.end("ncclGroupEnd (all_to_all)");
        return;
      }
    }
    throw usage_error(detail::concat("nccl_comm: unknown collective ", static_cast<int>(c.kind)), "nccl_comm::execute");
  }

  void enqueue(std::span<const p2p_op<cuda_space>> ops) {
    auto& st = state("exchange");
    const ncclComm_t comm = st.live("exchange");
    for (const auto& op : ops) {
      if (op.count == 0) continue;
      check_device_pointer(op.data, op.count, op.kind == p2p_kind::send ? "exchange (send)" : "exchange (recv)",
                           op.kind == p2p_kind::send ? "send" : "receive");
    }
    detail::nccl_group group(st);
    for (const auto& op : ops) {
      if (op.count == 0) continue;  // both sides agree on the size, so both skip
      if (op.kind == p2p_kind::send) {
        TRIDENT_NCCL_CHECK(ncclSend(op.data, op.count, to_nccl(op.type), op.peer, comm, st.stream));
      } else {
        TRIDENT_NCCL_CHECK(ncclRecv(op.data, op.count, to_nccl(op.type), op.peer, comm, st.stream));
      }
    }
    group.end("ncclGroupEnd (exchange)");
  }

  request make_request(const char* what);

  std::shared_ptr<detail::nccl_state> state_;
  int rank_ = 0;
  int size_ = 0;
};

//! An operation of an nccl_comm in flight: a CUDA event recorded on the communicator's stream
//! after it. wait() blocks the host until the event fires, polling for NCCL errors, and aborts
//! the communicator after its timeout (so a missing peer is an exception, not a hang); test()
//! looks once. Move-only; destroying an unfinished request waits for it without throwing.
//!
//!   auto r = comm.all_reduce_async(grads, trident::reduce_op::avg);
//!   compute_something_else();
//!   r.wait();
class nccl_comm::request {
 public:
  request() = default;
  request(request&& other) noexcept
      : state_(std::move(other.state_)), event_(std::exchange(other.event_, nullptr)), what_(other.what_) {}
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      release();
      state_ = std::move(other.state_);
      event_ = std::exchange(other.event_, nullptr);
      what_ = other.what_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { release(); }

  //! Blocks until the operation has completed on the GPU; throws (once) on an NCCL error or
  //! timeout, after aborting the communicator.
  void wait() {
    if (!state_) return;
    auto state = std::move(state_);  // done, whatever happens: an error is reported once
    const cudaEvent_t event = std::exchange(event_, nullptr);
    struct destroy_event {
      cudaEvent_t e;
      ~destroy_event() { (void)cudaEventDestroy(e); }
    } cleanup{event};
    state->wait_event(event, what_);
  }

  //! Whether the operation has completed, without blocking; throws (once) on an NCCL error.
  bool test() {
    if (!state_) return true;
    bool done = false;
    try {
      done = state_->event_done(event_, what_);
    } catch (...) {
      (void)cudaEventDestroy(std::exchange(event_, nullptr));
      state_.reset();
      throw;
    }
    if (done) {
      (void)cudaEventDestroy(std::exchange(event_, nullptr));
      state_.reset();
    }
    return done;
  }

 private:
  friend class nccl_comm;
  request(std::shared_ptr<detail::nccl_state> state, cudaEvent_t event, const char* what)
      : state_(std::move(state)), event_(event), what_(what) {}

  void release() noexcept {
    try {
      wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; wait() aborted the comm
    }
  }

  std::shared_ptr<detail::nccl_state> state_;
  cudaEvent_t event_ = nullptr;
  const char* what_ = "request";
};

inline nccl_comm::request nccl_comm::make_request(const char* what) {
  auto& st = state(what);
  detail::cuda_device_guard guard(st.device);
  cudaEvent_t event = nullptr;
  TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, st.stream);
  if (recorded != cudaSuccess) {
    (void)cudaEventDestroy(event);
    detail::cuda_check(recorded, "cudaEventRecord(event, stream)");
  }
  return request(state_, event, what);
}

inline nccl_comm::request nccl_comm::start(const collective_call& call) {
  enqueue(call);
  return make_request(name_of(call.kind).data());
}

inline nccl_comm::request nccl_comm::start(std::span<const p2p_op<cuda_space>> ops) {
  enqueue(ops);
  return make_request("exchange");
}

static_assert(communicator<nccl_comm>);
static_assert(request<nccl_comm::request>);

}  // namespace trident
