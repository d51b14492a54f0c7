#pragma once
// A network to train across, simulated over any host communicator: ranks grouped into clusters,
// links inside a cluster and between two, each with a latency and a bandwidth, every byte that
// crosses one counted, and a simulated clock per rank.
//
//   struct link                     latency (s) and bandwidth (bytes/s) of a rank-to-rank link
//   struct cluster_map              the cluster of each rank; the link inside and the link across
//   struct wire_counters            messages and bytes this rank sent, inside and across
//   enum class wire_algorithm       ring or direct collectives
//   struct slow_link_options        algorithm, whether the rank's own CPU time counts as time
//   class slow_link_comm<Inner>     the communicator: Inner's ranks, every collective run as
//                                   messages over Inner's point-to-point
//
// Why an adapter and not a delay around Inner's collectives: what crosses a slow link depends on
// the algorithm (a ring all-reduce over two clusters crosses between them twice per step, a
// hierarchical one once per chunk), so the adapter runs the algorithm itself, message by message,
// and each message is charged to the link it takes. Bytes are counted as they are sent, not
// estimated; wire() reports them per rank.
//
// Time is simulated, not slept: each rank has a clock (now(), in seconds). A message sent at
// time t over link l arrives at max(t, the link's previous message's end) + bytes / bandwidth +
// latency, and a receiver's clock moves to the arrival if that is later. Between calls the clock
// advances by the CPU time the rank's thread used (its compute: CLOCK_THREAD_CPUTIME_ID, so
// eight thread ranks on two cores each see the time their own work took), or only by advance()
// when slow_link_options::count_compute is false. Links are per ordered pair of ranks: two
// ranks of one cluster sending across at once do not share bandwidth (give `across` the
// bandwidth each flow gets). The clock is shared by the communicators split from one rank's,
// which are therefore used from one thread (two threads at once are refused).
//
// Results are reduced in a fixed order (ring: along the ring; direct: in rank order), so every
// rank holds the same bits. Data moves before a call returns; an asynchronous form's request
// carries the simulated time its messages finish, and its wait() moves the clock there, so
// communication started early overlaps the compute in between. Host memory only.
//
//   auto map = trident::cluster_map::blocks(8, 4, {.latency = 1e-6, .bandwidth = 100e9},   // inside
//                                                  {.latency = 0.1, .bandwidth = 1e9});     // across
//   trident::local_world::run(8, [&](trident::local_comm& c) {
//     trident::slow_link_comm<trident::local_comm> net(std::move(c), map);
//     net.all_reduce(grads, trident::reduce_op::avg);
//     net.wire().across.bytes;   // what this rank sent over the slow link
//     net.now();                 // simulated seconds
//   });
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/comm/host_reduce.hpp"
#include "trident/core/error.hpp"

namespace trident {

//! A rank-to-rank link: a message of b bytes takes latency + b / bandwidth seconds.
struct link {
  double latency = 0.0;                                      // seconds
  double bandwidth = std::numeric_limits<double>::infinity();  // bytes per second
  double seconds(std::size_t bytes) const noexcept {
    return latency + (std::isinf(bandwidth) ? 0.0 : static_cast<double>(bytes) / bandwidth);
  }
};

//! Which cluster each rank of a communicator belongs to (any non-negative ids), and the link
//! between two ranks of one cluster (`inside`) or of two (`across`).
//!
//!   trident::cluster_map m{{0, 0, 1, 1}, {.latency = 1e-6}, {.latency = 0.1, .bandwidth = 1e9}};
//!   auto same = trident::cluster_map::blocks(4, 2, {.latency = 1e-6}, {.latency = 0.1, .bandwidth = 1e9});
struct cluster_map {
  std::vector<int> cluster_of;
  link inside{}, across{};

  //! `ranks` ranks in clusters of `per_cluster` consecutive ranks.
  static cluster_map blocks(int ranks, int per_cluster, link inside, link across) {
    TRIDENT_EXPECT(ranks >= 1 && per_cluster >= 1 && ranks % per_cluster == 0, "cluster_map::blocks: ", ranks,
                   " ranks do not split into clusters of ", per_cluster);
    cluster_map m{std::vector<int>(static_cast<std::size_t>(ranks)), inside, across};
    for (int r = 0; r < ranks; ++r) m.cluster_of[static_cast<std::size_t>(r)] = r / per_cluster;
    return m;
  }
  const link& between(int a, int b) const { return cluster_of.at(static_cast<std::size_t>(a)) == cluster_of.at(static_cast<std::size_t>(b)) ? inside : across; }
  bool crosses(int a, int b) const { return cluster_of.at(static_cast<std::size_t>(a)) != cluster_of.at(static_cast<std::size_t>(b)); }
  //! How many distinct clusters.
  int clusters() const {
    std::vector<int> ids(cluster_of);
    std::sort(ids.begin(), ids.end());
    return static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin());
  }
  //! Usage error unless the map covers exactly `ranks` ranks with valid ids and links.
  void check(int ranks, std::string_view who) const {
    TRIDENT_EXPECT(cluster_of.size() == static_cast<std::size_t>(ranks), who, ": the cluster map places ", cluster_of.size(),
                   " ranks; the communicator has ", ranks, " (expected one cluster id per rank)");
    for (std::size_t r = 0; r < cluster_of.size(); ++r)
      TRIDENT_EXPECT(cluster_of[r] >= 0, who, ": rank ", r, " is in cluster ", cluster_of[r], "; expected an id >= 0");
    for (const auto& [name, l] : {std::pair<const char*, const link&>{"inside", inside}, {"across", across}}) {
      TRIDENT_EXPECT(l.latency >= 0 && std::isfinite(l.latency), who, ": the ", name, " link's latency is ", l.latency,
                     " s; expected a finite value >= 0");
      TRIDENT_EXPECT(l.bandwidth > 0, who, ": the ", name, " link's bandwidth is ", l.bandwidth, " bytes/s; expected > 0");
    }
  }
};

//! What one rank sent: messages and payload bytes, over links inside its cluster and across.
struct wire_counters {
  struct count {
    std::uint64_t messages = 0;
    std::uint64_t bytes = 0;
    friend bool operator==(const count&, const count&) = default;
  };
  count inside, across;
  count total() const noexcept { return {inside.messages + across.messages, inside.bytes + across.bytes}; }
};

//! How slow_link_comm runs all_reduce, reduce_scatter, all_gather, broadcast and reduce:
//!   ring    neighbours in rank order (NCCL's ring; bandwidth-optimal, n-1 latencies per phase);
//!   direct  every rank to every rank (reduce_scatter to each chunk's owner, then all_gather from
//!           it; one latency per phase, and every pair of ranks exchanges a chunk).
enum class wire_algorithm { ring, direct };

struct slow_link_options {
  wire_algorithm algorithm = wire_algorithm::ring;
  //! Whether the thread's CPU time between calls advances the clock (else only advance() does).
  bool count_compute = true;
};

namespace detail {

inline double thread_cpu_seconds() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

//! One rank's simulated time, shared by the communicators split from its communicator.
struct sim_clock {
  double now = 0.0;
  double cpu_mark = thread_cpu_seconds();
  bool count_compute = true;
  std::vector<double> link_free;  // per world rank: when the link to it is next free
  wire_counters wire;
  std::atomic<bool> busy{false};  // a call is in progress (see slow_link_comm::accounting)

  // The rank's compute since the last call.
  void catch_up() noexcept {
    const double cpu = thread_cpu_seconds();
    if (count_compute) now += cpu - cpu_mark;
    cpu_mark = cpu;
  }
  void pause() noexcept { cpu_mark = thread_cpu_seconds(); }
};

}  // namespace detail

//! A communicator whose messages travel over the links of a cluster_map, counted and timed on
//! a simulated clock (see the top of this header). Inner is any host-space communicator
//! (local_comm, mpi_comm); the adapter owns it.
template <communicator Inner>
  requires std::same_as<typename Inner::space, host_space>
class slow_link_comm : public collectives<slow_link_comm<Inner>, host_space> {
 public:
  //! An asynchronous operation: its data moved before start() returned, but on the simulated
  //! clock it completes at `done`, and the rank works on meanwhile; wait() moves the clock
  //! there if it is not past it yet (so communication overlaps compute in simulated time).
  //! test() says whether the data is there: always.
  struct request {
    std::shared_ptr<detail::sim_clock> clock;
    double done = 0.0;
    void wait() noexcept {
      if (!clock) return;
      clock->catch_up();
      clock->now = std::max(clock->now, done);
      clock->pause();
    }
    bool test() const noexcept { return true; }
  };
  static constexpr nan_in_max_min max_min_nan = nan_in_max_min::propagate;  // host_combine

  slow_link_comm(Inner inner, cluster_map map, slow_link_options options = {})
      : inner_(std::move(inner)), map_(std::move(map)), options_(options) {
    map_.check(inner_.size(), "slow_link_comm");
    world_.resize(static_cast<std::size_t>(inner_.size()));
    for (int r = 0; r < inner_.size(); ++r) world_[static_cast<std::size_t>(r)] = r;
    clock_ = std::make_shared<detail::sim_clock>();
    clock_->count_compute = options_.count_compute;
    clock_->link_free.assign(world_.size(), 0.0);
  }

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  Inner& inner() noexcept { return inner_; }
  const cluster_map& clusters() const noexcept { return map_; }
  int cluster() const { return map_.cluster_of[static_cast<std::size_t>(rank())]; }
  const slow_link_options& options() const noexcept { return options_; }

  //! This rank's simulated time in seconds (its compute so far included when counted).
  double now() {
    clock_->catch_up();
    return clock_->now;
  }
  //! Adds modeled time (e.g. a compute phase that is not this thread's CPU time).
  void advance(double seconds) {
    TRIDENT_EXPECT(seconds >= 0, "slow_link_comm::advance: ", seconds, " s; expected >= 0");
    clock_->catch_up();
    clock_->now += seconds;
  }
  //! Messages and bytes this rank sent (all communicators split from this rank's share them).
  const wire_counters& wire() const noexcept { return clock_->wire; }
  void reset_wire() noexcept { clock_->wire = {}; }

  void execute(const collective_call& c) {
    const accounting a{*clock_};
    if (size() == 1) return single(c);
    switch (c.kind) {
      case collective::all_reduce: return all_reduce_impl(c);
      case collective::reduce_scatter: return reduce_scatter_impl(c);
      case collective::all_gather: return all_gather_impl(c);
      case collective::broadcast: return broadcast_impl(c);
      case collective::reduce: return reduce_impl(c);
      case collective::all_to_all: return all_to_all_impl(c);
    }
  }
  request start(const collective_call& c) {
    const auto [begin, done] = timed([&] { execute(c); });
    clock_->now = begin;
    return {clock_, done};
  }
  void execute(std::span<const p2p_op<host_space>> ops) {
    const accounting a{*clock_};
    std::vector<message> m;
    for (const auto& op : ops) m.push_back({op.kind == p2p_kind::send, op.peer, op.data, op.count * size_of(op.type), op.type});
    transfer(m);
  }
  request start(std::span<const p2p_op<host_space>> ops) {
    const auto [begin, done] = timed([&] { execute(ops); });
    clock_->now = begin;
    return {clock_, done};
  }
  //! Every rank's clock moves to at least the latest arrival of a ring of empty messages: no
  //! rank leaves before every rank has arrived (plus the links' latencies).
  void barrier() {
    const accounting a{*clock_};
    const int n = size();
    for (int s = 0; s + 1 < n; ++s) {
      const message m[] = {{true, next(), nullptr, 0, dtype::uint8}, {false, prev(), nullptr, 0, dtype::uint8}};
      transfer(m);
    }
  }
  void synchronize() noexcept {}

  //! The ranks of the same color, ordered by key (Inner's split), on the same links and clock.
  slow_link_comm split(int color, int key) {
    const accounting a{*clock_};
    Inner sub = inner_.split(color, key);
    // Each new rank's world rank, to find its cluster and its link.
    const int me = world_[static_cast<std::size_t>(rank())];
    std::vector<int> world(static_cast<std::size_t>(sub.size()));
    sub.all_gather(std::span<const int>(&me, 1), std::span<int>(world));
    cluster_map m{{}, map_.inside, map_.across};
    for (int w : world) m.cluster_of.push_back(map_.cluster_of[static_cast<std::size_t>(index_of(w))]);
    return slow_link_comm(std::move(sub), std::move(m), options_, clock_, std::move(world));
  }

 private:
  slow_link_comm(Inner inner, cluster_map map, slow_link_options options, std::shared_ptr<detail::sim_clock> clock,
                 std::vector<int> world)
      : inner_(std::move(inner)), map_(std::move(map)), options_(options), clock_(std::move(clock)), world_(std::move(world)) {}
  // This communicator's rank of world rank w (split() only calls it for members).
  int index_of(int w) const {
    for (std::size_t r = 0; r < world_.size(); ++r)
      if (world_[r] == w) return static_cast<int>(r);
    return -1;
  }

  // The simulated times at which f starts and ends.
  template <class F>
  std::pair<double, double> timed(F&& f) {
    clock_->catch_up();
    const double begin = clock_->now;
    f();
    return {begin, clock_->now};
  }

  // The clock takes in the rank's compute on entry and starts counting it again on exit (the
  // time spent inside, waiting on Inner, is not compute).
  // One thread at a time per rank: the clock is one rank's (its thread's CPU time), shared by the
  // communicators split from it, so two threads calling at once are refused, not mixed up.
  struct accounting {
    detail::sim_clock& c;
    explicit accounting(detail::sim_clock& clock) : c(clock) {
      TRIDENT_EXPECT(c.busy.exchange(true) == false, "slow_link_comm: called from two threads at once on one rank; its "
                     "simulated clock is one thread's (use it, and the communicators split from it, from one thread)");
      c.catch_up();
    }
    ~accounting() {
      c.pause();
      c.busy.store(false);
    }
  };

  struct message {
    bool send;
    int peer;
    void* data;
    std::size_t bytes;
    dtype type;
  };

  int next() const noexcept { return (rank() + 1) % size(); }
  int prev() const noexcept { return (rank() + size() - 1) % size(); }

  // Sends and receives issued together (Inner's exchange), each with its arrival time beside
  // it; the clock moves to the latest arrival.
  void transfer(std::span<const message> ms) {
    std::vector<double> stamps(ms.size());
    std::vector<p2p_op<host_space>> ops;
    ops.reserve(2 * ms.size());
    const double start = clock_->now;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const message& m = ms[i];
      const std::size_t count = m.bytes / size_of(m.type);
      if (m.send) {
        const int to = world_[static_cast<std::size_t>(m.peer)];
        const link& l = map_.between(rank(), m.peer);
        double& free = clock_->link_free[static_cast<std::size_t>(to)];
        const double begin = std::max(start, free);
        free = begin + (l.seconds(m.bytes) - l.latency);
        stamps[i] = free + l.latency;
        auto& w = map_.crosses(rank(), m.peer) ? clock_->wire.across : clock_->wire.inside;
        ++w.messages;
        w.bytes += m.bytes;
        ops.push_back({p2p_kind::send, m.data, count, m.type, m.peer});
        ops.push_back({p2p_kind::send, &stamps[i], 1, dtype::float64, m.peer});
      } else {
        ops.push_back({p2p_kind::recv, m.data, count, m.type, m.peer});
        ops.push_back({p2p_kind::recv, &stamps[i], 1, dtype::float64, m.peer});
      }
    }
    inner_.exchange(std::span<const p2p_op<host_space>>(ops));
    for (std::size_t i = 0; i < ms.size(); ++i)
      if (!ms[i].send) clock_->now = std::max(clock_->now, stamps[i]);
  }

  static std::byte* at(void* p, std::size_t bytes) { return static_cast<std::byte*>(p) + bytes; }
  static const std::byte* at(const void* p, std::size_t bytes) { return static_cast<const std::byte*>(p) + bytes; }

  // Elements [begin(c), begin(c + 1)) of `count` are chunk c of n.
  struct chunks {
    std::size_t count, n;
    std::size_t begin(std::size_t c) const { return count * c / n; }
    std::size_t size(std::size_t c) const { return begin(c + 1) - begin(c); }
  };

  void single(const collective_call& c) {
    const std::size_t bytes = (c.kind == collective::reduce && c.recv == nullptr ? 0 : c.recv_count) * size_of(c.type);
    if (c.kind != collective::broadcast && c.recv != nullptr && c.send != c.recv && bytes != 0) std::memmove(c.recv, c.send, bytes);
  }

  // acc = acc op in, for chunk elements; avg sums (its division or prescaling is done apart).
  static void combine(const collective_call& c, void* acc, const void* in, std::size_t count) {
    detail::host_combine(c.type, c.op == reduce_op::avg ? reduce_op::sum : c.op, acc, in, acc, count);
  }

  // The reduce-scatter phase on `work` (n chunks of `k`): afterwards this rank's chunk rank()
  // holds the reduction over every rank, in an order that does not depend on the rank.
  void reduce_scatter_phase(const collective_call& c, void* work, const chunks& k) {
    const std::size_t e = size_of(c.type), n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    std::size_t largest = 0;
    for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, k.size(i));
    std::vector<std::byte> scratch(largest * e * (options_.algorithm == wire_algorithm::direct ? n : 1));
    if (options_.algorithm == wire_algorithm::ring) {
      // Step s: chunk (r - s - 1) goes to the next rank, chunk (r - s - 2) comes from the previous
      // one and is folded in; after n - 1 steps chunk r is complete here.
      for (std::size_t s = 0; s + 1 < n; ++s) {
        const std::size_t out = (me + 2 * n - s - 1) % n, in = (me + 2 * n - s - 2) % n;
        const message m[] = {{true, next(), at(work, k.begin(out) * e), k.size(out) * e, c.type},
                             {false, prev(), scratch.data(), k.size(in) * e, c.type}};
        transfer(m);
        combine(c, at(work, k.begin(in) * e), scratch.data(), k.size(in));
      }
    } else {
      // Chunk j to rank j; chunk r from everyone, folded in rank order.
      std::vector<message> m;
      for (std::size_t j = 0; j < n; ++j) {
        if (j == me) continue;
        m.push_back({true, static_cast<int>(j), at(work, k.begin(j) * e), k.size(j) * e, c.type});
        m.push_back({false, static_cast<int>(j), scratch.data() + j * largest * e, k.size(me) * e, c.type});
      }
      transfer(m);
      if (k.size(me) == 0) return;
      std::memcpy(scratch.data() + me * largest * e, at(work, k.begin(me) * e), k.size(me) * e);
      std::byte* acc = static_cast<std::byte*>(at(work, k.begin(me) * e));
      std::memcpy(acc, scratch.data(), k.size(me) * e);
      for (std::size_t j = 1; j < n; ++j) combine(c, acc, scratch.data() + j * largest * e, k.size(me));
    }
  }

  // The all-gather phase: chunk r of `work` is this rank's; afterwards every chunk is everyone's.
  void all_gather_phase(void* work, const chunks& k, dtype t) {
    const std::size_t e = size_of(t), n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    if (options_.algorithm == wire_algorithm::ring) {
      for (std::size_t s = 0; s + 1 < n; ++s) {
        const std::size_t out = (me + n - s) % n, in = (me + 2 * n - s - 1) % n;
        const message m[] = {{true, next(), at(work, k.begin(out) * e), k.size(out) * e, t},
                             {false, prev(), at(work, k.begin(in) * e), k.size(in) * e, t}};
        transfer(m);
      }
    } else {
      std::vector<message> m;
      for (std::size_t j = 0; j < n; ++j) {
        if (j == me) continue;
        m.push_back({true, static_cast<int>(j), at(work, k.begin(me) * e), k.size(me) * e, t});
        m.push_back({false, static_cast<int>(j), at(work, k.begin(j) * e), k.size(j) * e, t});
      }
      transfer(m);
    }
  }

  // avg: fp16/bf16 inputs are scaled by 1/n first (as the other host backends and NCCL do),
  // wider types divided once reduced.
  void prescale(const collective_call& c, void* work, std::size_t count) const {
    if (detail::premultiplied_avg(c.type, c.op)) detail::host_prescale(c.type, work, work, count, size());
  }
  void finish_avg(const collective_call& c, void* chunk, std::size_t count) const {
    if (c.op == reduce_op::avg && !detail::premultiplied_avg(c.type, c.op)) detail::host_divide(c.type, chunk, count, size());
  }

  void all_reduce_impl(const collective_call& c) {
    const std::size_t e = size_of(c.type);
    if (c.send != c.recv && c.send_count != 0) std::memmove(c.recv, c.send, c.send_count * e);
    const chunks k{c.recv_count, static_cast<std::size_t>(size())};
    prescale(c, c.recv, c.recv_count);
    reduce_scatter_phase(c, c.recv, k);
    const std::size_t me = static_cast<std::size_t>(rank());
    finish_avg(c, at(c.recv, k.begin(me) * e), k.size(me));
    all_gather_phase(c.recv, k, c.type);
  }

  void reduce_scatter_impl(const collective_call& c) {
    const std::size_t e = size_of(c.type), me = static_cast<std::size_t>(rank());
    // A working copy of the input (the reduction folds into it), unless the call is in place.
    std::vector<std::byte> copy(c.send_count * e);
    if (c.send_count != 0) std::memcpy(copy.data(), c.send, c.send_count * e);
    const chunks k{c.send_count, static_cast<std::size_t>(size())};
    prescale(c, copy.data(), c.send_count);
    reduce_scatter_phase(c, copy.data(), k);
    finish_avg(c, copy.data() + k.begin(me) * e, k.size(me));
    if (c.recv_count != 0) std::memmove(c.recv, copy.data() + k.begin(me) * e, c.recv_count * e);
  }

  void all_gather_impl(const collective_call& c) {
    const std::size_t e = size_of(c.type), me = static_cast<std::size_t>(rank());
    const chunks k{c.recv_count, static_cast<std::size_t>(size())};
    if (at(c.recv, k.begin(me) * e) != c.send && c.send_count != 0) std::memmove(at(c.recv, k.begin(me) * e), c.send, c.send_count * e);
    all_gather_phase(c.recv, k, c.type);
  }

  void broadcast_impl(const collective_call& c) {
    const int n = size(), me = rank(), root = c.root;
    const std::size_t bytes = c.recv_count * size_of(c.type);
    if (options_.algorithm == wire_algorithm::ring) {
      // A chain along the ring from the root: receive from the previous rank, pass it on.
      const int pos = (me - root + n) % n;
      if (pos != 0) {
        const message m[] = {{false, prev(), c.recv, bytes, c.type}};
        transfer(m);
      }
      if (pos != n - 1) {
        const message m[] = {{true, next(), c.recv, bytes, c.type}};
        transfer(m);
      }
    } else {
      std::vector<message> m;
      if (me == root) {
        for (int j = 0; j < n; ++j)
          if (j != root) m.push_back({true, j, c.recv, bytes, c.type});
      } else {
        m.push_back({false, root, c.recv, bytes, c.type});
      }
      transfer(m);
    }
  }

  // Every rank's input to the root, folded there in rank order (either algorithm: a reduce is
  // not what the slow-link studies measure).
  void reduce_impl(const collective_call& c) {
    const int n = size(), me = rank();
    const std::size_t e = size_of(c.type), bytes = c.send_count * e;
    std::vector<std::byte> mine(bytes);
    if (bytes != 0) std::memcpy(mine.data(), c.send, bytes);
    prescale(c, mine.data(), c.send_count);
    if (me != c.root) {
      const message m[] = {{true, c.root, mine.data(), bytes, c.type}};
      transfer(m);
      return;
    }
    std::vector<std::byte> all(bytes * static_cast<std::size_t>(n));
    std::vector<message> m;
    for (int j = 0; j < n; ++j)
      if (j != me) m.push_back({false, j, all.data() + static_cast<std::size_t>(j) * bytes, bytes, c.type});
    transfer(m);
    if (bytes == 0) return;
    std::memcpy(all.data() + static_cast<std::size_t>(me) * bytes, mine.data(), bytes);
    std::memmove(c.recv, all.data(), bytes);
    for (int j = 1; j < n; ++j) combine(c, c.recv, all.data() + static_cast<std::size_t>(j) * bytes, c.send_count);
    finish_avg(c, c.recv, c.send_count);
  }

  void all_to_all_impl(const collective_call& c) {
    const std::size_t e = size_of(c.type), n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    const std::size_t chunk = c.send_count / n * e;
    std::vector<message> m;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == me) continue;
      m.push_back({true, static_cast<int>(j), const_cast<std::byte*>(at(c.send, j * chunk)), chunk, c.type});
      m.push_back({false, static_cast<int>(j), at(c.recv, j * chunk), chunk, c.type});
    }
    transfer(m);
    if (chunk != 0) std::memcpy(at(c.recv, me * chunk), at(c.send, me * chunk), chunk);
  }

  Inner inner_;
  cluster_map map_;
  slow_link_options options_;
  std::shared_ptr<detail::sim_clock> clock_;
  std::vector<int> world_;  // this communicator's ranks as ranks of the first one wrapped (link_free's index)
};

}  // namespace trident
