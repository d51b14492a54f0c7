#pragma once
// One test body per behaviour, for every communicator backend. Each function runs on one rank
// of an already-created communicator (all ranks call it together) and checks its results with
// doctest against a serial reference that every rank computes for itself: rank r's input is a
// function of (r, i), so each rank knows what every other rank contributed.
//
// Inputs are small integers (|x| <= 3; products of values in {1, 2, -1}), so every reduction is
// exact in every element type and in any order: results are compared bit for bit, except avg
// on floating types, where a backend may divide before or after summing (NCCL premultiplies).
//
//   trident::local_world::run(4, [](auto& comm) { suite::all_reduce(comm); });
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"

namespace suite {

using trident::reduce_op;

using element_types = std::tuple<float, double, trident::fp16, trident::bf16, std::int32_t, std::int64_t, std::uint8_t>;
inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min, reduce_op::prod};

template <class F>
void for_each_type(F&& f) {
  std::apply([&](auto... tag) { (f(tag), ...); }, element_types{});
}

template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<std::conditional_t<std::is_integral_v<T>, long long, double>>(
      static_cast<std::conditional_t<std::is_integral_v<T>, T, float>>(v)));
}
template <>
inline double as_double<double>(double v) { return v; }

//! Rank r's i-th input for a reduction `op` (small integers; for prod only 1, 2 and -1).
template <class T>
T input(int r, std::size_t i, reduce_op op) {
  const long long k = static_cast<long long>(i) * 7 + r * 3;
  long long v;
  if (op == reduce_op::prod) {
    v = (k % 5 == 0) ? 2 : 1;
    if constexpr (std::is_signed_v<T> || !std::is_integral_v<T>)
      if (k % 7 == 3) v = -1;
  } else if constexpr (std::is_unsigned_v<T>) {
    v = k % 4;  // 0..3
  } else {
    v = k % 7 - 3;  // -3..3
  }
  return static_cast<T>(static_cast<std::conditional_t<std::is_integral_v<T>, long long, float>>(v));
}

template <class T>
std::vector<T> inputs(int r, std::size_t count, reduce_op op, std::size_t offset = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input<T>(r, offset + i, op);
  return v;
}

//! op over ranks 0..n-1 of input(r, i), computed in double (exact for these inputs).
template <class T>
double reference(int n, std::size_t i, reduce_op op) {
  double acc = as_double(input<T>(0, i, op));
  for (int r = 1; r < n; ++r) {
    const double x = as_double(input<T>(r, i, op));
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: acc += x; break;
      case reduce_op::prod: acc *= x; break;
      case reduce_op::max: acc = std::max(acc, x); break;
      case reduce_op::min: acc = std::min(acc, x); break;
    }
  }
  if (op == reduce_op::avg) {
    if constexpr (std::is_integral_v<T>) acc = static_cast<double>(static_cast<long long>(acc) / n);  // truncation
    else acc /= n;
  }
  return acc;
}

template <class T>
bool close(double got, double want, reduce_op op) {
  if (op != reduce_op::avg || std::is_integral_v<T>) return got == want;
  // avg = sum / n rounded once or twice in T: allow a couple of units in the last place of T.
  // fp16/bf16 scale each input by 1/n first (so sums cannot overflow) and round every partial
  // sum: about one unit in the last place per rank.
  const double eps = std::is_same_v<T, double> ? 1e-15 : std::is_same_v<T, float> ? 1e-6
                     : std::is_same_v<T, trident::bf16> ? 8e-3 : 1e-3;
  const double ranks = std::is_same_v<T, trident::bf16> || std::is_same_v<T, trident::fp16> ? 8.0 : 1.0;
  return std::fabs(got - want) <= eps * ranks * std::max(1.0, std::fabs(want));
}

template <class T>
std::string_view type_name() {
  return trident::name_of(trident::dtype_of<T>);
}

// ---- moving data into and out of the communicator's memory space ----------------------------
template <class C, class T>
trident::buffer<T, typename C::space> upload(const std::vector<T>& host) {
  trident::buffer<T, typename C::space> b(host.size(), trident::mem_category::communication);
  if (!host.empty()) trident::copy(std::span<const T>(host), b);
  return b;
}
template <class C, class T>
std::vector<T> download(C& comm, const trident::buffer<T, typename C::space>& b) {
  comm.synchronize();  // NCCL: the collective ran in stream order
  return trident::to_vector(b);
}

#define SUITE_CONTEXT(comm, T, op, extra) \
  INFO("rank ", (comm).rank(), "/", (comm).size(), " ", std::string(type_name<T>()), " ", std::string(trident::name_of(op)), " ", extra)

// ---- behaviours -------------------------------------------------------------------------------

//! all_reduce: every type x op, in place and out of place, sizes 0, 1, 7, 1000 and 2053 (the
//! thread backend's one-step algorithm below 2 KiB, its ring above, for every type).
template <class C>
void all_reduce(C& comm) {
  const int n = comm.size();
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (reduce_op op : all_ops)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{2053}})
        for (bool in_place : {false, true}) {
          auto in = upload<C>(inputs<T>(comm.rank(), count, op));
          trident::buffer<T, typename C::space> out(count);
          if (in_place) comm.all_reduce(in, op);
          else comm.all_reduce(in, out, op);
          const auto got = download(comm, in_place ? in : out);
          SUITE_CONTEXT(comm, T, op, std::string(in_place ? "in place" : "out of place") + " count " + std::to_string(count));
          std::size_t bad = 0;
          for (std::size_t i = 0; i < count; ++i)
            if (!close<T>(as_double(got[i]), reference<T>(n, i, op), op)) ++bad;
          CHECK(bad == 0);
          if (!in_place) CHECK(download(comm, in) == inputs<T>(comm.rank(), count, op));  // send is untouched
        }
  });
}

//! A large all_reduce (about 10M floats) whose chunks do not divide evenly.
template <class C>
void all_reduce_large(C& comm, std::size_t count = 10'000'019) {
  const int n = comm.size();
  auto data = upload<C>(inputs<float>(comm.rank(), count, reduce_op::sum));
  comm.all_reduce(data, reduce_op::sum);
  const auto got = download(comm, data);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; i += 1 + i % 3)
    if (static_cast<double>(got[i]) != reference<float>(n, i, reduce_op::sum)) ++bad;
  INFO("rank ", comm.rank(), "/", n, " count ", count);
  CHECK(bad == 0);
}

//! Results are bit-identical on every rank and from run to run (random floats, sum and avg).
template <class C>
void deterministic(C& comm, std::size_t count) {
  const int n = comm.size();
  std::vector<float> x(count);
  std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(comm.rank() + 1);
  for (auto& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5) * 1e3f;
  }
  for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
    auto a = upload<C>(x);
    auto b = upload<C>(x);
    comm.all_reduce(a, op);
    comm.all_reduce(b, op);
    const auto first = download(comm, a);
    CHECK(first == download(comm, b));
    trident::buffer<float, typename C::space> everyone(count * static_cast<std::size_t>(n));
    comm.all_gather(a, everyone);
    const auto all = download(comm, everyone);
    for (int r = 0; r < n; ++r)
      CHECK_MESSAGE(std::memcmp(all.data() + static_cast<std::size_t>(r) * count, first.data(), count * sizeof(float)) == 0,
                    "rank ", r, "'s ", std::string(trident::name_of(op)), " differs from rank ", comm.rank(), "'s");
  }
}

//! The same at 100 and 4099 elements: both of the thread backend's algorithms.
template <class C>
void deterministic(C& comm) {
  for (std::size_t count : {std::size_t{100}, std::size_t{4099}}) deterministic(comm, count);
}

//! reduce_scatter: chunk sizes 0, 1, 5 and 1031 (the last one above the thread backend's
//! one-step limit for every type and n >= 2), every type x op, out of place and in place.
template <class C>
void reduce_scatter(C& comm) {
  const int n = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (reduce_op op : all_ops)
      for (std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1031}})
        for (bool in_place : {false, true}) {
          const std::size_t count = chunk * static_cast<std::size_t>(n);
          auto in = upload<C>(inputs<T>(comm.rank(), count, op));
          trident::buffer<T, typename C::space> out(chunk);
          std::vector<T> got;
          if (in_place) {
            comm.reduce_scatter(in, trident::space_span<T, typename C::space>(in.data() + me * chunk, chunk), op);
            const auto all = download(comm, in);
            got.assign(all.begin() + static_cast<std::ptrdiff_t>(me * chunk), all.begin() + static_cast<std::ptrdiff_t>((me + 1) * chunk));
          } else {
            comm.reduce_scatter(in, out, op);
            got = download(comm, out);
          }
          SUITE_CONTEXT(comm, T, op, std::string(in_place ? "in place" : "out of place") + " chunk " + std::to_string(chunk));
          std::size_t bad = 0;
          for (std::size_t i = 0; i < chunk; ++i)
            if (!close<T>(as_double(got[i]), reference<T>(n, me * chunk + i, op), op)) ++bad;
          CHECK(bad == 0);
        }
  });
}

//! all_gather: sizes 0, 1 and 5, every type, out of place and in place.
template <class C>
void all_gather(C& comm) {
  const int n = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}})
      for (bool in_place : {false, true}) {
        const auto mine = inputs<T>(comm.rank(), count, reduce_op::sum, 100);
        trident::buffer<T, typename C::space> out(count * static_cast<std::size_t>(n));
        if (in_place) {
          std::vector<T> staged(out.size());
          std::copy(mine.begin(), mine.end(), staged.begin() + static_cast<std::ptrdiff_t>(me * count));
          out = upload<C>(staged);
          comm.all_gather(trident::space_span<const T, typename C::space>(out.data() + me * count, count), out);
        } else {
          auto in = upload<C>(mine);
          comm.all_gather(in, out);
        }
        const auto got = download(comm, out);
        std::vector<T> want;
        for (int r = 0; r < n; ++r) {
          const auto theirs = inputs<T>(r, count, reduce_op::sum, 100);
          want.insert(want.end(), theirs.begin(), theirs.end());
        }
        SUITE_CONTEXT(comm, T, reduce_op::sum, std::string(in_place ? "in place" : "out of place") + " count " + std::to_string(count));
        CHECK(got == want);
      }
  });
}

//! broadcast from every root, sizes 0, 1 and 7, every type.
template <class C>
void broadcast(C& comm) {
  const int n = comm.size();
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (int root = 0; root < n; ++root)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
        auto data = upload<C>(inputs<T>(comm.rank(), count, reduce_op::sum, 11));
        comm.broadcast(data, root);
        SUITE_CONTEXT(comm, T, reduce_op::sum, "root " + std::to_string(root) + " count " + std::to_string(count));
        CHECK(download(comm, data) == inputs<T>(root, count, reduce_op::sum, 11));
      }
  });
}

//! reduce to roots 0 and n-1, every type x op, sizes 0, 1 and 7; other ranks pass an empty receive.
template <class C>
void reduce(C& comm) {
  const int n = comm.size();
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (int root : {0, n - 1})
      for (reduce_op op : all_ops)
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
          auto in = upload<C>(inputs<T>(comm.rank(), count, op));
          trident::buffer<T, typename C::space> out(comm.rank() == root ? count : 0);
          comm.reduce(in, out, root, op);
          SUITE_CONTEXT(comm, T, op, "root " + std::to_string(root) + " count " + std::to_string(count));
          CHECK(download(comm, in) == inputs<T>(comm.rank(), count, op));
          if (comm.rank() != root) continue;
          const auto got = download(comm, out);
          std::size_t bad = 0;
          for (std::size_t i = 0; i < count; ++i)
            if (!close<T>(as_double(got[i]), reference<T>(n, i, op), op)) ++bad;
          CHECK(bad == 0);
        }
  });
}

//! all_to_all: chunk sizes 0, 1 and 3, every type.
template <class C>
void all_to_all(C& comm) {
  const int n = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      const std::size_t count = chunk * static_cast<std::size_t>(n);
      auto in = upload<C>(inputs<T>(comm.rank(), count, reduce_op::sum, 5));
      trident::buffer<T, typename C::space> out(count);
      comm.all_to_all(in, out);
      std::vector<T> want;
      for (int r = 0; r < n; ++r) {
        const auto theirs = inputs<T>(r, count, reduce_op::sum, 5);
        want.insert(want.end(), theirs.begin() + static_cast<std::ptrdiff_t>(me * chunk),
                    theirs.begin() + static_cast<std::ptrdiff_t>((me + 1) * chunk));
      }
      SUITE_CONTEXT(comm, T, reduce_op::sum, "chunk " + std::to_string(chunk));
      CHECK(download(comm, out) == want);
    }
  });
}

//! Point-to-point: a ring shift both ways as one exchange; blocking send/recv between pairs;
//! several messages to one peer arrive in order; a send to oneself inside an exchange.
template <class C>
void point_to_point(C& comm) {
  using S = typename C::space;
  using op = trident::p2p_op<S>;
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  auto mine = upload<C>(inputs<double>(r, 33, reduce_op::sum));
  trident::buffer<double, S> from_prev(33), from_next(33);
  comm.exchange({op::send(mine, next), op::send(mine, prev), op::recv(from_prev, prev), op::recv(from_next, next)});
  if (n == 2) {
    // next == prev: two messages from one peer match in issue order; both carry the same data.
    CHECK(download(comm, from_prev) == inputs<double>(prev, 33, reduce_op::sum));
  } else {
    CHECK(download(comm, from_prev) == inputs<double>(prev, 33, reduce_op::sum));
    CHECK(download(comm, from_next) == inputs<double>(next, 33, reduce_op::sum));
  }
  // Ordered messages to one peer, issued in one exchange.
  auto first = upload<C>(std::vector<std::int32_t>(3, r * 10 + 1));
  auto second = upload<C>(std::vector<std::int32_t>(3, r * 10 + 2));
  trident::buffer<std::int32_t, S> a(3), b(3);
  comm.exchange({op::send(first, next), op::send(second, next), op::recv(a, prev), op::recv(b, prev)});
  CHECK(download(comm, a) == std::vector<std::int32_t>(3, prev * 10 + 1));
  CHECK(download(comm, b) == std::vector<std::int32_t>(3, prev * 10 + 2));
  // To oneself.
  trident::buffer<std::int32_t, S> self_copy(3);
  comm.exchange({op::send(first, r), op::recv(self_copy, r)});
  CHECK(download(comm, self_copy) == std::vector<std::int32_t>(3, r * 10 + 1));
  // Blocking pairs: even ranks send to the odd rank above them.
  if (n >= 2) {
    auto payload = upload<C>(inputs<trident::bf16>(r, 9, reduce_op::sum));
    trident::buffer<trident::bf16, S> got(9);
    if (r % 2 == 0 && r + 1 < n) comm.send(payload, r + 1);
    if (r % 2 == 1) {
      comm.recv(got, r - 1);
      CHECK(download(comm, got) == inputs<trident::bf16>(r - 1, 9, reduce_op::sum));
    }
  }
  comm.barrier();
}

//! Asynchronous forms: several operations in flight while the host computes, completed in issue
//! order; test() eventually reports completion.
template <class C>
void asynchronous(C& comm) {
  using S = typename C::space;
  const int n = comm.size();
  const std::size_t count = 100'003;
  auto big = upload<C>(inputs<float>(comm.rank(), count, reduce_op::sum));
  auto small = upload<C>(inputs<std::int64_t>(comm.rank(), 17, reduce_op::max));
  auto shard = upload<C>(inputs<std::int64_t>(comm.rank(), 17, reduce_op::sum, 3));
  trident::buffer<std::int64_t, S> gathered(17 * static_cast<std::size_t>(n));
  // Operations in flight together touch disjoint buffers (MPI does not order them otherwise).
  auto r1 = comm.all_reduce_async(big, reduce_op::sum);
  auto r2 = comm.all_reduce_async(small, reduce_op::max);
  auto r3 = comm.all_gather_async(shard, gathered);
  double busy = 0;  // the computation the communication overlaps with
  for (int i = 1; i < 200000; ++i) busy += 1.0 / i;
  CHECK(busy > 1.0);
  r3.wait();
  r1.wait();
  r2.wait();
  CHECK(r1.test());
  const auto got = download(comm, big);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (static_cast<double>(got[i]) != reference<float>(n, i, reduce_op::sum)) ++bad;
  CHECK(bad == 0);
  const auto maxed = download(comm, small);
  for (std::size_t i = 0; i < maxed.size(); ++i)
    CHECK(static_cast<double>(maxed[i]) == reference<std::int64_t>(n, i, reduce_op::max));
  std::vector<std::int64_t> want;
  for (int q = 0; q < n; ++q) {
    const auto theirs = inputs<std::int64_t>(q, 17, reduce_op::sum, 3);
    want.insert(want.end(), theirs.begin(), theirs.end());
  }
  CHECK(download(comm, gathered) == want);
  // Every other asynchronous form, once.
  const auto chunked = static_cast<std::size_t>(2 * n);
  auto in = upload<C>(inputs<std::int32_t>(comm.rank(), chunked, reduce_op::sum));
  auto bc = upload<C>(inputs<std::int32_t>(comm.rank(), chunked, reduce_op::sum, 9));
  trident::buffer<std::int32_t, S> rs(2), to_all(chunked), red(chunked);
  auto a = comm.reduce_scatter_async(in, rs, reduce_op::sum);
  auto b = comm.all_to_all_async(in, to_all);
  auto c = comm.reduce_async(in, red, 0, reduce_op::sum);
  auto d = comm.broadcast_async(bc, n - 1);
  a.wait();
  b.wait();
  c.wait();
  d.wait();
  CHECK(download(comm, bc) == inputs<std::int32_t>(n - 1, chunked, reduce_op::sum, 9));
  const auto rs_got = download(comm, rs);
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(static_cast<double>(rs_got[i]) == reference<std::int32_t>(n, static_cast<std::size_t>(comm.rank()) * 2 + i, reduce_op::sum));
  if (comm.rank() == 0) {
    const auto red_got = download(comm, red);
    for (std::size_t i = 0; i < chunked; ++i) CHECK(static_cast<double>(red_got[i]) == reference<std::int32_t>(n, i, reduce_op::sum));
  }
  using op = trident::p2p_op<S>;
  trident::buffer<std::int32_t, S> ring(chunked);
  auto e = comm.exchange_async({op::send(in, (comm.rank() + 1) % n), op::recv(ring, (comm.rank() + n - 1) % n)});
  e.wait();
  CHECK(download(comm, ring) == inputs<std::int32_t>((comm.rank() + n - 1) % n, chunked, reduce_op::sum));
}

//! split: even and odd ranks with keys reversed; a collective inside each part; one colour for all.
template <class C>
void split(C& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  C part = comm.split(r % 2, -r);  // reversed order inside each parity
  const int members = (n + 1 - r % 2) / 2;
  CHECK(part.size() == members);
  // Ranks of my parity, highest first: my position is the number of same-parity ranks above me.
  int above = 0;
  for (int q = r + 2; q < n; q += 2) ++above;
  CHECK(part.rank() == above);
  auto x = upload<C>(std::vector<std::int64_t>{r});
  part.all_reduce(x, reduce_op::sum);
  std::int64_t want = 0;
  for (int q = r % 2; q < n; q += 2) want += q;
  CHECK(download(part, x)[0] == want);
  C same = comm.split(7, 0);
  CHECK(same.size() == n);
  CHECK(same.rank() == r);
  same.barrier();
}

//! Bad input that every rank makes alike: a clear usage_error on every rank, no hang, and the
//! communicator still works afterwards.
template <class C>
void bad_input(C& comm) {
  using S = typename C::space;
  const int n = comm.size();
  trident::buffer<float, S> four(4), five(5), n_plus_one(static_cast<std::size_t>(n) + 1);
  CHECK_THROWS_AS(comm.all_reduce(four, five), trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.all_reduce(four, five), doctest::Contains("send has 4 elements but receive has 5"), trident::usage_error);
  CHECK_THROWS_AS(comm.reduce_scatter(n_plus_one, four), trident::usage_error);
  if (n > 1) CHECK_THROWS_AS(comm.all_gather(four, four), trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.broadcast(four, n), doctest::Contains("root"), trident::usage_error);
  CHECK_THROWS_AS(comm.broadcast(four, -1), trident::usage_error);
  if (n > 1) CHECK_THROWS_AS(comm.all_to_all(n_plus_one, n_plus_one), trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.send(four, n), doctest::Contains("peer"), trident::usage_error);
  CHECK_THROWS_AS(comm.recv(four, -2), trident::usage_error);
  CHECK_THROWS_AS(comm.send(four, comm.rank()), trident::usage_error);
  CHECK_THROWS_WITH_AS((void)comm.split(-3, 0), doctest::Contains("colour"), trident::usage_error);
  // reduce_scatter into its own input anywhere but this rank's chunk: the other chunks would be
  // read after being written (on 2 ranks, rank 1 receiving at the start of its own input gave
  // every element wrong on threads and the right answer on MPI). The front-end refuses it on every
  // backend, before anything is sent: every rank errs here, so nobody waits.
  if (n > 1) {
    const std::size_t chunk = 3;
    const auto me = static_cast<std::size_t>(comm.rank());
    const std::string what = "reduce_scatter on rank " + std::to_string(me) + ": send and receive buffers overlap";
    trident::buffer<float, S> whole(chunk * static_cast<std::size_t>(n));
    const std::size_t next = (me + 1) % static_cast<std::size_t>(n);
    auto into = [&](std::size_t first) { return trident::space_span<float, S>(whole.data() + first, chunk); };
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(whole, into(next * chunk)), doctest::Contains(what.c_str()), trident::usage_error);
    CHECK_THROWS_WITH_AS((void)comm.reduce_scatter_async(whole, into(next * chunk)), doctest::Contains(what.c_str()),
                         trident::usage_error);
    // The start of the input (the same pointer, but not this rank's chunk); rank 0, whose chunk
    // starts there, receives one element further instead (straddling its chunk and the next).
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(whole, into(me == 0 ? 1 : 0), reduce_op::max), doctest::Contains(what.c_str()),
                         trident::usage_error);
  }
  // Still usable.
  auto ok = upload<C>(std::vector<float>(3, 1.0f));
  comm.all_reduce(ok);
  CHECK(download(comm, ok) == std::vector<float>(3, static_cast<float>(n)));
}

//! Ranks disagreeing on the element count (for backends that can detect it): a usage_error on
//! every rank naming the counts, no hang, and the communicator still works afterwards.
template <class C>
void mismatched_counts(C& comm) {
  if (comm.size() < 2) return;
  trident::buffer<float, typename C::space> data(comm.rank() == 1 ? 12 : 8);
  CHECK_THROWS_WITH_AS(comm.all_reduce(data), doctest::Contains("element count"), trident::usage_error);
  trident::buffer<float, typename C::space> same(8);
  CHECK_THROWS_WITH_AS(comm.broadcast(same, comm.rank() == 0 ? 1 : 0), doctest::Contains("root"), trident::usage_error);
  comm.all_reduce(same);
}

//! avg over fp16/bf16 must not overflow where the average itself fits: every rank holds 30000
//! (fp16's largest finite value is 65504), and the average is 30000 again, not inf. Both the
//! one-step and the ring sizes of the thread backend, all_reduce, reduce_scatter and reduce.
template <class C>
void average_without_overflow(C& comm) {
  const int n = comm.size();
  auto check_type = [&](auto tag) {
    using T = decltype(tag);
    const float big = std::is_same_v<T, trident::fp16> ? 30000.0f : 3.0e38f;
    for (std::size_t count : {std::size_t{8}, std::size_t{4096}}) {
      INFO("rank ", comm.rank(), "/", n, " ", std::string(type_name<T>()), " count ", count);
      const std::size_t total = count * static_cast<std::size_t>(n);
      auto x = upload<C>(std::vector<T>(total, static_cast<T>(big)));
      comm.all_reduce(x, reduce_op::avg);
      auto got = download(comm, x);
      std::size_t bad = 0;
      for (T v : got)
        if (!(std::fabs(static_cast<float>(v) - big) <= 1e-2f * big)) ++bad;
      CHECK(bad == 0);
      auto in = upload<C>(std::vector<T>(total, static_cast<T>(big)));
      trident::buffer<T, typename C::space> out(count);
      comm.reduce_scatter(in, out, reduce_op::avg);
      got = download(comm, out);
      bad = 0;
      for (T v : got)
        if (!(std::fabs(static_cast<float>(v) - big) <= 1e-2f * big)) ++bad;
      CHECK(bad == 0);
      for (int root : {0, n - 1}) {
        CAPTURE(root);
        auto mine = upload<C>(std::vector<T>(count, static_cast<T>(big)));
        trident::buffer<T, typename C::space> at_root(comm.rank() == root ? count : 0);
        comm.reduce(mine, at_root, root, reduce_op::avg);
        if (comm.rank() != root) continue;
        got = download(comm, at_root);
        bad = 0;
        for (T v : got)
          if (!(std::fabs(static_cast<float>(v) - big) <= 1e-2f * big)) ++bad;
        CHECK(got.size() == count);
        CHECK(bad == 0);
      }
    }
  };
  check_type(trident::fp16{});
  check_type(trident::bf16{});
}

//! max and min with NaN follow the backend's documented rule, C::max_min_nan: `propagate` (the
//! host backends) gives NaN in an element where any rank holds NaN; `drop` (NCCL, whose kernels
//! use fmaxf / __hmax) gives the max / min of the other ranks there, NaN only where every rank
//! holds NaN. Either way the result does not depend on which rank holds the NaN, and the other
//! elements are unaffected. float32, float64, fp16 and bf16; one-step and ring sizes;
//! all_reduce (element 1: NaN on one rank, element 4: NaN on every rank), reduce_scatter (each
//! chunk's NaN from another rank) and reduce (to roots 0 and n-1).
template <class C>
void max_min_with_nan(C& comm) {
  constexpr bool propagates = C::max_min_nan == trident::nan_in_max_min::propagate;
  const int n = comm.size();
  const int me = comm.rank();
  // Rank r's element i is r + i % 3. Without rank `without` (-1: none), max over the ranks is
  // the largest other rank + i % 3, min the smallest other rank + i % 3.
  auto want = [&](reduce_op op, std::size_t i, int without) {
    const int top = without == n - 1 ? n - 2 : n - 1;
    const int bottom = without == 0 ? 1 : 0;
    return static_cast<float>((op == reduce_op::max ? top : bottom) + static_cast<int>(i % 3));
  };
  auto values = [&](std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(me) + static_cast<float>(i % 3);
    return v;
  };
  // Counts the elements of `got` (global indices first, first + 1, ...) that are wrong.
  // nan_on(i) says which rank holds a NaN in element i: -1 none, n every rank, else that rank.
  auto wrong = [&](const auto& got, std::size_t first, reduce_op op, auto nan_on) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      const std::size_t i = first + k;
      const int holder = nan_on(i);
      const float v = static_cast<float>(got[k]);
      // One rank alone holding NaN is every rank holding it.
      const bool nan_expected = holder == n || (holder >= 0 && (propagates || n == 1));
      if (nan_expected ? !std::isnan(v) : v != want(op, i, holder)) ++bad;
    }
    return bad;
  };
  auto check_type = [&](auto tag) {
    using T = decltype(tag);
    auto upload_values = [&](const std::vector<float>& v) {
      std::vector<T> host(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) host[i] = static_cast<T>(v[i]);
      return upload<C>(host);
    };
    for (std::size_t count : {std::size_t{6}, std::size_t{3000}})
      for (int holder = 0; holder < n; ++holder)
        for (reduce_op op : {reduce_op::max, reduce_op::min}) {
          INFO("rank ", me, "/", n, " ", std::string(type_name<T>()), " ", std::string(trident::name_of(op)), " count ", count,
               " NaN on rank ", holder, propagates ? " (propagated)" : " (dropped unless on every rank)");
          // Element 1: NaN on `holder`; element 4: NaN on every rank.
          auto nan_on = [&](std::size_t i) { return i == 1 ? holder : i == 4 ? n : -1; };
          {
            auto host = values(count);
            if (me == holder) host[1] = std::nanf("");
            host[4] = std::nanf("");
            auto x = upload_values(host);
            comm.all_reduce(x, op);
            const auto got = download(comm, x);
            INFO("all_reduce");
            CHECK(wrong(got, 0, op, nan_on) == 0);
          }
          {
            // Chunk k's NaN (its element 1) comes from rank (k + holder) % n: each rank's result
            // takes its NaN from another rank, and every rank holds one.
            const std::size_t chunk = count == 6 ? 3 : 1031;  // 1031: above the one-step limit
            auto host = values(chunk * static_cast<std::size_t>(n));
            for (int k = 0; k < n; ++k)
              if ((k + holder) % n == me) host[static_cast<std::size_t>(k) * chunk + 1] = std::nanf("");
            auto in = upload_values(host);
            trident::buffer<T, typename C::space> out(chunk);
            comm.reduce_scatter(in, out, op);
            const auto got = download(comm, out);
            INFO("reduce_scatter, chunk ", chunk);
            const auto chunk_nan_on = [&](std::size_t i) {
              return i % chunk == 1 ? static_cast<int>((i / chunk + static_cast<std::size_t>(holder)) % static_cast<std::size_t>(n)) : -1;
            };
            CHECK(wrong(got, static_cast<std::size_t>(me) * chunk, op, chunk_nan_on) == 0);
          }
          for (int root : {0, n - 1}) {
            auto host = values(count);
            if (me == holder) host[1] = std::nanf("");
            host[4] = std::nanf("");
            auto in = upload_values(host);
            trident::buffer<T, typename C::space> out(me == root ? count : 0);
            comm.reduce(in, out, root, op);
            if (me != root) continue;
            const auto got = download(comm, out);
            INFO("reduce to root ", root);
            CHECK(got.size() == count);
            CHECK(wrong(got, 0, op, nan_on) == 0);
          }
        }
  };
  check_type(float{});
  check_type(double{});
  check_type(trident::fp16{});
  check_type(trident::bf16{});
}

//! traffic(): calls and payload bytes per kind (an all_gather counts its output, the other
//! collectives their input), the asynchronous forms too, the same on every rank; a call its
//! argument checks refuse is not counted, and reset_traffic() starts again from zero.
template <class C>
void traffic(C& comm) {
  using S = typename C::space;
  using count = trident::traffic_counters::count;
  const auto n = static_cast<std::size_t>(comm.size());
  const int r = comm.rank();
  comm.reset_traffic();
  CHECK(comm.traffic().total() == count{});
  trident::buffer<float, S> a(6 * n), b(6 * n), piece(6), other(6);
  trident::buffer<double, S> d(5);
  trident::fill_zero(a);
  trident::fill_zero(piece);
  trident::fill_zero(d);
  comm.all_reduce(a);
  comm.all_reduce_async(d, reduce_op::max).wait();
  comm.reduce_scatter(a, piece);
  comm.all_gather(piece, b);
  comm.broadcast(d, 0);
  comm.reduce(piece, other, 0);
  comm.all_to_all(a, b);
  if (n > 1) {
    using op = trident::p2p_op<S>;
    comm.exchange({op::send(piece, (r + 1) % comm.size()), op::recv(other, (r + comm.size() - 1) % comm.size())});
  }
  trident::buffer<float, S> longer(6 * n + 1);
  CHECK_THROWS_AS(comm.all_reduce(a, longer), trident::usage_error);  // sizes differ: refused, not counted
  comm.synchronize();
  const auto& t = comm.traffic();
  const std::uint64_t f = sizeof(float), dbl = sizeof(double);
  CHECK(t.of(trident::collective::all_reduce) == count{2, 6 * n * f + 5 * dbl});
  CHECK(t.of(trident::collective::reduce_scatter) == count{1, 6 * n * f});
  CHECK(t.of(trident::collective::all_gather) == count{1, 6 * n * f});
  CHECK(t.of(trident::collective::broadcast) == count{1, 5 * dbl});
  CHECK(t.of(trident::collective::reduce) == count{1, 6 * f});
  CHECK(t.of(trident::collective::all_to_all) == count{1, 6 * n * f});
  CHECK(t.sends == (n > 1 ? count{1, 6 * f} : count{}));
  CHECK(t.receives == t.sends);
  CHECK(t.total().calls == 7 + (n > 1 ? 2u : 0u));
  comm.reset_traffic();
  CHECK(comm.traffic().total() == count{});
}

}  // namespace suite
