// The MPI communicator, under mpirun with 4 ranks: what is specific to MPI (every collective on
// every element type and op through MPI's own calls, in place and not, the fp16/bf16 user ops,
// MPI's non-blocking forms, communicator splits and duplicates, the cross-rank argument check,
// errors returned instead of aborting). Every rank computes every other rank's input from its
// rank number, so each can check its result against a serial reference.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/collective_suite.hpp"
#include "comm/grid_suite.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

using trident::dtype;
using trident::host_space;
using trident::reduce_op;

namespace {

//! The communicator every test uses: a duplicate of MPI_COMM_WORLD made in main(), argument
//! checks off whatever the environment says (the shared suite below turns them on and off).
trident::mpi_comm& world() { return test_support::mpi_world(); }

constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min, reduce_op::prod};
constexpr std::size_t sizes[] = {0, 1, 7};  // 7: no multiple of the 4 ranks

template <class T>
constexpr bool is_half = std::is_same_v<T, trident::fp16> || std::is_same_v<T, trident::bf16>;

template <class T>
T from_double(double v) {
  if constexpr (is_half<T>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
double to_double(T v) {
  if constexpr (is_half<T>) return static_cast<float>(v);
  else return static_cast<double>(v);
}
//! Bitwise for fp16/bf16 (no operator==), value equality otherwise.
template <class T>
bool same(T a, T b) {
  if constexpr (is_half<T>) return a.bits() == b.bits();
  else return a == b;
}

// Inputs and the serial reference are the shared suite's (small integers: exact in every type
// and in any order of combination).
using suite::input;
using suite::inputs;

template <class T>
std::vector<T> reference(int ranks, std::size_t n, reduce_op op) {
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = from_double<T>(suite::reference<T>(ranks, i, op));
  return out;
}

//! Data for the collectives that only move elements: distinct per (rank, index), exact in uint8.
template <class T>
T payload(int r, std::size_t i) {
  return from_double<T>(static_cast<double>((static_cast<std::size_t>(r) * 16 + i) % 100));
}

template <class T>
void check_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  CAPTURE(what);
  CHECK(got.size() == want.size());
  if (got.size() != want.size()) return;  // never REQUIRE: one rank leaving a test early would hang the others
  std::size_t mismatches = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!same(got[i], want[i]) && mismatches++ == 0) first = i;
  }
  CHECK_MESSAGE(mismatches == 0, trident::detail::concat(mismatches, " wrong elements; first at ", first, ": got ",
                                                         mismatches ? to_double(got[first]) : 0.0, ", expected ",
                                                         mismatches ? to_double(want[first]) : 0.0));
}

std::string describe(const char* what, reduce_op op, std::size_t n, bool in_place) {
  return trident::detail::concat(what, " ", trident::name_of(op), " n=", n, in_place ? " in place" : "");
}

template <class T>
std::vector<T> slice(const std::vector<T>& v, std::size_t offset, std::size_t n) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(offset), v.begin() + static_cast<std::ptrdiff_t>(offset + n));
}

template <class T>
trident::space_span<T, host_space> part(std::vector<T>& v, std::size_t offset, std::size_t n) {
  return {v.data() + offset, n};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

#define TRIDENT_ELEMENT_TYPES float, double, trident::fp16, trident::bf16, std::int32_t, std::int64_t, std::uint8_t

// ---- every collective x element type x op ------------------------------------------------------

TEST_CASE_TEMPLATE("all_reduce: every op, in place and not, against a serial reference", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  for (reduce_op op : all_ops) {
    for (std::size_t n : sizes) {
      const auto want = reference<T>(comm.size(), n, op);
      auto data = inputs<T>(rank, n, op);
      comm.all_reduce(data, op);
      check_equal(data, want, describe("all_reduce", op, n, true));

      const auto in = inputs<T>(rank, n, op);
      std::vector<T> out(n, from_double<T>(99));
      comm.all_reduce(in, out, op);
      check_equal(out, want, describe("all_reduce", op, n, false));
      check_equal(in, inputs<T>(rank, n, op), "all_reduce leaves its input alone");
    }
  }
}

TEST_CASE_TEMPLATE("reduce_scatter: every op, in place (this rank's chunk) and not", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  const auto ranks = static_cast<std::size_t>(comm.size());
  CAPTURE(rank);
  for (reduce_op op : all_ops) {
    for (std::size_t n : sizes) {
      const auto full = reference<T>(comm.size(), n * ranks, op);
      const auto want = slice(full, static_cast<std::size_t>(rank) * n, n);

      const auto in = inputs<T>(rank, n * ranks, op);
      std::vector<T> out(n, from_double<T>(99));
      comm.reduce_scatter(in, out, op);
      check_equal(out, want, describe("reduce_scatter", op, n, false));

      auto data = inputs<T>(rank, n * ranks, op);
      comm.reduce_scatter(data, part(data, static_cast<std::size_t>(rank) * n, n), op);
      check_equal(slice(data, static_cast<std::size_t>(rank) * n, n), want, describe("reduce_scatter", op, n, true));
      // This backend stages the result, so the other chunks of the input survive.
      for (std::size_t r = 0; r < ranks; ++r) {
        if (r != static_cast<std::size_t>(rank))
          check_equal(slice(data, r * n, n), slice(in, r * n, n), "reduce_scatter in place keeps the other chunks");
      }
    }
  }
}

TEST_CASE_TEMPLATE("all_gather: out of place, in place (own slot) and input at the start of the output", T,
                   TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  const auto ranks = static_cast<std::size_t>(comm.size());
  CAPTURE(rank);
  for (std::size_t n : sizes) {
    std::vector<T> want(n * ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < n; ++i) want[r * n + i] = payload<T>(static_cast<int>(r), i);
    std::vector<T> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = payload<T>(rank, i);

    std::vector<T> out(n * ranks, from_double<T>(99));
    comm.all_gather(mine, out);
    check_equal(out, want, trident::detail::concat("all_gather n=", n));

    std::vector<T> slots(n * ranks, from_double<T>(99));
    std::copy(mine.begin(), mine.end(), slots.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank) * n));
    comm.all_gather(part(slots, static_cast<std::size_t>(rank) * n, n), slots);
    check_equal(slots, want, trident::detail::concat("all_gather in place n=", n));

    std::vector<T> front(n * ranks, from_double<T>(99));
    std::copy(mine.begin(), mine.end(), front.begin());
    comm.all_gather(part(front, 0, n), front);
    check_equal(front, want, trident::detail::concat("all_gather from the output's start n=", n));
  }
}

TEST_CASE_TEMPLATE("broadcast: from every root", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  for (std::size_t n : sizes) {
    for (int root = 0; root < comm.size(); ++root) {
      std::vector<T> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = payload<T>(root, i);
      std::vector<T> data = rank == root ? want : std::vector<T>(n, from_double<T>(99));
      comm.broadcast(data, root);
      check_equal(data, want, trident::detail::concat("broadcast n=", n, " root=", root));
    }
  }
}

TEST_CASE_TEMPLATE("reduce: every op, first and last root, in place and not", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  for (reduce_op op : all_ops) {
    for (std::size_t n : sizes) {
      for (int root : {0, comm.size() - 1}) {
        const auto want = reference<T>(comm.size(), n, op);
        const auto in = inputs<T>(rank, n, op);
        std::vector<T> out(rank == root ? n : 0, from_double<T>(99));
        comm.reduce(in, out, root, op);
        if (rank == root) check_equal(out, want, describe("reduce", op, n, false));

        auto data = inputs<T>(rank, n, op);
        comm.reduce(data, data, root, op);
        check_equal(data, rank == root ? want : in, describe("reduce", op, n, true));
      }
    }
  }
}

TEST_CASE_TEMPLATE("all_to_all: chunk j goes to rank j", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  const auto ranks = static_cast<std::size_t>(comm.size());
  CAPTURE(rank);
  for (std::size_t n : sizes) {
    std::vector<T> in(n * ranks);
    std::vector<T> want(n * ranks);
    for (std::size_t j = 0; j < ranks; ++j) {
      for (std::size_t i = 0; i < n; ++i) {
        in[j * n + i] = payload<T>(rank, j * 8 + i);
        want[j * n + i] = payload<T>(static_cast<int>(j), static_cast<std::size_t>(rank) * 8 + i);
      }
    }
    std::vector<T> out(n * ranks, from_double<T>(99));
    comm.all_to_all(in, out);
    check_equal(out, want, trident::detail::concat("all_to_all n=", n, " per rank"));
  }
}

TEST_CASE("all_reduce of about 10M floats, sum and avg") {
  auto& comm = world();
  const int rank = comm.rank();
  const int ranks = comm.size();
  CAPTURE(rank);
  constexpr std::size_t n = 10'000'019;
  const auto value = [](int r, std::size_t i) { return static_cast<float>(static_cast<int>((i + static_cast<std::size_t>(r) * 3) % 7) - 3); };
  std::vector<float> data(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = value(rank, i);
  comm.all_reduce(data, reduce_op::sum);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < ranks; ++r) want += value(r, i);
    wrong += data[i] != want;
  }
  CHECK(wrong == 0);

  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = value(rank, i);
  comm.all_reduce(data, out, reduce_op::avg);
  wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < ranks; ++r) sum += value(r, i);
    wrong += out[i] != sum / static_cast<float>(ranks);
  }
  CHECK(wrong == 0);
}

// ---- fp16 / bf16 through the user-defined ops ---------------------------------------------------

TEST_CASE("fp16 and bf16 are reduced as numbers in their own format, not as bit patterns") {
  auto& comm = world();
  const int rank = comm.rank();
  const int ranks = comm.size();
  CAPTURE(rank);

  // 2^30 is a bf16 but overflows fp16: a mix-up of the two formats would show.
  std::vector<trident::bf16> big(3, trident::bf16(std::ldexp(1.0f, 30)));
  comm.all_reduce(big, reduce_op::sum);
  for (auto x : big) CHECK(static_cast<float>(x) == std::ldexp(1.0f, 30) * static_cast<float>(ranks));

  std::vector<trident::fp16> ones(5, trident::fp16(1.5f));
  comm.all_reduce(ones, reduce_op::sum);
  for (auto x : ones) CHECK(static_cast<float>(x) == 1.5f * static_cast<float>(ranks));

  // Negative values order backwards as raw bits; max/min must compare numbers.
  const float mine = -0.5f * static_cast<float>(rank + 1);
  for (dtype type : {dtype::float16, dtype::bfloat16}) {
    if (type == dtype::float16) {
      std::vector<trident::fp16> hi(2, trident::fp16(mine)), lo(2, trident::fp16(mine));
      comm.all_reduce(hi, reduce_op::max);
      comm.all_reduce(lo, reduce_op::min);
      CHECK(static_cast<float>(hi[1]) == -0.5f);
      CHECK(static_cast<float>(lo[1]) == -0.5f * static_cast<float>(ranks));
    } else {
      std::vector<trident::bf16> hi(2, trident::bf16(mine)), lo(2, trident::bf16(mine));
      comm.all_reduce(hi, reduce_op::max);
      comm.all_reduce(lo, reduce_op::min);
      CHECK(static_cast<float>(hi[1]) == -0.5f);
      CHECK(static_cast<float>(lo[1]) == -0.5f * static_cast<float>(ranks));
    }
  }

  // avg of halves: summed in the user op, divided afterwards (0.75 * 4 / 4).
  std::vector<trident::bf16> avg(4, trident::bf16(0.75f));
  comm.all_reduce(avg, reduce_op::avg);
  for (auto x : avg) CHECK(static_cast<float>(x) == 0.75f);
}

// ---- asynchronous forms ------------------------------------------------------------------------

TEST_CASE("an async all_reduce overlaps host work; test() polls, wait() finishes (avg) and repeats harmlessly") {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  constexpr std::size_t n = 1 << 20;
  std::vector<float> grads(n, static_cast<float>(rank));
  auto pending = comm.all_reduce_async(grads, reduce_op::avg);

  // The host computation that the communication hides behind, polling now and then.
  double work = 0;
  int polls = 0;
  bool done = false;
  for (std::size_t i = 0; i < 4'000'000; ++i) {
    work += std::sqrt(static_cast<double>(i));
    if (i % 100'000 == 0 && !done) {
      done = pending.test();
      ++polls;
    }
  }
  CHECK(work > 0);
  CHECK(polls > 0);
  pending.wait();
  pending.wait();  // a second wait does nothing
  CHECK(pending.test());
  const float want = static_cast<float>(comm.size() - 1) / 2.0f;  // avg of 0, 1, ..., size-1
  CHECK(std::count(grads.begin(), grads.end(), want) == static_cast<std::ptrdiff_t>(n));
}

TEST_CASE_TEMPLATE("every async collective matches its blocking form", T, TRIDENT_ELEMENT_TYPES) {
  auto& comm = world();
  const int rank = comm.rank();
  const auto ranks = static_cast<std::size_t>(comm.size());
  CAPTURE(rank);
  constexpr std::size_t n = 7;
  for (reduce_op op : {reduce_op::avg, reduce_op::max}) {
    const auto want = reference<T>(comm.size(), n, op);

    const auto in = inputs<T>(rank, n, op);
    std::vector<T> out(n);
    auto r1 = comm.all_reduce_async(in, out, op);

    // In-place reduce_scatter goes through the staging buffer that the request carries.
    const auto full = reference<T>(comm.size(), n * ranks, op);
    auto scatter = inputs<T>(rank, n * ranks, op);
    auto r2 = comm.reduce_scatter_async(scatter, part(scatter, static_cast<std::size_t>(rank) * n, n), op);

    const int root = comm.size() - 1;
    auto reduced = inputs<T>(rank, n, op);
    auto r3 = comm.reduce_async(reduced, reduced, root, op);

    // Several requests in flight at once, finished in another order than started.
    r3.wait();
    r2.wait();
    r1.wait();
    check_equal(out, want, describe("all_reduce_async", op, n, false));
    check_equal(slice(scatter, static_cast<std::size_t>(rank) * n, n), slice(full, static_cast<std::size_t>(rank) * n, n),
                describe("reduce_scatter_async", op, n, true));
    check_equal(reduced, rank == root ? want : inputs<T>(rank, n, op), describe("reduce_async", op, n, true));
  }

  std::vector<T> mine(n), gathered(n * ranks), want_gathered(n * ranks);
  for (std::size_t i = 0; i < n; ++i) mine[i] = payload<T>(rank, i);
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) want_gathered[r * n + i] = payload<T>(static_cast<int>(r), i);
  comm.all_gather_async(mine, gathered).wait();
  check_equal(gathered, want_gathered, "all_gather_async");

  const int bcast_root = comm.size() / 2;
  std::vector<T> bcast = rank == bcast_root ? mine : std::vector<T>(n);
  auto rb = comm.broadcast_async(bcast, bcast_root);
  while (!rb.test()) {
  }
  std::vector<T> want_bcast(n);
  for (std::size_t i = 0; i < n; ++i) want_bcast[i] = payload<T>(bcast_root, i);
  check_equal(bcast, want_bcast, "broadcast_async");

  std::vector<T> a2a_in(n * ranks), a2a_out(n * ranks), a2a_want(n * ranks);
  for (std::size_t j = 0; j < ranks; ++j) {
    for (std::size_t i = 0; i < n; ++i) {
      a2a_in[j * n + i] = payload<T>(rank, j * 8 + i);
      a2a_want[j * n + i] = payload<T>(static_cast<int>(j), static_cast<std::size_t>(rank) * 8 + i);
    }
  }
  comm.all_to_all_async(a2a_in, a2a_out).wait();
  check_equal(a2a_out, a2a_want, "all_to_all_async");
}

TEST_CASE("requests: destruction waits (and finishes avg), moves hand over, assignment finishes the old one") {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  const float mean = static_cast<float>(comm.size() - 1) / 2.0f;

  std::vector<float> a(1000, static_cast<float>(rank));
  { auto dropped = comm.all_reduce_async(a, reduce_op::avg); }
  CHECK(std::count(a.begin(), a.end(), mean) == 1000);

  std::vector<float> b(1000, static_cast<float>(rank));
  auto first = comm.all_reduce_async(b, reduce_op::avg);
  trident::mpi_request moved = std::move(first);
  first.wait();  // moved-from: nothing to do
  CHECK(first.test());
  moved.wait();
  CHECK(std::count(b.begin(), b.end(), mean) == 1000);

  std::vector<float> c(1000, static_cast<float>(rank)), d(1000, 1.0f);
  trident::mpi_request r = comm.all_reduce_async(c, reduce_op::avg);
  r = comm.all_reduce_async(d, reduce_op::sum);  // finishes c's first
  CHECK(std::count(c.begin(), c.end(), mean) == 1000);
  r.wait();
  CHECK(std::count(d.begin(), d.end(), static_cast<float>(comm.size())) == 1000);

  trident::mpi_request empty;
  empty.wait();
  CHECK(empty.test());
}

// ---- point to point ----------------------------------------------------------------------------

TEST_CASE("exchange: ring shift, ordered messages to one peer, self, empty groups, async") {
  auto& comm = world();
  const int rank = comm.rank();
  const int ranks = comm.size();
  const int next = (rank + 1) % ranks;
  const int prev = (rank + ranks - 1) % ranks;
  CAPTURE(rank);
  using op = trident::p2p_op<host_space>;

  std::vector<std::int64_t> out(5, rank), in(5, -1);
  comm.exchange({op::send(out, next), op::recv(in, prev)});
  CHECK(std::count(in.begin(), in.end(), prev) == 5);

  // Two messages to the same peer arrive in the order they were issued.
  std::vector<trident::bf16> first(3, trident::bf16(static_cast<float>(rank))), second(3, trident::bf16(100.0f));
  std::vector<trident::bf16> got1(3), got2(3);
  comm.exchange({op::recv(got1, prev), op::send(first, next), op::recv(got2, prev), op::send(second, next)});
  CHECK(static_cast<float>(got1[2]) == static_cast<float>(prev));
  CHECK(static_cast<float>(got2[2]) == 100.0f);

  // To oneself is fine inside one group.
  std::vector<double> self_out{1.25, 2.5}, self_in(2);
  comm.exchange({op::send(self_out, rank), op::recv(self_in, rank)});
  CHECK(self_in == self_out);

  // Zero elements and no operations at all.
  std::vector<float> none;
  comm.exchange({op::send(none, next), op::recv(none, prev)});
  comm.exchange(std::span<const op>{});

  std::vector<std::uint8_t> small_out(4, static_cast<std::uint8_t>(rank)), small_in(4);
  auto pending = comm.exchange_async({op::send(small_out, prev), op::recv(small_in, next)});
  pending.wait();
  CHECK(std::count(small_in.begin(), small_in.end(), static_cast<std::uint8_t>(next)) == 4);
}

TEST_CASE("blocking send and recv between pairs") {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  const int partner = rank ^ 1;
  if (partner >= comm.size()) return;
  std::vector<std::int32_t> mine(9, rank * 10), theirs(9, -1);
  if (rank % 2 == 0) {
    comm.send(mine, partner);
    comm.recv(theirs, partner);
  } else {
    comm.recv(theirs, partner);
    comm.send(mine, partner);
  }
  CHECK(std::count(theirs.begin(), theirs.end(), partner * 10) == 9);
}

TEST_CASE("a receive of the wrong size is a usage_error on the receiving rank") {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  using op = trident::p2p_op<host_space>;
  // 0 -> 1: longer than the receive (MPI truncation); 2 -> 3: shorter than the receive.
  if (rank == 0) {
    std::vector<float> x(8, 1.0f);
    comm.exchange({op::send(x, 1)});
  } else if (rank == 1) {
    std::vector<float> x(4);
    CHECK_THROWS_AS(comm.exchange({op::recv(x, 0)}), trident::usage_error);
  } else if (rank == 2) {
    std::vector<float> x(4, 1.0f);
    comm.exchange({op::send(x, 3)});
  } else if (rank == 3) {
    std::vector<float> x(8);
    try {
      comm.exchange({op::recv(x, 2)});
      FAIL_CHECK("a short message was accepted");
    } catch (const trident::usage_error& e) {
      CHECK(contains(e.message(), "got a message of 4 elements"));
    }
  }
  comm.barrier();
}

// ---- communicators -----------------------------------------------------------------------------

TEST_CASE("split: even and odd colours with reversed keys; nested splits; moves") {
  auto& comm = world();
  const int rank = comm.rank();
  CAPTURE(rank);
  std::vector<std::int32_t> members;
  for (int r = comm.size() - 1; r >= 0; --r)
    if (r % 2 == rank % 2) members.push_back(r);  // key -rank: highest rank first

  auto half = comm.split(rank % 2, -rank);
  CHECK(half.size() == static_cast<int>(members.size()));
  CHECK(half.rank() == static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin()));
  std::vector<std::int32_t> mine{rank}, all(members.size());
  half.all_gather(mine, all);
  CHECK(all == members);

  int relation = MPI_IDENT;
  MPI_Comm_compare(half.native(), comm.native(), &relation);
  CHECK(relation == (comm.size() > 1 ? MPI_UNEQUAL : MPI_CONGRUENT));
  MPI_Comm_compare(comm.native(), MPI_COMM_WORLD, &relation);
  CHECK(relation == MPI_CONGRUENT);  // a duplicate, never MPI_COMM_WORLD itself

  auto alone = half.split(half.rank(), 0);
  CHECK(alone.size() == 1);
  CHECK(alone.rank() == 0);
  std::vector<std::int32_t> seven{7};
  alone.all_reduce(seven, reduce_op::avg);
  CHECK(seven[0] == 7);

  trident::mpi_comm moved = std::move(half);
  CHECK(half.native() == MPI_COMM_NULL);  // NOLINT: testing the moved-from state
  std::vector<std::int32_t> one{1};
  moved.all_reduce(one);
  CHECK(one[0] == static_cast<std::int32_t>(members.size()));
  moved.barrier();
  moved.synchronize();
}

TEST_CASE("mpi_environment inside an initialised MPI does nothing, and does not finalise") {
  int provided = -1;
  MPI_Query_thread(&provided);
  {
    trident::mpi_environment nested;
    CHECK_FALSE(nested.owns_mpi());
    CHECK(nested.provided() == provided);
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);
}

TEST_CASE("check_arguments is on by default; only TRIDENT_CHECK_COLLECTIVES=0 turns it off") {
  const char* before = std::getenv("TRIDENT_CHECK_COLLECTIVES");
  const std::string saved = before != nullptr ? before : "";
  const auto made_with = [](const char* value) {
    if (value != nullptr) ::setenv("TRIDENT_CHECK_COLLECTIVES", value, 1);
    else ::unsetenv("TRIDENT_CHECK_COLLECTIVES");
    return trident::mpi_comm(MPI_COMM_WORLD).check_arguments();
  };
  CHECK(made_with(nullptr));
  CHECK(made_with("1"));
  CHECK(made_with(""));
  CHECK(made_with("off"));  // not "0": a typo must not drop the check
  CHECK_FALSE(made_with("0"));
  ::unsetenv("TRIDENT_CHECK_COLLECTIVES");
  CHECK(trident::mpi_comm::world().check_arguments());
  CHECK(trident::mpi_comm(MPI_COMM_WORLD, true).split(0, 0).check_arguments());  // inherited
  CHECK_FALSE(trident::mpi_comm(MPI_COMM_WORLD, false).split(0, 0).check_arguments());
  if (before != nullptr) ::setenv("TRIDENT_CHECK_COLLECTIVES", saved.c_str(), 1);
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("bad input is a usage_error on every rank, and the communicator stays usable") {
  auto& comm = world();
  const int rank = comm.rank();
  const int ranks = comm.size();
  CAPTURE(rank);
  std::vector<float> eight(8), seven(7), nine(9), two(2), six(6), one(1);
  CHECK_THROWS_AS(comm.all_reduce(eight, seven), trident::usage_error);
  CHECK_THROWS_AS(comm.reduce_scatter(nine, two), trident::usage_error);
  CHECK_THROWS_AS(comm.all_gather(two, seven), trident::usage_error);
  CHECK_THROWS_AS(comm.all_to_all(six, six), trident::usage_error);
  CHECK_THROWS_AS(comm.all_reduce_async(eight, seven), trident::usage_error);

  CHECK_THROWS_AS(comm.broadcast(one, ranks), trident::usage_error);
  CHECK_THROWS_AS(comm.broadcast(one, -1), trident::usage_error);
  CHECK_THROWS_AS(comm.reduce(one, one, ranks + 2), trident::usage_error);

  using op = trident::p2p_op<host_space>;
  CHECK_THROWS_AS(comm.send(one, ranks), trident::usage_error);
  CHECK_THROWS_AS(comm.recv(one, -1), trident::usage_error);
  CHECK_THROWS_AS(comm.send(one, rank), trident::usage_error);
  CHECK_THROWS_AS(comm.exchange({op::send(one, (rank + 1) % ranks), op::recv(one, ranks)}), trident::usage_error);

  try {
    (void)comm.split(-1, 0);
    FAIL_CHECK("a negative colour was accepted");
  } catch (const trident::usage_error& e) {
    CHECK(contains(e.message(), "colour -1"));
  }

  std::vector<std::int32_t> x{rank};
  comm.all_reduce(x);
  CHECK(x[0] == ranks * (ranks - 1) / 2);
}

TEST_CASE("MPI's own failures come back as mpi_error (MPI_ERRORS_RETURN on the duplicate)") {
  auto& comm = world();
  int x = 0;
  try {
    TRIDENT_MPI_CHECK(MPI_Bcast(&x, 1, MPI_INT, comm.size() + 3, comm.native()));
    FAIL_CHECK("MPI accepted a root outside the communicator");
  } catch (const trident::mpi_error& e) {
    CHECK(e.status() != MPI_SUCCESS);
    CHECK(e.operation().rfind("MPI_Bcast", 0) == 0);
    CHECK_FALSE(e.message().empty());
  }
  comm.barrier();
}

TEST_CASE("check_arguments: ranks that disagree all get the same usage_error, and can go on") {
  auto& comm = world();
  const int rank = comm.rank();
  const int ranks = comm.size();
  CAPTURE(rank);
  const bool before = comm.check_arguments();
  comm.check_arguments(true);
  const auto expect_on_every_rank = [&](auto&& call, const std::string& text) {
    try {
      call();
      FAIL_CHECK((std::string("a mismatch across ranks went unnoticed: ") + text));
    } catch (const trident::usage_error& e) {
      CHECK_MESSAGE(contains(e.message(), text), e.message());
    }
  };

  std::vector<float> counted(rank == 0 ? 8 : 12);
  expect_on_every_rank([&] { comm.all_reduce(counted); }, "all_reduce: ranks disagree on the element count: 8 to 12");
  expect_on_every_rank([&] { (void)comm.all_reduce_async(counted); }, "ranks disagree on the element count: 8 to 12");

  std::vector<float> f(4);
  std::vector<std::int32_t> i(4);
  expect_on_every_rank(
      [&] {
        if (rank == 0) comm.all_reduce(i);
        else comm.all_reduce(f);
      },
      "ranks disagree on the element type: float32 to int32");
  expect_on_every_rank([&] { comm.all_reduce(f, rank == ranks - 1 ? reduce_op::max : reduce_op::sum); },
                       "ranks disagree on the reduction: sum to max");
  expect_on_every_rank([&] { comm.broadcast(f, rank == 0 ? 1 : 0); }, "broadcast: ranks disagree on the root: 0 to 1");
  expect_on_every_rank(
      [&] {
        if (rank == 0) comm.broadcast(f, 0);
        else comm.all_reduce(f);
      },
      "ranks disagree on the collective: all_reduce to broadcast");

  // Reduce: only the root has a receive buffer; the send counts are what must agree.
  std::vector<float> in(5, 1.0f), out(rank == 2 ? 5 : 0);
  comm.reduce(in, out, 2);
  if (rank == 2) CHECK(out[4] == static_cast<float>(ranks));

  // One rank's negative colour fails every rank.
  expect_on_every_rank([&] { (void)comm.split(rank == 1 ? -3 : 0, 0); }, "colour -3");

  comm.check_arguments(false);
  std::vector<std::int32_t> x{1};
  comm.all_reduce(x);
  CHECK(x[0] == ranks);
  comm.check_arguments(before);
}

// ---- the backend-independent suite, on MPI -----------------------------------------------------
// Each body runs twice: with the cross-rank argument check (the default, so it must never refuse
// a valid call) and without it (TRIDENT_CHECK_COLLECTIVES=0, the opt-out for speed).

namespace {

//! Runs `body` on world() with the argument check on, then off; restores the setting after.
template <class Body>
void checked_and_unchecked(Body&& body) {
  struct restore {
    trident::mpi_comm& comm;
    bool was;
    ~restore() { comm.check_arguments(was); }
  } guard{world(), world().check_arguments()};
  for (const bool check : {true, false}) {
    CAPTURE(check);
    world().check_arguments(check);
    body(world());
  }
}

}  // namespace

TEST_CASE("mpi suite: all_reduce, every type x op x size") { checked_and_unchecked([](auto& c) { suite::all_reduce(c); }); }
TEST_CASE("mpi suite: all_reduce of 10M floats") { checked_and_unchecked([](auto& c) { suite::all_reduce_large(c); }); }
TEST_CASE("mpi suite: results identical on every rank and run to run") {
  checked_and_unchecked([](auto& c) { suite::deterministic(c); });
}
TEST_CASE("mpi suite: reduce_scatter") { checked_and_unchecked([](auto& c) { suite::reduce_scatter(c); }); }
TEST_CASE("mpi suite: all_gather") { checked_and_unchecked([](auto& c) { suite::all_gather(c); }); }
TEST_CASE("mpi suite: broadcast") { checked_and_unchecked([](auto& c) { suite::broadcast(c); }); }
TEST_CASE("mpi suite: reduce") { checked_and_unchecked([](auto& c) { suite::reduce(c); }); }
TEST_CASE("mpi suite: all_to_all") { checked_and_unchecked([](auto& c) { suite::all_to_all(c); }); }
TEST_CASE("mpi suite: point to point") { checked_and_unchecked([](auto& c) { suite::point_to_point(c); }); }
TEST_CASE("mpi suite: asynchronous forms") { checked_and_unchecked([](auto& c) { suite::asynchronous(c); }); }
TEST_CASE("mpi suite: split") { checked_and_unchecked([](auto& c) { suite::split(c); }); }
TEST_CASE("mpi suite: bad input") { checked_and_unchecked([](auto& c) { suite::bad_input(c); }); }
TEST_CASE("mpi suite: fp16/bf16 avg does not overflow") {
  checked_and_unchecked([](auto& c) { suite::average_without_overflow(c); });
}
TEST_CASE("mpi suite: max and min propagate NaN from any rank") {
  static_assert(trident::mpi_comm::max_min_nan == trident::nan_in_max_min::propagate);
  checked_and_unchecked([](auto& c) { suite::max_min_with_nan(c); });
}
TEST_CASE("mpi suite: traffic counts calls and payload bytes per kind") {
  checked_and_unchecked([](auto& c) { suite::traffic(c); });
}
TEST_CASE("mpi suite: process grid, every factorisation of the world") {
  checked_and_unchecked([](auto& c) { suite::grid(c); });
}
TEST_CASE("mpi suite: mismatched calls are detected on every rank (check_arguments on)") {
  const bool before = world().check_arguments();
  world().check_arguments(true);
  suite::mismatched_counts(world());
  world().check_arguments(before);
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
