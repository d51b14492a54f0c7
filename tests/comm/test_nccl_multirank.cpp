// The NCCL communicator across two ranks (processes) under mpirun, both on GPU 0: each rank
// claims a host of its own (nccl_options::host_id_per_rank sets NCCL_HOSTID), so NCCL accepts
// them on one GPU and talks between them over its socket transport (slow, but real NCCL).
// The unique id is bootstrapped over MPI. Without a GPU every rank exits 77 (skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "comm/collective_suite.hpp"
#include "comm/grid_suite.hpp"
#include "support/nccl_mpi_main.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/core/buffer.hpp"

namespace {

using trident::cuda_space;
using trident::reduce_op;

std::optional<trident::nccl_comm> world;  // made in main, before the tests, after MPI_Init

trident::nccl_comm& comm() { return *world; }

template <class T>
trident::buffer<T, cuda_space> upload(const std::vector<T>& host) {
  trident::buffer<T, cuda_space> b(host.size());
  if (!host.empty()) trident::copy(std::span<const T>(host), b);
  return b;
}

template <class T>
std::vector<T> download(const trident::buffer<T, cuda_space>& b) {
  comm().synchronize();
  return trident::to_vector(b);
}

}  // namespace

TEST_CASE("two ranks: bootstrapped over MPI, one communicator with the MPI ranks") {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(comm().rank() == rank);
  CHECK(comm().size() == size);
  CHECK(comm().device() == 0);
  const char* host_id = std::getenv("NCCL_HOSTID");
  REQUIRE(host_id != nullptr);
  CHECK(std::string(host_id).starts_with("trident-"));
  comm().barrier();
}

TEST_CASE("two ranks: the shared backend suite") {
  SUBCASE("all_reduce") { suite::all_reduce(comm()); }
  SUBCASE("all_reduce_large") { suite::all_reduce_large(comm()); }
  SUBCASE("deterministic") { suite::deterministic(comm()); }
  SUBCASE("reduce_scatter") { suite::reduce_scatter(comm()); }
  SUBCASE("all_gather") { suite::all_gather(comm()); }
  SUBCASE("broadcast") { suite::broadcast(comm()); }
  SUBCASE("reduce") { suite::reduce(comm()); }
  SUBCASE("all_to_all") { suite::all_to_all(comm()); }
  SUBCASE("point_to_point") { suite::point_to_point(comm()); }
  SUBCASE("asynchronous") { suite::asynchronous(comm()); }
  SUBCASE("split") { suite::split(comm()); }
  SUBCASE("traffic") { suite::traffic(comm()); }
  SUBCASE("bad_input") { suite::bad_input(comm()); }
  SUBCASE("average_without_overflow") { suite::average_without_overflow(comm()); }
  // NCCL drops a NaN that not every rank holds (fmaxf), where the host backends propagate it.
  SUBCASE("max_min_drop_nan_unless_on_every_rank") {
    static_assert(trident::nccl_comm::max_min_nan == trident::nan_in_max_min::drop);
    suite::max_min_with_nan(comm());
  }
  SUBCASE("process_grid") { suite::grid(comm()); }
}

TEST_CASE("two ranks: large collectives (about 10M elements) against a host reference") {
  auto& c = comm();
  const int n = c.size();
  const int me = c.rank();
  const std::size_t chunk = 5'000'011;
  const std::size_t count = chunk * static_cast<std::size_t>(n);
  // Rank r's element i: small integers, exact in float whatever the order of summation.
  const auto value = [](int r, std::size_t i) {
    return static_cast<float>(static_cast<int>((i * 13 + static_cast<std::size_t>(r) * 7) % 9) - 4);
  };
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = value(me, i);
  auto in = upload(mine);

  trident::buffer<float, cuda_space> scattered(chunk);
  c.reduce_scatter(in, scattered, reduce_op::max);
  auto got = download(scattered);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < chunk; ++i) {
    float want = value(0, static_cast<std::size_t>(me) * chunk + i);
    for (int r = 1; r < n; ++r) want = std::max(want, value(r, static_cast<std::size_t>(me) * chunk + i));
    if (got[i] != want) ++bad;
  }
  CHECK(bad == 0);

  trident::buffer<float, cuda_space> gathered(count);
  c.all_gather(scattered, gathered);
  const auto all = download(gathered);
  bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    float want = value(0, i);
    for (int r = 1; r < n; ++r) want = std::max(want, value(r, i));
    if (all[i] != want) ++bad;
  }
  CHECK(bad == 0);

  trident::buffer<float, cuda_space> exchanged(count);
  c.all_to_all(in, exchanged);
  got = download(exchanged);
  bad = 0;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < chunk; ++i)
      if (got[static_cast<std::size_t>(r) * chunk + i] != value(r, static_cast<std::size_t>(me) * chunk + i)) ++bad;
  CHECK(bad == 0);

  trident::buffer<float, cuda_space> summed(me == n - 1 ? count : 0);
  c.reduce(in, summed, n - 1, reduce_op::sum);
  if (me == n - 1) {
    got = download(summed);
    bad = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i);
      if (got[i] != want) ++bad;
    }
    CHECK(bad == 0);
  }

  c.broadcast(in, 0);
  got = download(in);
  bad = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (got[i] != value(0, i)) ++bad;
  CHECK(bad == 0);
}

TEST_CASE("two ranks: a ring exchange, synchronous and asynchronous") {
  auto& c = comm();
  const int n = c.size();
  const int me = c.rank();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  using op = trident::p2p_op<cuda_space>;
  auto token = upload(std::vector<std::int64_t>(1 << 20, me));
  trident::buffer<std::int64_t, cuda_space> incoming(1 << 20);
  // Pass the token around the whole ring: after n steps it is back home.
  for (int step = 0; step < n; ++step) {
    c.exchange({op::send(token, next), op::recv(incoming, prev)});
    std::swap(token, incoming);
    c.synchronize();
    // After step + 1 shifts the token here started on the rank step + 1 places before this one.
    CHECK(trident::to_vector(token)[12345] == (me - (step + 1) + 2 * n) % n);
  }
  auto r = c.exchange_async({op::send(token, next), op::recv(incoming, prev)});
  r.wait();
  CHECK(trident::to_vector(incoming).back() == prev);
}

TEST_CASE("two ranks: host memory is refused alike on every rank, and the communicator goes on") {
  std::vector<float> host(4, 1.0f);
  CHECK_THROWS_WITH_AS(comm().all_reduce(trident::space_span<float, cuda_space>(host.data(), host.size())),
                       doctest::Contains("send buffer is host memory"), trident::usage_error);
  auto ok = upload(std::vector<float>(4, 1.0f));
  comm().all_reduce(ok, reduce_op::avg);
  CHECK(download(ok) == std::vector<float>(4, 1.0f));
}

TEST_CASE("two ranks: a split per rank, and a split into one group again") {
  auto& c = comm();
  auto alone = c.split(c.rank(), 0);
  CHECK(alone.size() == 1);
  CHECK(alone.rank() == 0);
  auto x = upload(std::vector<std::int32_t>{c.rank() + 1});
  alone.all_reduce(x);
  alone.synchronize();
  CHECK(trident::to_vector(x)[0] == c.rank() + 1);
  auto together = c.split(0, -c.rank());  // reversed
  CHECK(together.size() == c.size());
  CHECK(together.rank() == c.size() - 1 - c.rank());
  together.all_reduce(x);
  together.synchronize();
  CHECK(trident::to_vector(x)[0] == c.size() * (c.size() + 1) / 2);
}

// Last (doctest runs test cases in file order): it leaves a communicator aborted on purpose.
TEST_CASE("two ranks: a collective that a peer never joins times out and aborts instead of hanging") {
  auto lonely = trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(3),
                                                              .host_id_per_rank = true});
  auto x = upload(std::vector<float>(1024, 1.0f));
  lonely.barrier();  // connected and working
  if (lonely.rank() == 0) {
    const auto started = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(
        {
          lonely.all_reduce(x);  // rank 1 never calls it
          lonely.synchronize();
        },
        trident::nccl_error);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
    CHECK(lonely.native() == nullptr);
    CHECK_THROWS_WITH_AS(lonely.all_reduce(x), doctest::Contains("aborted"), trident::usage_error);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Rank 1 destroys its half of the communicator: finalize cannot complete with rank 0 gone, so
  // the destructor aborts after the timeout rather than hanging.
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
