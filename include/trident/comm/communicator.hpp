#pragma once
// The communicator concept: what every backend (thread ranks, MPI, NCCL) offers, and the
// front-end that gives them one API and one set of argument checks.
//
//   enum class reduce_op                  sum, avg, max, min, prod
//   enum class nan_in_max_min             propagate, drop: what a backend's max and min do with NaN
//   (space_span<T, S>, the {pointer, size} tagged with its memory space, is in core/space_span.hpp)
//   template <memory_space S>             p2p_op: one send or receive of a grouped exchange
//   struct collective_call                a type-erased collective, what backends execute
//   template <class D, memory_space S>    collectives: CRTP front-end (validation, overloads,
//                                         traffic(): calls and payload bytes per kind)
//   struct traffic_counters               what a communicator was asked to move
//   concept request<R>                    wait(), test()
//   concept communicator<C>               what generic code (ZeRO, pipelines, grids) relies on
//
// A backend opts in by deriving from collectives<Backend, Space> and providing
//   int rank() const; int size() const;
//   void execute(const collective_call&);              run (host backends: complete on return;
//                                                       NCCL: enqueued on its stream)
//   request start(const collective_call&);             the asynchronous form
//   void execute(std::span<const p2p_op<Space>>);      grouped point-to-point
//   request start(std::span<const p2p_op<Space>>);
//   void barrier(); void synchronize(); Backend split(int color, int key);
//   static constexpr nan_in_max_min max_min_nan;       what its max and min do with NaN
// or by writing the members the concept checks by hand.
//
// Argument checks are local: when every rank passes the same bad arguments, every rank throws
// usage_error. When only some do, the thread backend turns the escaping exception into an error
// on the others; MPI and NCCL cannot (the other ranks are already inside the library), so a
// trainer that catches usage_error on one rank must not go on to the next collective.
// Mismatched arguments between ranks are detected by the thread backend always, by MPI unless
// its check is turned off (check_arguments(false), TRIDENT_CHECK_COLLECTIVES=0), by NCCL not at
// all. Point-to-point size mismatches are detected on both sides by the thread backend, on the
// receiving side by MPI.
//
// Completion: an operation's effects are visible when the backend says it is done, which for
// host backends is on return (sync) or after wait() (async); for NCCL it is in stream order
// on the communicator's stream (synchronize() or a request's wait() blocks the host).
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/core/space_span.hpp"
#include "trident/exec/trace.hpp"

namespace trident {

//! Reductions every backend supports. `avg` is the sum divided by the group size (integer types:
//! truncating division of the sum).
enum class reduce_op { sum, avg, max, min, prod };

//! The name of a reduction (a view of a string literal, so .data() is null-terminated).
constexpr std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
    case reduce_op::prod: return "prod";
  }
  return "unknown";
}

//! What max and min over floating-point types (float32, float64, fp16, bf16) give in an element
//! where some rank holds NaN. Backends differ, so each states its rule as
//! `static constexpr nan_in_max_min max_min_nan`, and generic code that looks for NaN with a
//! max or min reads it instead of assuming:
//!   propagate  NaN when any rank holds NaN there (IEEE 754-2019 maximum / minimum, as PyTorch's
//!              max): the thread and MPI backends (comm/host_reduce.hpp);
//!   drop       NaN only when every rank holds NaN there, otherwise the max / min of the ranks
//!              that do not (IEEE 754-2008 maxNum / minNum, C's fmax): NCCL, whose kernels use
//!              fmaxf / fminf and __hmax / __hmin.
//! Either way the result does not depend on which rank holds the NaN.
//!
//!   if constexpr (Comm::max_min_nan == trident::nan_in_max_min::drop) { /* count NaNs with a sum */ }
enum class nan_in_max_min { propagate, drop };

//! The collectives, as backends see them in a collective_call.
enum class collective { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all };

constexpr std::string_view name_of(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::reduce: return "reduce";
    case collective::all_to_all: return "all_to_all";
  }
  return "unknown";
}

namespace detail {

template <class R, class Space>
struct span_element {};
template <class T, class S, class Space>
struct span_element<space_span<T, S>, Space> {
  using type = T;
};
template <class T, class S, class Space>
struct span_element<buffer<T, S>, Space> {
  using type = T;
};
template <class T, class S, class Space>
struct span_element<const buffer<T, S>, Space> {
  using type = const T;
};
template <class R, class Space>
  requires std::ranges::contiguous_range<R>
struct span_element<R, Space> {
  using type = std::remove_reference_t<std::ranges::range_reference_t<R>>;
};

}  // namespace detail

//! The element type (const-qualified for read-only sources) of something a communicator in
//! Space accepts.
template <class R, class Space>
using span_element_t = typename detail::span_element<std::remove_reference_t<R>, Space>::type;

//! True when `r` can be handed to a communicator working in Space: a space_span or buffer of
//! that space, or a contiguous host range when Space is host-accessible.
template <class R, class Space>
concept span_source = requires { typename span_element_t<R, Space>; } &&
                      element_type<std::remove_const_t<span_element_t<R, Space>>> &&
                      std::constructible_from<space_span<span_element_t<R, Space>, Space>, R&>;

template <class Space, class R>
  requires span_source<R, Space>
constexpr space_span<span_element_t<R, Space>, Space> as_space_span(R&& r) noexcept {
  return space_span<span_element_t<R, Space>, Space>(r);
}

//! One collective, type-erased: what the front-end hands to a backend after checking it.
//! Counts are in elements of `type`; `send` may equal `recv` (in place).
struct collective_call {
  collective kind{};
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t send_count = 0;
  std::size_t recv_count = 0;
  dtype type{};
  reduce_op op = reduce_op::sum;
  int root = 0;
};

enum class p2p_kind { send, recv };

//! One send or receive of a grouped exchange. Build them with p2p_op<Space>::send / ::recv.
//!
//!   using op = trident::p2p_op<trident::host_space>;
//!   comm.exchange({op::send(out, next), op::recv(in, prev)});   // a ring shift, no deadlock
template <memory_space Space>
struct p2p_op {
  p2p_kind kind{};
  void* data = nullptr;
  std::size_t count = 0;
  dtype type{};
  int peer = 0;

  template <class R>
    requires span_source<R, Space>
  static p2p_op send(R&& data, int peer) {
    auto s = as_space_span<Space>(data);
    using T = std::remove_const_t<span_element_t<R, Space>>;
    return {p2p_kind::send, const_cast<T*>(s.data()), s.size(), dtype_of<T>, peer};
  }
  template <class R>
    requires span_source<R, Space> && (!std::is_const_v<span_element_t<R, Space>>)
  static p2p_op recv(R&& data, int peer) {
    auto s = as_space_span<Space>(data);
    return {p2p_kind::recv, s.data(), s.size(), dtype_of<std::remove_const_t<span_element_t<R, Space>>>, peer};
  }
};

//! An asynchronous operation in flight. wait() blocks until it completes and rethrows its error
//! (at most once); test() says whether it has completed without blocking.
template <class R>
concept request = std::movable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

namespace detail {

template <class Space, class R>
constexpr void require_space() {
  static_assert(span_source<R, Space>,
                "trident: this communicator works on memory in its own space (Communicator::space): pass a "
                "trident::buffer<T, Space>, a trident::space_span<T, Space>, or, for host spaces, a contiguous "
                "range such as std::vector<T>");
}

template <class In, class Out>
constexpr void require_same_element() {
  static_assert(std::is_same_v<std::remove_const_t<In>, std::remove_const_t<Out>>,
                "trident: send and receive buffers of a collective must have the same element type");
  static_assert(!std::is_const_v<Out>, "trident: the receive buffer of a collective must be writable");
}

}  // namespace detail

//! What a communicator was asked to move since it was made (or reset_traffic()): per kind of
//! call, how many and their payload in bytes. The payload is the buffer the call is about: an
//! all_reduce's data, a reduce_scatter's input, an all_gather's output, a broadcast's data, a
//! reduce's input, an all_to_all's input, a send's or receive's message. What a backend then
//! puts on the wire depends on its algorithm (a ring all-reduce sends 2(n-1)/n of the payload
//! per rank); the payload is what an analytic count of a parallel scheme predicts (Megatron's
//! four all-reduces of [seq x batch, hidden] per transformer block and step).
//!
//!   comm.reset_traffic();
//!   step();
//!   comm.traffic().of(trident::collective::all_reduce).bytes;
struct traffic_counters {
  struct count {
    std::uint64_t calls = 0;
    std::uint64_t bytes = 0;
    friend bool operator==(const count&, const count&) = default;
  };
  std::array<count, 6> collectives{};  // indexed by collective
  count sends, receives;

  const count& of(collective c) const noexcept { return collectives[static_cast<std::size_t>(c)]; }
  //! Every kind together.
  count total() const noexcept {
    count t = sends;
    t.calls += receives.calls;
    t.bytes += receives.bytes;
    for (const count& c : collectives) {
      t.calls += c.calls;
      t.bytes += c.bytes;
    }
    return t;
  }
};

//! The public face of every backend: checks arguments the same way everywhere (sizes, roots,
//! peers), turns them into collective_call / p2p_op lists and hands them to the backend's
//! execute() / start(). All ranks must call collectives in the same order with matching
//! arguments; backends detect mismatches where they can (the thread backend always does).
//!
//!   void step(trident::communicator auto& comm, std::vector<float>& grads) {
//!     comm.all_reduce(grads, trident::reduce_op::avg);
//!   }
template <class Derived, memory_space Space>
class collectives {
 public:
  using space = Space;

  //! Calls and payload bytes per kind since construction or the last reset_traffic() (a split
  //! or moved-to communicator starts from zero); counted when a call passes its argument checks.
  const traffic_counters& traffic() const noexcept { return traffic_; }
  void reset_traffic() noexcept { traffic_ = {}; }

  //! out[i] = op over ranks of in[i]; in and out have the same size (out may alias in).
  template <class In, class Out>
  void all_reduce(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "all_reduce"};
    self().execute(all_reduce_call(in, out, op));
  }
  //! In place: data[i] = op over ranks of data[i].
  template <class Data>
  void all_reduce(Data&& data, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "all_reduce"};
    self().execute(all_reduce_call(data, data, op));
  }
  //! out (n elements) = chunk `rank()` of op over ranks of in (size() * n elements).
  template <class In, class Out>
  void reduce_scatter(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "reduce_scatter"};
    self().execute(reduce_scatter_call(in, out, op));
  }
  //! out (size() * n elements) = every rank's in (n elements), in rank order.
  template <class In, class Out>
  void all_gather(In&& in, Out&& out) {
    const failure_watch watch{self(), "all_gather"};
    self().execute(all_gather_call(in, out));
  }
  //! data on every rank = data on `root`.
  template <class Data>
  void broadcast(Data&& data, int root) {
    const failure_watch watch{self(), "broadcast"};
    self().execute(broadcast_call(data, root));
  }
  //! out on `root` = op over ranks of in; out is ignored (may be empty) on other ranks.
  template <class In, class Out>
  void reduce(In&& in, Out&& out, int root, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "reduce"};
    self().execute(reduce_call(in, out, root, op));
  }
  //! Chunk j of in (in.size() / size() elements each) goes to rank j, arriving as chunk rank() of its out.
  template <class In, class Out>
  void all_to_all(In&& in, Out&& out) {
    const failure_watch watch{self(), "all_to_all"};
    self().execute(all_to_all_call(in, out));
  }
  //! Blocking point-to-point; both sides must agree on the size. Use exchange() for anything
  //! that could deadlock when issued one by one (ring shifts, pipeline stages).
  template <class Data>
  void send(Data&& data, int peer) {
    const failure_watch watch{self(), "send"};
    const p2p_op<Space> op = make_send(data, peer, "send");
    TRIDENT_EXPECT(peer != self().rank(), "send: rank ", peer, " is this rank; a blocking send to oneself would "
                   "never complete (use exchange() with a matching recv)");
    counted(op);
    self().execute(std::span<const p2p_op<Space>>(&op, 1));
  }
  template <class Data>
  void recv(Data&& data, int peer) {
    const failure_watch watch{self(), "recv"};
    const p2p_op<Space> op = make_recv(data, peer, "recv");
    TRIDENT_EXPECT(peer != self().rank(), "recv: rank ", peer, " is this rank; a blocking recv from oneself would "
                   "never complete (use exchange() with a matching send)");
    counted(op);
    self().execute(std::span<const p2p_op<Space>>(&op, 1));
  }
  //! Sends and receives issued together and completed together (NCCL group, MPI Isend/Irecv
  //! + Waitall). Messages between one pair of ranks match in the order they were issued.
  void exchange(std::span<const p2p_op<Space>> ops) {
    const failure_watch watch{self(), "exchange"};
    self().execute(check_p2p(ops));
  }
  void exchange(std::initializer_list<p2p_op<Space>> ops) { exchange(std::span<const p2p_op<Space>>(ops.begin(), ops.size())); }

  // ---- asynchronous forms: the same checks, a request to wait on ------------------------------
  template <class In, class Out>
  auto all_reduce_async(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "all_reduce_async"};
    return self().start(all_reduce_call(in, out, op));
  }
  template <class Data>
  auto all_reduce_async(Data&& data, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "all_reduce_async"};
    return self().start(all_reduce_call(data, data, op));
  }
  template <class In, class Out>
  auto reduce_scatter_async(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "reduce_scatter_async"};
    return self().start(reduce_scatter_call(in, out, op));
  }
  template <class In, class Out>
  auto all_gather_async(In&& in, Out&& out) {
    const failure_watch watch{self(), "all_gather_async"};
    return self().start(all_gather_call(in, out));
  }
  template <class Data>
  auto broadcast_async(Data&& data, int root) {
    const failure_watch watch{self(), "broadcast_async"};
    return self().start(broadcast_call(data, root));
  }
  template <class In, class Out>
  auto reduce_async(In&& in, Out&& out, int root, reduce_op op = reduce_op::sum) {
    const failure_watch watch{self(), "reduce_async"};
    return self().start(reduce_call(in, out, root, op));
  }
  template <class In, class Out>
  auto all_to_all_async(In&& in, Out&& out) {
    const failure_watch watch{self(), "all_to_all_async"};
    return self().start(all_to_all_call(in, out));
  }
  auto exchange_async(std::span<const p2p_op<Space>> ops) {
    const failure_watch watch{self(), "exchange_async"};
    return self().start(check_p2p(ops));
  }
  auto exchange_async(std::initializer_list<p2p_op<Space>> ops) {
    return exchange_async(std::span<const p2p_op<Space>>(ops.begin(), ops.size()));
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  int group_size() { return self().size(); }

  template <class In, class Out>
  static collective_call pair_call(collective kind, In& in, Out& out) {
    detail::require_space<Space, In>();
    detail::require_space<Space, Out>();
    if constexpr (span_source<In, Space> && span_source<Out, Space>) {
      using TI = span_element_t<In, Space>;
      using TO = span_element_t<Out, Space>;
      detail::require_same_element<TI, TO>();
      auto i = as_space_span<Space>(in);
      auto o = as_space_span<Space>(out);
      TRIDENT_EXPECT(i.data() != nullptr || i.size() == 0, name_of(kind), ": the send buffer is null but has ", i.size(), " elements");
      TRIDENT_EXPECT(o.data() != nullptr || o.size() == 0, name_of(kind), ": the receive buffer is null but has ", o.size(), " elements");
      collective_call call;
      call.kind = kind;
      call.send = i.data();
      call.recv = const_cast<std::remove_const_t<TO>*>(o.data());  // TO is non-const: asserted above
      call.send_count = i.size();
      call.recv_count = o.size();
      call.type = dtype_of<std::remove_const_t<TO>>;
      return call;
    } else {
      return {};
    }
  }

  // Tells the backend that a call failed on this rank, if it wants to know (MPI: the peers may
  // be waiting for this rank inside the collective it abandoned; see mpi_environment).
  // And records the call as a "comm" span when the calling thread traces (exec/trace.hpp).
  struct failure_watch {
    Derived& backend;
    const char* what;
    int exceptions = std::uncaught_exceptions();
    trace_span span{"comm", what};
    ~failure_watch() {
      if constexpr (requires { backend.note_failure(what); }) {
        if (std::uncaught_exceptions() > exceptions) backend.note_failure(what);
      }
    }
  };

  void check_root(const char* what, int root) {
    TRIDENT_EXPECT(root >= 0 && root < group_size(), what, ": root ", root, " is not a rank of this group of ",
                   group_size(), " (expected 0..", group_size() - 1, ")");
  }
  static bool overlap(const collective_call& c) {
    const auto* s = static_cast<const std::byte*>(c.send);
    const auto* r = static_cast<const std::byte*>(c.recv);
    const std::size_t es = size_of(c.type);
    return c.send_count != 0 && c.recv_count != 0 && s < r + c.recv_count * es && r < s + c.send_count * es;
  }
  static void check_disjoint_or_same(const collective_call& c) {
    TRIDENT_EXPECT(c.send == c.recv || !overlap(c), name_of(c.kind),
                   ": send and receive buffers overlap without being the same buffer");
  }
  // For reduce_scatter, "the same pointer" is not in place: only this rank's chunk of the input
  // is (as in NCCL), and any other overlap is read after being written (on 2 ranks, a
  // reduce_scatter into the start of rank 1's own input gave every element wrong on the thread
  // backend, and right on MPI by luck).
  void check_disjoint_chunked(const collective_call& c) {
    const std::size_t chunk = c.recv_count;
    const auto me = static_cast<std::size_t>(self().rank());
    TRIDENT_EXPECT(!overlap(c), "reduce_scatter on rank ", me, ": send and receive buffers overlap; in place means the "
                   "receive buffer is exactly this rank's chunk of the send buffer (elements ", me * chunk, "..",
                   (me + 1) * chunk - 1, "), and otherwise they must not overlap");
  }

  template <class In, class Out>
  collective_call all_reduce_call(In& in, Out& out, reduce_op op) {
    auto c = pair_call(collective::all_reduce, in, out);
    c.op = op;
    TRIDENT_EXPECT(c.send_count == c.recv_count, "all_reduce: send has ", c.send_count, " elements but receive has ",
                   c.recv_count, "; expected the same size");
    check_disjoint_or_same(c);
    return counted(c);
  }
  template <class In, class Out>
  collective_call reduce_scatter_call(In& in, Out& out, reduce_op op) {
    auto c = pair_call(collective::reduce_scatter, in, out);
    c.op = op;
    const auto n = static_cast<std::size_t>(group_size());
    TRIDENT_EXPECT(c.send_count == c.recv_count * n, "reduce_scatter: send has ", c.send_count,
                   " elements; expected receive size (", c.recv_count, ") x group size (", n, ") = ", c.recv_count * n);
    // In place means the receive buffer is this rank's chunk of the send buffer (as in NCCL);
    // any other overlap would be read after being written.
    const bool in_place = static_cast<const void*>(static_cast<const std::byte*>(c.send) +
                                                   static_cast<std::size_t>(self().rank()) * c.recv_count * size_of(c.type)) == c.recv;
    if (!in_place) check_disjoint_chunked(c);
    return counted(c);
  }
  template <class In, class Out>
  collective_call all_gather_call(In& in, Out& out) {
    auto c = pair_call(collective::all_gather, in, out);
    const auto n = static_cast<std::size_t>(group_size());
    TRIDENT_EXPECT(c.recv_count == c.send_count * n, "all_gather: receive has ", c.recv_count,
                   " elements; expected send size (", c.send_count, ") x group size (", n, ") = ", c.send_count * n);
    // In place means the send buffer is this rank's chunk of the receive buffer (as in NCCL).
    const bool in_place = static_cast<const void*>(static_cast<const std::byte*>(c.recv) +
                                                   static_cast<std::size_t>(self().rank()) * c.send_count * size_of(c.type)) == c.send;
    // The input may also start where the output starts: every backend first copies it into this
    // rank's slot and only then receives into the rest, so that is legal too.
    if (!in_place) check_disjoint_or_same(c);
    return counted(c);
  }
  template <class Data>
  collective_call broadcast_call(Data& data, int root) {
    auto c = pair_call(collective::broadcast, data, data);
    check_root("broadcast", root);
    c.root = root;
    return counted(c);
  }
  template <class In, class Out>
  collective_call reduce_call(In& in, Out& out, int root, reduce_op op) {
    auto c = pair_call(collective::reduce, in, out);
    check_root("reduce", root);
    c.root = root;
    c.op = op;
    if (self().rank() == root) {
      TRIDENT_EXPECT(c.recv_count == c.send_count, "reduce: on the root, receive has ", c.recv_count,
                     " elements but send has ", c.send_count, "; expected the same size");
      check_disjoint_or_same(c);
    } else {
      c.recv = nullptr;  // other ranks' receive buffers are never touched
      c.recv_count = 0;
    }
    return counted(c);
  }
  template <class In, class Out>
  collective_call all_to_all_call(In& in, Out& out) {
    auto c = pair_call(collective::all_to_all, in, out);
    const auto n = static_cast<std::size_t>(group_size());
    TRIDENT_EXPECT(c.send_count == c.recv_count, "all_to_all: send has ", c.send_count, " elements but receive has ",
                   c.recv_count, "; expected the same size");
    TRIDENT_EXPECT(c.send_count % n == 0, "all_to_all: ", c.send_count, " elements do not split into ", n,
                   " equal chunks (one per rank)");
    TRIDENT_EXPECT(c.send == c.recv || c.send_count == 0 ||
                       !(static_cast<const std::byte*>(c.send) < static_cast<std::byte*>(c.recv) + c.recv_count * size_of(c.type) &&
                         static_cast<std::byte*>(c.recv) < static_cast<const std::byte*>(c.send) + c.send_count * size_of(c.type)),
                   "all_to_all: send and receive buffers overlap");
    TRIDENT_EXPECT(c.send != c.recv || c.send_count == 0, "all_to_all: in-place is not supported; use separate send and "
                   "receive buffers");
    return counted(c);
  }

  template <class Data>
  p2p_op<Space> make_send(Data& data, int peer, const char* what) {
    detail::require_space<Space, Data>();
    auto op = p2p_op<Space>::send(data, peer);
    check_peer(what, peer);
    return op;
  }
  template <class Data>
  p2p_op<Space> make_recv(Data& data, int peer, const char* what) {
    detail::require_space<Space, Data>();
    auto op = p2p_op<Space>::recv(data, peer);
    check_peer(what, peer);
    return op;
  }
  void check_peer(const char* what, int peer) {
    TRIDENT_EXPECT(peer >= 0 && peer < group_size(), what, ": peer ", peer, " is not a rank of this group of ",
                   group_size(), " (expected 0..", group_size() - 1, ")");
  }
  std::span<const p2p_op<Space>> check_p2p(std::span<const p2p_op<Space>> ops) {
    for (const auto& op : ops) {
      check_peer(op.kind == p2p_kind::send ? "exchange (send)" : "exchange (recv)", op.peer);
      TRIDENT_EXPECT(op.data != nullptr || op.count == 0, "exchange: an operation with peer ", op.peer, " has ",
                     op.count, " elements but a null pointer");
    }
    for (const auto& op : ops) counted(op);
    return ops;
  }

  // ---- traffic ----
  void counted(const p2p_op<Space>& op) noexcept {
    auto& c = op.kind == p2p_kind::send ? traffic_.sends : traffic_.receives;
    ++c.calls;
    c.bytes += op.count * size_of(op.type);
  }
  // A collective that passed its checks; the payload is the side named in traffic_counters.
  collective_call counted(collective_call c) noexcept {
    auto& t = traffic_.collectives[static_cast<std::size_t>(c.kind)];
    ++t.calls;
    const bool output = c.kind == collective::all_gather;
    t.bytes += (output ? c.recv_count : c.send_count) * size_of(c.type);
    return c;
  }

  traffic_counters traffic_;
};

//! What generic code may rely on. Checked with float spans of the communicator's space;
//! every element_type works the same way.
template <class C>
concept communicator =
    std::movable<C> && memory_space<typename C::space> &&
    requires(C& c, const C& cc, space_span<const float, typename C::space> in, space_span<float, typename C::space> out,
             std::span<const p2p_op<typename C::space>> ops, reduce_op op, int peer) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { C::max_min_nan } -> std::convertible_to<nan_in_max_min>;
      c.all_reduce(in, out, op);
      c.all_reduce(out, op);
      c.reduce_scatter(in, out, op);
      c.all_gather(in, out);
      c.broadcast(out, peer);
      c.reduce(in, out, peer, op);
      c.all_to_all(in, out);
      c.send(in, peer);
      c.recv(out, peer);
      c.exchange(ops);
      c.barrier();
      c.synchronize();
      { c.split(peer, peer) } -> std::same_as<C>;
      { c.all_reduce_async(in, out, op) } -> request;
      { c.reduce_scatter_async(in, out, op) } -> request;
      { c.all_gather_async(in, out) } -> request;
      { c.broadcast_async(out, peer) } -> request;
      { c.reduce_async(in, out, peer, op) } -> request;
      { c.all_to_all_async(in, out) } -> request;
      { c.exchange_async(ops) } -> request;
    };

namespace detail {

//! Copies n host values into a buffer of any space for a collective on a communicator's own
//! stream. A copy from pageable memory to a device may return before its DMA lands; one element
//! copied back on the same legacy stream returns after it, so the collective reads the values.
template <class T, class Space>
void stage_in(const T* host, std::size_t n, buffer<T, Space>& staged) {
  trident::copy(space_span<const T, host_space>(host, n), space_span<T, Space>(staged.data(), n));
  if (n != 0) {
    T probe{};
    trident::copy(space_span<const T, Space>(staged.data(), 1), space_span<T, host_space>(&probe, 1));
  }
}

//! A few host values from every rank, in rank order, over a communicator of any space (a
//! device's are staged through its memory): for checks that the ranks agree, not for payloads.
template <communicator Comm, class T>
std::vector<T> all_gather_small(Comm& comm, std::span<const T> mine) {
  using space = typename Comm::space;
  std::vector<T> all(mine.size() * static_cast<std::size_t>(comm.size()));
  if constexpr (space::host_accessible) {
    comm.all_gather(mine, std::span<T>(all));
  } else {
    buffer<T, space> in(mine.size(), mem_category::communication), out(all.size(), mem_category::communication);
    stage_in(mine.data(), mine.size(), in);
    comm.all_gather(in, out);
    comm.synchronize();
    trident::copy(space_span<const T, space>(out.data(), all.size()), space_span<T, host_space>(all));
  }
  return all;
}

}  // namespace detail

}  // namespace trident
