#pragma once
// The thread backend: n ranks as threads of one process, the embedded default that runs
// anywhere. Collectives are ring algorithms over shared memory, not a lock around a shared sum.
//
//   struct local_options       timeout of every wait (default 300 s)
//   class local_comm           one rank's communicator (models trident::communicator)
//   struct local_world         local_world::run(n, fn): fn(local_comm&) on n threads
//
// How a collective runs. Every rank posts a descriptor of its call (kind, counts, dtype, op,
// root) and the pointers peers may read, then waits until all ranks have posted the same
// sequence number; each rank then checks that all descriptors agree (so a mismatch is a
// usage_error on every rank, not a hang or garbage). The data moves in steps: in step g rank r
// reads only what its predecessor finished in step g-1 (per-rank progress counters, release /
// acquire), so the ranks work on different chunks in parallel. Reductions are a ring
// reduce-scatter (chunk c is combined in the fixed order c+1, c+2, ..., c) followed by a ring
// all-gather that copies the finished chunks, so every rank ends with bit-identical results and
// runs are deterministic. All-reduces and reduce-scatters of at most 2 KiB per rank skip the
// ring's 2(n-1) hand-offs: each rank reduces what it owns straight from every peer's input, in
// rank order (identical everywhere too, and much faster for a few floats; bench/RESULTS.md). A
// collective ends when every rank has finished reading its peers' memory, so buffers can be
// reused as soon as the call returns.
//
// Failure. An exception escaping fn on one rank aborts the world: every rank blocked in (or
// later entering) a collective throws trident::error naming the failed rank, and run()
// rethrows the original exception. A wait longer than the timeout aborts the world the same
// way, naming the operation and the rank it waited for. A rank that leaves an operation this
// way first waits until no peer is still reading its memory in that operation (a peer may be
// mid-copy from its buffers when the abort arrives), and a sender waits for a receiver's copy
// in flight: the caller's buffers are never read after the call has returned, even by error.
//
// Disagreement in asynchronous work. Ranks whose descriptors disagree all throw the usage_error
// at the same sequence number, and a synchronous caller sees it at once. An asynchronous one
// sees it only when it waits, and meanwhile its worker would go on matching what it queued
// behind the failed operation with whatever the peers queued, by position: an all-gather and a
// reduce-scatter of the same bytes would then pass unnoticed and carry one bucket's data into
// another. So, on every rank alike (every rank reaches the verdict at the same operation), what
// was started before the caller learnt of the failure fails too, without taking part: a
// usage_error "... was not run", quoting the disagreement. The caller learns of it when a wait()
// rethrows an error, or when a synchronous call or synchronize() raises it (they drain the
// worker first, so where it surfaces is deterministic); operations started after that run
// normally, and every rank has then taken part in the same operations, so the communicator can
// go on.
//
// Waiting. A rank that waits for a peer spins for a few microseconds (a peer one step behind
// usually catches up that fast), then sleeps on a futex word of the peer's slot that the peer
// bumps after each progress it publishes, so a sleeping rank is woken the moment it can go on.
// Sleeping, not yielding or polling, because ranks may outnumber cores (8 ranks on 2 cores, or
// beside a compiler): a poll's short sleep costs a whole scheduler time slice there. The spin
// itself is skipped for a while after a yield that lost the core for a slice
// (detail::local_spinning): with every core busy, each yield hands a busy process a whole slice.
// A sleep is capped at 2 ms so that an abort elsewhere in the world, which does not know every
// group's slots, is still seen promptly. (The measurements behind these choices are in
// bench/RESULTS.md, "Thread backend".)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "trident/comm/communicator.hpp"
#include "trident/comm/host_reduce.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"

namespace trident {

//! Options of a local_world.
struct local_options {
  //! The longest any rank waits for another inside one operation before the world is aborted.
  std::chrono::milliseconds timeout{std::chrono::seconds{300}};
};

class local_comm;

namespace detail {

// Shared by every group (and split) of one local_world::run.
struct local_world_state {
  local_world_state(local_options o, int n) : options(o), left(static_cast<std::size_t>(n)) {
    for (auto& l : left) l.store(false, std::memory_order_relaxed);
  }
  local_options options;
  std::atomic<bool> aborted{false};
  // World ranks whose function has returned (and whose asynchronous work is done): a peer that
  // waits for one of them would wait for nothing, so it fails at once instead of timing out.
  std::vector<std::atomic<bool>> left;
  std::mutex mutex;
  std::string reason;     // why it was aborted: the first failure
  int failed_rank = -1;   // world rank of the first failure

  // Returns true for the first caller only: the root cause.
  bool abort(int world_rank, const std::string& why) {
    std::lock_guard lock(mutex);
    if (aborted.load(std::memory_order_relaxed)) return false;
    reason = why;
    failed_rank = world_rank;
    aborted.store(true, std::memory_order_seq_cst);  // seq_cst: see local_comm::post
    return true;
  }
  std::string describe() {
    std::lock_guard lock(mutex);
    return detail::concat("rank ", failed_rank, " failed: ", reason);
  }
};

// What every rank's communicator does: a collective kind plus barrier and split.
enum class local_kind : int { barrier = 100, split = 101 };

struct local_descriptor {
  int kind = 0;  // static_cast<int>(collective) or local_kind
  collective_call call{};
  const void* readable = nullptr;  // memory peers read during the algorithm
  int color = 0;
  int key = 0;
};

// A futex word that a slot's owner bumps after publishing progress, and the number of ranks
// asleep on it, so that publishing costs a system call only when someone sleeps.
struct local_signal {
  std::atomic<std::uint32_t> epoch{0};
  std::atomic<std::uint32_t> sleepers{0};

  // After a release store the waiters may be looking for. seq_cst pairs with sleep(): either
  // the sleeper sees the new epoch (and does not sleep), or this sees the sleeper (and wakes it).
  void publish() noexcept {
    epoch.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) != 0) wake_all();
  }

  // Sleeps until publish() bumps the epoch past `seen`, or for at most `limit`.
  void sleep(std::uint32_t seen, std::chrono::nanoseconds limit) noexcept {
#if defined(__linux__)
    static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(limit.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(limit.count() % 1'000'000'000);
    // EAGAIN (the epoch moved already), EINTR and ETIMEDOUT all mean: look again.
    (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&epoch), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
#else
    if (epoch.load(std::memory_order_acquire) == seen)
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(limit, std::chrono::microseconds(50)));
#endif
  }

 private:
  void wake_all() noexcept {
#if defined(__linux__)
    (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&epoch), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#endif
  }
};

struct alignas(64) local_slot {
  std::atomic<std::uint64_t> arrived{0};   // sequence number of the last operation posted
  std::atomic<std::uint64_t> progress{0};  // seq * step_space + steps completed
  // The operation (seq) during which this rank may read its peers' memory, 0 when none: set
  // before it posts, cleared once its reads are over. A rank that leaves an operation by an
  // exception waits until no peer is inside it before its buffers can be freed.
  std::atomic<std::uint64_t> inside{0};
  local_signal signal;                     // published after each store to arrived / progress
  local_descriptor desc;
  std::shared_ptr<struct local_group> split_result;  // published by a split's leader
};

struct local_pending_send {
  const void* data;
  std::size_t count;
  dtype type;
  int src;
  bool taken = false;  // a receiver has popped it and may be copying from `data`
  bool done = false;
  std::string error;  // set by the receiver when sizes disagree
};

struct local_group {
  local_group(std::shared_ptr<local_world_state> w, std::vector<int> world_ranks)
      : world(std::move(w)), ranks(std::move(world_ranks)), slots(ranks.size()),
        channels(ranks.size() * ranks.size()) {}
  std::shared_ptr<local_world_state> world;
  std::vector<int> ranks;  // world rank of each group rank
  std::vector<local_slot> slots;
  // Point-to-point: FIFO of posted sends per (src, dst), under one mutex.
  std::mutex p2p_mutex;
  std::condition_variable p2p_cv;
  std::vector<std::deque<local_pending_send*>> channels;

  int size() const noexcept { return static_cast<int>(ranks.size()); }
};

inline constexpr std::uint64_t step_space = std::uint64_t{1} << 20;
// How long a wait spins before sleeping, how long spinning stops after a yield lost the core,
// and the longest single sleep (an abort in another group of the world is noticed within it).
inline constexpr std::chrono::microseconds local_spin{20};
inline constexpr std::chrono::milliseconds local_spin_pause{50};
inline constexpr std::chrono::microseconds local_lost_core{1000};
inline constexpr std::chrono::milliseconds local_sleep_limit{2};

// Whether waits spin (yielding) before they sleep. A yield normally returns within a
// microsecond or hands the core to a peer rank for a moment; one that lasts local_lost_core
// means another process took the core for a whole time slice (about 4 ms beside a busy loop on
// this kernel), and then every wait would pay a slice: a test of many small collectives beside
// two busy loops on 2 cores took 40 s instead of 3 s. So after such a yield, waits go straight
// to sleep for local_spin_pause, and then try spinning again. One switch for the process: busy
// cores are a property of the machine, and each new world or group would otherwise learn it
// again. Relaxed and racy on purpose: it is a hint, and either answer is correct.
class local_spinning {
 public:
  static local_spinning& instance() noexcept {
    static local_spinning shared;
    return shared;
  }
  std::chrono::nanoseconds budget(std::chrono::steady_clock::time_point now) const noexcept {
    if (now.time_since_epoch().count() < paused_until_.load(std::memory_order_relaxed)) return {};
    return local_spin;
  }
  void lost_core(std::chrono::steady_clock::time_point now) noexcept {
    paused_until_.store((now + local_spin_pause).time_since_epoch().count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<std::chrono::steady_clock::rep> paused_until_{0};
};
// All-reduces and reduce-scatters of at most this many bytes (per rank's input) run in one step.
inline constexpr std::size_t local_one_shot_bytes = std::size_t{2} << 10;
inline std::uint64_t done_mark(std::uint64_t seq) { return seq * step_space + (step_space - 1); }

// Byte range of chunk c when `count` elements are split into n near-equal chunks.
struct chunking {
  std::size_t count, n, elem;
  std::size_t begin(std::size_t c) const { return count * c / n; }
  std::size_t size(std::size_t c) const { return begin(c + 1) - begin(c); }
  std::size_t offset_bytes(std::size_t c) const { return begin(c) * elem; }
};

inline std::size_t mod(long long a, int n) { return static_cast<std::size_t>(((a % n) + n) % n); }

}  // namespace detail

//! One rank of a local_world: a communicator over host memory whose peers are threads.
//! Move-only; use it from one thread at a time (its asynchronous operations run on a worker
//! thread of their own, in issue order).
//!
//!   trident::local_world::run(4, [](trident::local_comm& comm) {
//!     std::vector<float> grads(1000, float(comm.rank()));
//!     comm.all_reduce(grads, trident::reduce_op::avg);       // 1.5 everywhere
//!   });
class local_comm : public collectives<local_comm, host_space> {
 public:
  class request;
  //! max and min give NaN wherever any rank holds one (detail::host_combine).
  static constexpr nan_in_max_min max_min_nan = nan_in_max_min::propagate;

  local_comm(local_comm&& other) noexcept { *this = std::move(other); }
  // Queued asynchronous work refers to the object that started it: finish it before moving.
  local_comm& operator=(local_comm&& other) noexcept {
    if (this != &other) {
      stop_worker();
      other.stop_worker();
      group_ = std::move(other.group_);
      rank_ = std::exchange(other.rank_, -1);
      seq_ = std::exchange(other.seq_, 0);
      scratch_ = std::move(other.scratch_);
      prescaled_ = std::move(other.prescaled_);
      deferred_ = std::move(other.deferred_);
      ledger_ = std::move(other.ledger_);
      worker_ = std::move(other.worker_);
    }
    return *this;
  }
  ~local_comm() { stop_worker(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_ ? group_->size() : 0; }
  //! This rank's number in the whole local_world (differs from rank() after split()).
  int world_rank() const noexcept { return group_ ? group_->ranks[static_cast<std::size_t>(rank_)] : -1; }
  const local_options& options() const noexcept { return group_->world->options; }

  void execute(const collective_call& call) {
    drain();
    raise_deferred();
    raise_disagreement(name_of(call.kind));
    run_collective(call);
  }
  void execute(std::span<const p2p_op<host_space>> ops) {
    drain();
    raise_deferred();
    raise_disagreement("exchange");
    run_p2p(ops);
  }
  request start(const collective_call& call);
  request start(std::span<const p2p_op<host_space>> ops);

  void barrier() {
    drain();
    raise_deferred();
    raise_disagreement("barrier");
    detail::local_descriptor d;
    d.kind = static_cast<int>(detail::local_kind::barrier);
    const auto seq = post(d);
    finish(seq);
  }
  //! Waits for this rank's outstanding asynchronous operations; raises the error of one whose
  //! request was dropped without wait(), and the disagreement of one not waited for yet (see
  //! the top of this header).
  void synchronize() {
    drain();
    raise_deferred();
    raise_disagreement("synchronize");
  }
  //! The ledger this rank's allocations are charged to: the one current on the rank's thread
  //! when the communicator was made (local_world::run gives each rank its own). Scratch that
  //! asynchronous operations allocate on the worker thread is charged to the ledger current
  //! where they were started.
  const std::shared_ptr<memory_ledger>& ledger() const noexcept { return ledger_; }

  //! Ranks passing the same colour (>= 0) form a new group, ordered by key, then by rank.
  local_comm split(int color, int key) {
    drain();
    raise_deferred();
    raise_disagreement("split");
    detail::local_descriptor d;
    d.kind = static_cast<int>(detail::local_kind::split);
    d.color = color;
    d.key = key;
    const auto seq = post(d);
    const int n = size();
    for (int p = 0; p < n; ++p) {
      const int c = slot(p).desc.color;
      if (c < 0) {
        finish(seq);
        throw usage_error(detail::concat("split: rank ", p, " passed colour ", c, "; colours must be >= 0"));
      }
    }
    std::vector<int> members;  // group ranks with my colour, in (key, rank) order
    for (int p = 0; p < n; ++p)
      if (slot(p).desc.color == color) members.push_back(p);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return slot(a).desc.key < slot(b).desc.key; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank_) {
      std::vector<int> world_ranks;
      for (int m : members) world_ranks.push_back(group_->ranks[static_cast<std::size_t>(m)]);
      slot(rank_).split_result = std::make_shared<detail::local_group>(group_->world, std::move(world_ranks));
      set_progress(seq, 1);
    } else {
      try {
        wait_progress(leader, seq, 1, "split");
      } catch (...) {
        leave_after_failure(seq);
        throw;
      }
    }
    std::shared_ptr<detail::local_group> g = slot(leader).split_result;
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    finish(seq);
    if (leader == rank_) slot(rank_).split_result.reset();  // safe: everyone has read it
    return local_comm(std::move(g), new_rank);
  }

 private:
  friend struct local_world;
  local_comm(std::shared_ptr<detail::local_group> g, int rank) : group_(std::move(g)), rank_(rank) {}

  detail::local_slot& slot(int r) const { return group_->slots[static_cast<std::size_t>(r)]; }
  detail::local_world_state& world() const { return *group_->world; }

  // ---- waiting: spin briefly, then sleep on the peer's futex; abort and timeout checked -------
  template <class Ready>
  void wait_until(Ready ready, std::string_view what, int peer) const {
    if (ready()) return;
    // Spin a few microseconds: with a core each, the peer is usually one step behind. Not while
    // yields lose the core to another process (local_spinning). The clock is read on every
    // round because one such yield lasts a whole scheduler time slice.
    auto& spinning = detail::local_spinning::instance();
    const auto start = std::chrono::steady_clock::now();
    const auto budget = spinning.budget(start);
    for (auto last = start; last - start < budget;) {
      std::this_thread::yield();
      if (ready()) return;
      const auto now = std::chrono::steady_clock::now();
      if (now - last > detail::local_lost_core) {
        spinning.lost_core(now);
        break;
      }
      last = now;
    }
    if (world().aborted.load(std::memory_order_acquire)) throw aborted_error(what);
    const auto deadline = start + options().timeout;
    auto& signal = slot(peer).signal;
    for (;;) {
      signal.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = signal.epoch.load(std::memory_order_seq_cst);
      const bool done = ready();
      const bool aborted = !done && world().aborted.load(std::memory_order_acquire);
      const auto now = std::chrono::steady_clock::now();
      if (!done && !aborted && now <= deadline)
        signal.sleep(seen, std::min<std::chrono::nanoseconds>(deadline - now, detail::local_sleep_limit));
      signal.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (done || ready()) return;
      if (aborted) throw aborted_error(what);
      // A peer publishes its last progress before it marks itself as left, so the progress
      // is visible once `left` is: look again, or a peer that finished between our ready() and
      // this load would be blamed for leaving without taking part.
      if (peer_left(peer) && !ready()) {
        const std::string why = detail::concat(what, " on rank ", rank_, " waits for rank ", peer,
                                               ", which has returned from its function without taking part");
        world().abort(world_rank(), why);
        throw error(why);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string why = detail::concat("timed out after ", options().timeout.count(), " ms in ", what,
                                               " waiting for rank ", peer);
        world().abort(world_rank(), why);
        throw error(detail::concat(what, " on rank ", rank_, ": ", why));
      }
    }
  }
  bool peer_left(int peer) const noexcept {
    return peer >= 0 && world().left[static_cast<std::size_t>(group_->ranks[static_cast<std::size_t>(peer)])].load(
                            std::memory_order_acquire);
  }
  // Another rank's failure, as seen from this one: an echo (error::echo), which local_world::run
  // reports only when no rank raised anything else.
  error aborted_error(std::string_view what) const {
    error e(detail::concat(what, " on rank ", rank_, ": aborted because ", world().describe()));
    e.mark_echo();
    return e;
  }
  void wait_progress(int peer, std::uint64_t seq, std::uint64_t steps, std::string_view what) const {
    const std::uint64_t target = seq * detail::step_space + steps;
    auto& p = slot(peer).progress;
    wait_until([&] { return p.load(std::memory_order_acquire) >= target; }, what, peer);
  }
  void set_progress(std::uint64_t seq, std::uint64_t steps) {
    slot(rank_).progress.store(seq * detail::step_space + steps, std::memory_order_release);
    slot(rank_).signal.publish();
  }

  // Publish a descriptor for the next operation and wait until every rank has published its own.
  std::uint64_t post(const detail::local_descriptor& d) {
    TRIDENT_EXPECT(group_ != nullptr, "local_comm: used after being moved from");
    const std::uint64_t seq = ++seq_;
    auto& mine = slot(rank_);
    mine.desc = d;
    mine.progress.store(seq * detail::step_space, std::memory_order_relaxed);
    mine.inside.store(seq, std::memory_order_seq_cst);
    mine.arrived.store(seq, std::memory_order_release);
    mine.signal.publish();
    const std::string_view what = d.kind < 100 ? name_of(static_cast<collective>(d.kind))
                                    : (d.kind == static_cast<int>(detail::local_kind::barrier) ? "barrier" : "split");
    try {
      for (int p = 0; p < size(); ++p) {
        auto& a = slot(p).arrived;
        wait_until([&] { return a.load(std::memory_order_acquire) >= seq; }, what, p);
      }
    } catch (...) {
      leave_after_failure(seq);
      throw;
    }
    // A peer may have arrived and left again by an error before this rank arrived: every rank it
    // waited for had arrived. Such a peer's buffers may be gone. It left after the world was
    // aborted and then found this rank not inside; this rank marked itself inside before this
    // load. Both sides seq_cst, so at least one of them sees the other: either the peer waits
    // for this rank, or this rank leaves here without reading anything.
    if (world().aborted.load(std::memory_order_seq_cst)) {
      leave_after_failure(seq);
      throw aborted_error(what);
    }
    // Every rank sees the same descriptors, so every rank reaches the same verdict.
    for (int p = 0; p < size(); ++p) {
      const auto& o = slot(p).desc;
      if (o.kind != d.kind) {
        const std::string_view theirs = o.kind < 100 ? name_of(static_cast<collective>(o.kind))
                                          : (o.kind == static_cast<int>(detail::local_kind::barrier) ? "barrier" : "split");
        finish(seq);
        disagreed_ = true;
        throw usage_error(detail::concat(what, " #", seq, ": rank ", p, " called ", theirs, " at the same point; all ranks must "
                                 "call the same collectives in the same order"));
      }
      if (d.kind >= 100) continue;
      std::string mismatch;
      if (o.call.type != d.call.type)
        mismatch = detail::concat("element type: rank ", p, " has ", name_of(o.call.type), ", rank ", rank_, " has ", name_of(d.call.type));
      else if (o.call.send_count != d.call.send_count)
        mismatch = detail::concat("element count: rank ", p, " sends ", o.call.send_count, ", rank ", rank_, " sends ", d.call.send_count);
      else if (o.call.op != d.call.op)
        mismatch = detail::concat("reduction: rank ", p, " uses ", name_of(o.call.op), ", rank ", rank_, " uses ", name_of(d.call.op));
      else if (o.call.root != d.call.root)
        mismatch = detail::concat("root: rank ", p, " names ", o.call.root, ", rank ", rank_, " names ", d.call.root);
      if (!mismatch.empty()) {
        finish(seq);
        disagreed_ = true;
        throw usage_error(detail::concat(what, " #", seq, ": ranks disagree on the ", mismatch));
      }
    }
    return seq;
  }
  // Leave only when every rank is done reading everyone's memory.
  void finish(std::uint64_t seq) {
    slot(rank_).inside.store(0, std::memory_order_seq_cst);  // release: what this rank read happens before a leaving peer frees it
    slot(rank_).progress.store(detail::done_mark(seq), std::memory_order_release);
    slot(rank_).signal.publish();
    try {
      for (int p = 0; p < size(); ++p) wait_progress(p, seq, detail::step_space - 1, "collective completion");
    } catch (...) {
      leave_after_failure(seq);
      throw;
    }
  }
  // This rank leaves operation `seq` by an exception (the world is aborted by now: every path
  // that throws here aborts first). Its buffers, scratch and descriptor may be freed as soon as
  // it returns, while a peer that already passed its last wait may still be combining or copying
  // from them: wait, bounded by the timeout, until no peer is inside `seq`. Peers notice the
  // abort at their next wait (within local_sleep_limit), so this lasts as long as the copy in
  // flight. Every peer clears its own mark before waiting here, so two leaving ranks never wait
  // for each other.
  void leave_after_failure(std::uint64_t seq) noexcept {
    slot(rank_).inside.store(0, std::memory_order_seq_cst);
    const auto deadline = std::chrono::steady_clock::now() + options().timeout;
    for (int p = 0; p < size(); ++p) {
      if (p == rank_) continue;
      const auto& mark = slot(p).inside;
      while (mark.load(std::memory_order_seq_cst) == seq && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::byte* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_ = buffer<std::byte>(bytes, mem_category::communication);
    return scratch_.data();
  }

  // ---- the algorithms ---------------------------------------------------------------------
  // Small all-reduces and reduce-scatters take one step instead of the ring's 2(n-1): a chain of
  // n-1 hand-offs costs more than reading every peer's few bytes.
  bool one_shot(const collective_call& c) const {
    return size() > 1 && (c.kind == collective::all_reduce || c.kind == collective::reduce_scatter) &&
           c.send_count * size_of(c.type) <= detail::local_one_shot_bytes;
  }

  void run_collective(const collective_call& call) {
    raise_deferred();
    detail::local_descriptor d;
    d.kind = static_cast<int>(call.kind);
    d.call = call;  // what peers compare: the caller's op, avg included
    collective_call c = call;
    const std::size_t elem = size_of(c.type);
    if (detail::premultiplied_avg(c.type, c.op) && size() > 1 && c.send_count != 0) {
      // fp16/bf16 avg: every rank scales its input by 1/n first and the ranks sum the scaled
      // copies (peers read them through the descriptor), so partial sums stay in range.
      if (prescaled_.size() < c.send_count * elem) prescaled_ = buffer<std::byte>(c.send_count * elem, mem_category::communication);
      detail::host_prescale(c.type, prescaled_.data(), c.send, c.send_count, size());
      c.send = prescaled_.data();
      c.op = reduce_op::sum;
      d.call.send = c.send;
    }
    if (one_shot(c)) {
      d.readable = c.send;
      const std::uint64_t seq = post(d);  // every rank agrees on kind, type and count, so on one_shot
      std::size_t bytes = 0;
      try {
        bytes = one_shot_reduce(c);
      } catch (...) {
        world().abort(world_rank(), detail::concat(name_of(c.kind), " failed on this rank"));
        leave_after_failure(seq);
        throw;
      }
      finish(seq);
      // Only now, with every peer done reading the inputs (an in-place all-reduce overwrites
      // its own), and before this rank posts again (peers read nothing of it until then).
      if (bytes != 0) std::memcpy(c.recv, scratch_.data(), bytes);
      return;
    }
    switch (c.kind) {
      case collective::all_reduce: d.readable = c.recv; break;
      case collective::reduce_scatter:
      case collective::reduce: d.readable = scratch(c.send_count * elem); break;
      case collective::all_gather: d.readable = c.recv; break;
      case collective::broadcast: d.readable = c.recv; break;
      case collective::all_to_all: d.readable = c.send; break;
    }
    const std::uint64_t seq = post(d);
    try {
      switch (c.kind) {
        case collective::all_reduce: {
          const std::byte* final_chunk = ring_reduce_scatter(seq, c, static_cast<std::byte*>(c.recv), nullptr);
          (void)final_chunk;
          ring_all_gather(seq, c.type, c.send_count, static_cast<std::byte*>(c.recv), size() - 1);
          break;
        }
        case collective::reduce_scatter:
          ring_reduce_scatter(seq, c, static_cast<std::byte*>(const_cast<void*>(d.readable)), static_cast<std::byte*>(c.recv));
          break;
        case collective::all_gather: {
          const detail::chunking k{c.recv_count, static_cast<std::size_t>(size()), elem};
          auto* out = static_cast<std::byte*>(c.recv);
          const auto me = static_cast<std::size_t>(rank_);
          if (c.send != out + k.offset_bytes(me)) std::memcpy(out + k.offset_bytes(me), c.send, k.size(me) * elem);
          set_progress(seq, 1);
          ring_all_gather(seq, c.type, c.recv_count, out, 1);
          break;
        }
        case collective::broadcast:
          if (rank_ != c.root && c.recv_count != 0)
            std::memcpy(c.recv, slot(c.root).desc.readable, c.recv_count * elem);
          break;
        case collective::reduce: {
          auto* acc = static_cast<std::byte*>(const_cast<void*>(d.readable));
          ring_reduce_scatter(seq, c, acc, acc);
          if (rank_ == c.root) {
            const detail::chunking k{c.send_count, static_cast<std::size_t>(size()), elem};
            for (int p = 0; p < size(); ++p) {
              wait_progress(p, seq, static_cast<std::uint64_t>(size() - 1), "reduce");
              const auto pc = static_cast<std::size_t>(p);
              if (k.size(pc) != 0)
                std::memcpy(static_cast<std::byte*>(c.recv) + k.offset_bytes(pc),
                            static_cast<const std::byte*>(slot(p).desc.readable) + k.offset_bytes(pc), k.size(pc) * elem);
            }
          }
          break;
        }
        case collective::all_to_all: {
          const std::size_t chunk = c.send_count / static_cast<std::size_t>(size()) * elem;
          for (int p = 0; p < size(); ++p)
            if (chunk != 0)
              std::memcpy(static_cast<std::byte*>(c.recv) + static_cast<std::size_t>(p) * chunk,
                          static_cast<const std::byte*>(slot(p).desc.readable) + static_cast<std::size_t>(rank_) * chunk, chunk);
          break;
        }
      }
    } catch (...) {
      // Peers may be waiting on this rank's progress; make sure they do not wait in vain.
      world().abort(world_rank(), detail::concat(name_of(c.kind), " failed on this rank"));
      leave_after_failure(seq);
      throw;
    }
    finish(seq);
  }

  // Every rank reduces the elements it owns (all of them for all_reduce, its chunk for
  // reduce_scatter) straight from every peer's input, in rank order 0, 1, ..., n-1, so results
  // are identical on every rank and an all-reduce equals the reduce-scatter of the same count.
  // The result is left in scratch_ (its size in bytes is returned) and copied out after finish().
  std::size_t one_shot_reduce(const collective_call& c) {
    const std::size_t elem = size_of(c.type);
    const bool all = c.kind == collective::all_reduce;
    const std::size_t count = all ? c.send_count : c.recv_count;
    const std::size_t offset = all ? 0 : static_cast<std::size_t>(rank_) * c.recv_count * elem;
    auto input = [&](int p) { return static_cast<const std::byte*>(slot(p).desc.call.send) + offset; };
    if (count == 0) return 0;
    std::byte* acc = scratch(count * elem);
    detail::host_combine(c.type, c.op, acc, input(0), input(1), count);
    for (int p = 2; p < size(); ++p) detail::host_combine(c.type, c.op, acc, acc, input(p), count);
    if (c.op == reduce_op::avg) detail::host_divide(c.type, acc, count, size());
    return count * elem;
  }

  // Ring reduce-scatter over `count = c.send_count` elements. In step s (0..n-2) rank r combines
  // chunk (r-2-s) of its input with the predecessor's partial (its input at s = 0), so after
  // n-1 steps rank r holds the full reduction of chunk r, written to `out_chunk` when given
  // (reduce_scatter) or in place in `acc`. Steps completed are published as progress 1..n-1.
  const std::byte* ring_reduce_scatter(std::uint64_t seq, const collective_call& c, std::byte* acc, std::byte* out_chunk) {
    const int n = size();
    const std::size_t elem = size_of(c.type);
    const detail::chunking k{c.send_count, static_cast<std::size_t>(n), elem};
    const auto* in = static_cast<const std::byte*>(c.send);
    const auto me = static_cast<std::size_t>(rank_);
    const int pred = (rank_ + n - 1) % n;
    const int succ = (rank_ + 1) % n;
    std::byte* final_dst = out_chunk ? (out_chunk == acc ? acc + k.offset_bytes(me) : out_chunk) : acc + k.offset_bytes(me);
    if (n == 1) {
      if (final_dst != in && k.size(0) != 0) std::memcpy(final_dst, in, k.size(0) * elem);
    }
    for (int s = 0; s < n - 1; ++s) {
      const std::size_t chunk = detail::mod(rank_ - 2 - s, n);
      wait_progress(pred, seq, static_cast<std::uint64_t>(s), name_of(c.kind));
      wait_progress(succ, seq, static_cast<std::uint64_t>(s > 0 ? s - 1 : 0), name_of(c.kind));
      const std::byte* theirs = (s == 0 ? static_cast<const std::byte*>(slot(pred).desc.call.send)
                                        : static_cast<const std::byte*>(slot(pred).desc.readable)) +
                                k.offset_bytes(chunk);
      std::byte* dst = s == n - 2 ? final_dst : acc + k.offset_bytes(chunk);
      detail::host_combine(c.type, c.op, dst, theirs, in + k.offset_bytes(chunk), k.size(chunk));
      // avg: divide before publishing the last step, which is what lets peers copy the chunk.
      if (s == n - 2 && c.op == reduce_op::avg && k.size(me) != 0) detail::host_divide(c.type, final_dst, k.size(me), n);
      set_progress(seq, static_cast<std::uint64_t>(s + 1));
    }
    return final_dst;
  }

  // Ring all-gather of the finished chunks of `out` (rank r holds chunk r). Step s pulls chunk
  // (r-1-s) from the predecessor; steps are numbered from `first_step` in the progress counter.
  void ring_all_gather(std::uint64_t seq, dtype type, std::size_t count, std::byte* out, int first_step) {
    const int n = size();
    const std::size_t elem = size_of(type);
    const detail::chunking k{count, static_cast<std::size_t>(n), elem};
    const int pred = (rank_ + n - 1) % n;
    const int succ = (rank_ + 1) % n;
    for (int s = 0; s < n - 1; ++s) {
      const int g = first_step + s;
      const std::size_t chunk = detail::mod(rank_ - 1 - s, n);
      wait_progress(pred, seq, static_cast<std::uint64_t>(g), "all_gather");
      wait_progress(succ, seq, static_cast<std::uint64_t>(g - 1), "all_gather");
      if (k.size(chunk) != 0)
        std::memcpy(out + k.offset_bytes(chunk), static_cast<const std::byte*>(slot(pred).desc.readable) + k.offset_bytes(chunk),
                    k.size(chunk) * elem);
      set_progress(seq, static_cast<std::uint64_t>(g + 1));
    }
  }

  // Sends are posted first, then receives served in order, then this rank waits for its sends
  // to be taken: any set of exchanges that matches up completes, whatever the issue order.
  void run_p2p(std::span<const p2p_op<host_space>> ops) {
    auto& g = *group_;
    const int n = size();
    std::vector<detail::local_pending_send> sends;
    sends.reserve(ops.size());  // never reallocated: receivers hold pointers into it
    {
      std::lock_guard lock(g.p2p_mutex);
      for (const auto& op : ops)
        if (op.kind == p2p_kind::send) {
          sends.push_back({.data = op.data, .count = op.count, .type = op.type, .src = rank_, .taken = false, .done = false, .error = {}});
          g.channels[static_cast<std::size_t>(rank_ * n + op.peer)].push_back(&sends.back());
        }
      posted_sends_ = sends;  // what withdraw_sends_locked waits for; read under the lock only
    }
    g.p2p_cv.notify_all();
    std::string failure;
    for (const auto& op : ops) {
      if (op.kind != p2p_kind::recv) continue;
      auto& channel = g.channels[static_cast<std::size_t>(op.peer * n + rank_)];
      std::unique_lock lock(g.p2p_mutex);
      p2p_wait(lock, [&] { return !channel.empty(); }, "recv", op.peer);
      detail::local_pending_send* s = channel.front();
      channel.pop_front();
      s->taken = true;  // from here the sender waits for `done` even when it leaves by an error
      if (s->count != op.count || s->type != op.type) {
        s->error = detail::concat("send to rank ", rank_, ": ", s->count, " ", name_of(s->type), " elements, but the matching recv "
                          "expects ", op.count, " ", name_of(op.type));
        if (failure.empty())
          failure = detail::concat("recv from rank ", op.peer, ": expected ", op.count, " ", name_of(op.type),
                           " elements, but the matching send has ", s->count, " ", name_of(s->type));
      } else if (op.count != 0) {
        lock.unlock();  // the copy needs no lock: the sender waits for `done`
        std::memcpy(op.data, s->data, op.count * size_of(op.type));
        lock.lock();
      }
      s->done = true;
      g.p2p_cv.notify_all();
    }
    {
      std::unique_lock lock(g.p2p_mutex);
      for (auto& s : sends) {
        p2p_wait(lock, [&] { return s.done; }, "send", -1);
        if (failure.empty() && !s.error.empty()) failure = s.error;
      }
      posted_sends_ = {};
    }
    if (!failure.empty()) throw usage_error(failure);
  }

  template <class Ready>
  void p2p_wait(std::unique_lock<std::mutex>& lock, Ready ready, std::string_view what, int peer) {
    const auto deadline = std::chrono::steady_clock::now() + options().timeout;
    while (!ready()) {
      if (world().aborted.load(std::memory_order_acquire)) {
        withdraw_sends_locked(lock);
        throw aborted_error(what);
      }
      if (peer_left(peer)) {
        withdraw_sends_locked(lock);
        const std::string why = detail::concat(what, " on rank ", rank_, " waits for rank ", peer,
                                               ", which has returned from its function without sending");
        world().abort(world_rank(), why);
        throw error(why);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        withdraw_sends_locked(lock);
        const std::string why = detail::concat("timed out after ", options().timeout.count(), " ms in ", what,
                                       peer >= 0 ? detail::concat(" from rank ", peer) : std::string(" waiting for receivers"));
        world().abort(world_rank(), why);
        throw error(detail::concat(what, " on rank ", rank_, ": ", why));
      }
      group_->p2p_cv.wait_for(lock, std::chrono::milliseconds(10));
    }
  }
  // Our posted sends point into our stack and the caller's buffers: take back those no receiver
  // has taken, and wait for the copies of those being taken (a receiver copies without the lock
  // and then sets `done`, never failing in between), so that nothing reads them once we leave.
  void withdraw_sends_locked(std::unique_lock<std::mutex>& lock) {
    const int n = size();
    for (int p = 0; p < n; ++p) {
      auto& ch = group_->channels[static_cast<std::size_t>(rank_ * n + p)];
      std::erase_if(ch, [&](detail::local_pending_send* s) { return s->src == rank_ && !s->done; });
    }
    group_->p2p_cv.wait(lock, [&] {
      return std::ranges::none_of(posted_sends_, [](const detail::local_pending_send& s) { return s.taken && !s.done; });
    });
  }

  // ---- the asynchronous worker ------------------------------------------------------------
  template <class Work>
  request start_work(std::string_view what, Work work);

  struct worker_state {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    std::size_t pending = 0;  // queued + running
    bool stop = false;
    std::thread thread;
  };
  void enqueue(std::function<void()> task) {
    if (!worker_) {
      worker_ = std::make_unique<worker_state>();
      worker_->thread = std::thread([w = worker_.get()] {
        std::unique_lock lock(w->mutex);
        for (;;) {
          w->cv.wait(lock, [&] { return w->stop || !w->queue.empty(); });
          if (w->queue.empty()) return;
          auto t = std::move(w->queue.front());
          w->queue.pop_front();
          lock.unlock();
          t();  // never throws: tasks store their exception in their request
          lock.lock();
          --w->pending;
          w->cv.notify_all();
        }
      });
    }
    {
      std::lock_guard lock(worker_->mutex);
      worker_->queue.push_back(std::move(task));
      ++worker_->pending;
    }
    worker_->cv.notify_all();
  }
  void drain() {
    if (!worker_) return;
    std::unique_lock lock(worker_->mutex);
    worker_->cv.wait(lock, [&] { return worker_->pending == 0; });
  }
  void stop_worker() noexcept {
    if (!worker_) return;
    {
      std::lock_guard lock(worker_->mutex);
      worker_->stop = true;
      // Destroyed by an exception with work still queued: the peers may wait for this rank in
      // that work, and this rank waits for it to finish. Abort now, naming this rank, so both
      // sides fail at once instead of after the timeout. Work not yet started, not `pending`:
      // a task counts as pending a moment after its request is done, and a rank that waited
      // for every request and then threw must not abort the world with this (misleading) reason.
      // (A request dropped while its work runs aborts in its own destructor.)
      if (!worker_->queue.empty() && std::uncaught_exceptions() > 0 && group_)
        world().abort(world_rank(), "an exception left the rank's function with asynchronous operations queued");
    }
    worker_->cv.notify_all();
    worker_->thread.join();  // runs what is queued first: requests never dangle
    worker_.reset();
  }

  // What the asynchronous operations' failures leave for the caller, shared with the requests.
  //  - error: the first error of an operation whose request was dropped without wait(), raised
  //    by this rank's next operation (or synchronize(), which run() calls at the end).
  //  - disagreement: the message of the last asynchronous collective whose descriptors
  //    disagreed (post()). It fails every operation started up to the moment an error next
  //    reaches the caller: `epoch` moves on each time one does (a wait() that rethrows,
  //    raise_deferred, raise_disagreement), and operations started in an epoch up to
  //    `disagreement_epoch` fail, even those that still wait on the worker after the caller
  //    knows; later ones run (see the top of this header).
  struct deferred_error {
    std::mutex mutex;
    std::exception_ptr error;
    std::string disagreement;  // empty: none
    std::uint64_t disagreement_epoch = 0;
    bool unobserved = false;  // no error has reached the caller since the disagreement
    std::uint64_t epoch = 0;

    std::uint64_t current_epoch() {
      std::lock_guard lock(mutex);
      return epoch;
    }
    // The disagreement that fails an operation started in epoch `started`, if any.
    std::string disagreement_for(std::uint64_t started) {
      std::lock_guard lock(mutex);
      return !disagreement.empty() && started <= disagreement_epoch ? disagreement : std::string();
    }
    // The disagreement that a synchronous call must raise: one the caller has not heard of.
    std::string unobserved_disagreement() {
      std::lock_guard lock(mutex);
      return unobserved ? disagreement : std::string();
    }
    void disagree(std::string why) {
      std::lock_guard lock(mutex);
      disagreement = std::move(why);
      disagreement_epoch = epoch;
      unobserved = true;
    }
    // An error reached the caller: operations started from now on run.
    void observed() {
      std::lock_guard lock(mutex);
      ++epoch;
      unobserved = false;
    }
  };
  void raise_deferred() {
    if (!deferred_) return;
    std::exception_ptr e;
    {
      std::lock_guard lock(deferred_->mutex);
      e = std::exchange(deferred_->error, nullptr);
    }
    if (e) {
      deferred_->observed();
      std::rethrow_exception(e);
    }
  }
  // A synchronous call (after drain()) while an asynchronous collective's disagreement has not
  // reached the caller: the call would be matched with a peer's operation of another position.
  void raise_disagreement(std::string_view what) {
    if (!deferred_) return;
    const std::string why = deferred_->unobserved_disagreement();
    if (why.empty()) return;
    deferred_->observed();
    throw usage_error(detail::concat(what, " on rank ", rank_, " was not run: an asynchronous operation started before it on "
                                     "this rank failed because the ranks disagree (", why, "), and nothing has waited for "
                                     "that failure yet; what was started after it failed too, so that the ranks' operations "
                                     "stay matched"));
  }
  // An operation started in an epoch that a disagreement fails.
  usage_error not_run(std::string_view what, const std::string& why) const {
    return usage_error(detail::concat(what, " (asynchronous) on rank ", rank_, " was not run: an operation this rank started "
                                      "before it failed because the ranks disagree (", why, "); what a rank started before "
                                      "such a failure reached it fails too, so that the ranks stay matched"));
  }

  std::shared_ptr<detail::local_group> group_;
  int rank_ = -1;
  std::uint64_t seq_ = 0;
  std::span<detail::local_pending_send> posted_sends_;  // run_p2p's sends, while it runs
  buffer<std::byte> scratch_;
  buffer<std::byte> prescaled_;  // fp16/bf16 avg: this rank's input scaled by 1/n
  std::shared_ptr<deferred_error> deferred_ = std::make_shared<deferred_error>();
  bool disagreed_ = false;  // post() found the descriptors disagree (read by the worker's task)
  std::shared_ptr<memory_ledger> ledger_ = current_ledger();  // charged by the worker thread too
  std::unique_ptr<worker_state> worker_;
};

//! An asynchronous operation of a local_comm, running on the rank's worker thread.
class local_comm::request {
 public:
  request() = default;
  request(request&&) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~request() { finish_quietly(); }

  //! Blocks until the operation has completed; rethrows its error (once).
  void wait() {
    if (!state_) return;
    auto s = std::move(state_);
    std::unique_lock lock(s->mutex);
    s->cv.wait(lock, [&] { return s->done; });
    if (s->failure) {
      if (s->deferred) s->deferred->observed();  // what the caller starts from now on runs
      std::rethrow_exception(s->failure);
    }
  }
  bool test() {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }

 private:
  friend class local_comm;
  struct state {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr failure;
    std::shared_ptr<deferred_error> deferred;         // where an unobserved failure goes
    std::shared_ptr<detail::local_world_state> world;  // aborted when unwinding with this queued
    int world_rank = -1;
  };
  // Dropped without wait(): let the operation finish (it uses the caller's buffers), and hand
  // its error, if any, to the communicator, whose next call raises it. When an exception is
  // unwinding the rank, abort the world first: peers may be waiting for this rank inside it.
  void finish_quietly() noexcept {
    if (!state_) return;
    {
      std::unique_lock lock(state_->mutex);
      if (!state_->done && std::uncaught_exceptions() > 0 && state_->world)
        state_->world->abort(state_->world_rank, "an exception left the rank's function with an asynchronous operation pending");
      state_->cv.wait(lock, [&] { return state_->done; });
      if (state_->failure && state_->deferred) {
        std::lock_guard keep(state_->deferred->mutex);
        if (!state_->deferred->error) state_->deferred->error = state_->failure;
      }
    }  // unlocked before the state (and its mutex) may go
    state_.reset();
  }
  std::shared_ptr<state> state_;
};

template <class Work>
local_comm::request local_comm::start_work(std::string_view what, Work work) {
  raise_deferred();
  request r;
  r.state_ = std::make_shared<request::state>();
  r.state_->deferred = deferred_;
  r.state_->world = group_->world;
  r.state_->world_rank = world_rank();
  // Failed without taking part if an operation before it disagrees before the caller learns of
  // an error (see the top of this header).
  const std::uint64_t epoch = deferred_->current_epoch();
  // The worker charges what the operation allocates to the ledger current where it was started.
  enqueue([this, what, epoch, work = std::move(work), s = r.state_, ledger = current_ledger()] {
    std::exception_ptr failure;
    try {
      disagreed_ = false;  // set by this work's post() only
      scoped_ledger use{ledger};
      if (const std::string why = deferred_->disagreement_for(epoch); !why.empty()) throw not_run(what, why);
      work();
    } catch (...) {
      failure = std::current_exception();  // delivered by request::wait()
      if (std::exchange(disagreed_, false)) {
        try {
          throw;
        } catch (const error& e) {
          deferred_->disagree(std::string(e.message()));
        } catch (...) {
          deferred_->disagree("the ranks' descriptors differ");
        }
      }
    }
    std::lock_guard lock(s->mutex);
    s->failure = failure;
    s->done = true;
    s->cv.notify_all();
  });
  return r;
}

inline local_comm::request local_comm::start(const collective_call& call) {
  return start_work(name_of(call.kind), [this, call] { run_collective(call); });
}

inline local_comm::request local_comm::start(std::span<const p2p_op<host_space>> ops) {
  return start_work("exchange", [this, copy = std::vector<p2p_op<host_space>>(ops.begin(), ops.end())] { run_p2p(copy); });
}

//! Runs fn(local_comm&) on n threads, one rank each, and waits for all of them. If fn returns
//! a value, run returns them in rank order. The first exception thrown by any rank aborts the
//! others (they throw trident::error instead of hanging) and is rethrown here; so does a rank
//! that waits for a peer whose fn has already returned. Each rank's thread has a memory ledger
//! of its own ("rank r", comm.ledger()), which its asynchronous operations charge too.
//!
//!   auto ranks = trident::local_world::run(3, [](trident::local_comm& c) { return c.rank(); });
//!   // ranks == {0, 1, 2}
struct local_world {
  template <class Fn>
    requires std::invocable<Fn&, local_comm&>
  static auto run(int n, Fn fn, local_options options = {}) {
    TRIDENT_EXPECT(n >= 1, "local_world::run: expected at least one rank, got ", n);
    TRIDENT_EXPECT(options.timeout.count() > 0, "local_world::run: the timeout must be positive, got ",
                   options.timeout.count(), " ms");
    using result = std::invoke_result_t<Fn&, local_comm&>;
    auto world = std::make_shared<detail::local_world_state>(options, n);
    std::vector<int> ranks(static_cast<std::size_t>(n));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto group = std::make_shared<detail::local_group>(world, std::move(ranks));

    std::vector<std::exception_ptr> failures(static_cast<std::size_t>(n));
    using stored = std::conditional_t<std::is_void_v<result>, char, result>;
    std::vector<std::optional<stored>> results(static_cast<std::size_t>(n));
    auto body = [&](int r) {
      try {
        scoped_ledger use{std::make_shared<memory_ledger>(detail::concat("rank ", r))};
        local_comm comm(group, r);
        if constexpr (std::is_void_v<result>) {
          fn(comm);
        } else {
          results[static_cast<std::size_t>(r)].emplace(fn(comm));
        }
        comm.synchronize();
        world->left[static_cast<std::size_t>(r)].store(true, std::memory_order_release);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
        world->abort(r, e.what());
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
        world->abort(r, "an exception not derived from std::exception");
      }
    };
    {
      std::vector<std::thread> threads;
      threads.reserve(static_cast<std::size_t>(n));
      for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
      body(0);  // rank 0 on the calling thread: n = 1 costs no thread
      for (auto& t : threads) t.join();
    }
    // The root cause is the failure of the rank that aborted the world first (its own exception,
    // or the timeout it hit); the others only echo it. Unless that one is itself an echo
    // (error::echo(): a collective check raising on every rank, where the failing rank may
    // abort later than the others): then the first failure that is not one.
    if (world->aborted.load()) {
      const auto echoes = [](const std::exception_ptr& f) {
        try {
          std::rethrow_exception(f);
        } catch (const error& e) {
          return e.echo();
        } catch (...) {
          return false;
        }
      };
      const int first = world->failed_rank;
      const std::exception_ptr* chosen = first >= 0 && failures[static_cast<std::size_t>(first)] ? &failures[static_cast<std::size_t>(first)]
                                                                                                : nullptr;
      if (!chosen || echoes(*chosen))
        for (auto& f : failures)
          if (f && !echoes(f)) {
            chosen = &f;
            break;
          }
      if (chosen) std::rethrow_exception(*chosen);
      for (auto& f : failures)
        if (f) std::rethrow_exception(f);
      throw error(detail::concat("local_world::run: ", world->describe()));
    }
    if constexpr (!std::is_void_v<result>) {
      std::vector<result> out;
      out.reserve(static_cast<std::size_t>(n));
      for (auto& r : results) out.push_back(std::move(*r));
      return out;
    }
  }
};

static_assert(communicator<local_comm>);

}  // namespace trident
