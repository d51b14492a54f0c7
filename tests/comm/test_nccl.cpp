// The NCCL communicator with one rank on one GPU (skipped, exit 77, without a device): every
// collective x element type x reduction at sizes 0, 1, 7 and about 10M against a host reference,
// the shared backend suite, asynchronous requests, the memory checks and the timeout path.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/collective_suite.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/core/buffer.hpp"

namespace {

using trident::cuda_space;
using trident::reduce_op;

trident::nccl_comm one_rank(trident::nccl_options options = {}) {
  ncclUniqueId id;
  TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
  return trident::nccl_comm::init(id, 0, 1, options);
}

template <class T>
std::vector<T> pattern(std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_unsigned_v<T>) {
      v[i] = static_cast<T>(i % 251);
    } else if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(static_cast<long long>(i % 200) - 100);
    } else {
      v[i] = T(static_cast<float>(static_cast<long long>(i % 200) - 100));  // exact in fp16 and bf16
    }
  }
  return v;
}

constexpr std::size_t guard = 64;         // elements after the result that must stay untouched
constexpr unsigned char sentinel = 0x5a;  // their bytes

template <class T>
trident::buffer<T, cuda_space> guarded(std::size_t count) {
  trident::buffer<T, cuda_space> b(count + guard);
  TRIDENT_CUDA_CHECK(cudaMemset(b.data(), sentinel, b.size_bytes()));
  return b;
}

// The first `count` elements equal `want` bit for bit; the guard is intact.
template <class T>
bool result_is(trident::nccl_comm& comm, const trident::buffer<T, cuda_space>& out, const std::vector<T>& want) {
  comm.synchronize();
  const auto got = trident::to_vector(out);
  const bool same = want.empty() || std::memcmp(got.data(), want.data(), want.size() * sizeof(T)) == 0;
  const auto* tail = reinterpret_cast<const unsigned char*>(got.data() + want.size());
  bool intact = true;
  for (std::size_t b = 0; b < guard * sizeof(T); ++b) intact = intact && tail[b] == sentinel;
  if (!same) {
    std::size_t i = 0;
    while (i < want.size() && std::memcmp(&got[i], &want[i], sizeof(T)) == 0) ++i;
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < want.size(); ++j) wrong += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
    MESSAGE("first difference at element ", i, " of ", want.size(), ": got ", static_cast<double>(got[i]), ", want ",
            static_cast<double>(want[i]), "; ", wrong, " elements differ");
  }
  if (!intact) MESSAGE("the guard after the result was overwritten");
  return same && intact;
}

template <class T>
trident::buffer<T, cuda_space> upload(const std::vector<T>& host) {
  trident::buffer<T, cuda_space> b(host.size());
  if (!host.empty()) trident::copy(std::span<const T>(host), b);
  return b;
}

void CUDART_CB sleep_one_second(void*) { std::this_thread::sleep_for(std::chrono::seconds(1)); }

}  // namespace

TEST_CASE_TEMPLATE("one rank: every collective x op at sizes 0, 1, 7 and 10M equals the host reference", T, float,
                   double, trident::fp16, trident::bf16, std::int32_t, std::int64_t, std::uint8_t) {
  auto comm = one_rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{10'000'019}}) {
    const auto host = pattern<T>(count);
    auto in = upload(host);
    // With one rank every reduction of x is x (avg: NCCL multiplies by 1/1, exactly).
    for (reduce_op op : suite::all_ops) {
      INFO(std::string(trident::name_of(trident::dtype_of<T>)), " ", std::string(trident::name_of(op)), " count ", count);
      auto out = guarded<T>(count);
      comm.all_reduce(in, trident::space_span<T, cuda_space>(out.data(), count), op);
      CHECK(result_is(comm, out, host));
      out = guarded<T>(count);
      comm.reduce_scatter(in, trident::space_span<T, cuda_space>(out.data(), count), op);
      CHECK(result_is(comm, out, host));
      out = guarded<T>(count);
      comm.reduce(in, trident::space_span<T, cuda_space>(out.data(), count), 0, op);
      CHECK(result_is(comm, out, host));
    }
    INFO(trident::name_of(trident::dtype_of<T>), " count ", count);
    auto out = guarded<T>(count);
    comm.all_gather(in, trident::space_span<T, cuda_space>(out.data(), count));
    CHECK(result_is(comm, out, host));
    out = guarded<T>(count);
    comm.all_to_all(in, trident::space_span<T, cuda_space>(out.data(), count));
    CHECK(result_is(comm, out, host));
    out = guarded<T>(count);
    if (count > 0) TRIDENT_CUDA_CHECK(cudaMemcpy(out.data(), in.data(), in.size_bytes(), cudaMemcpyDeviceToDevice));
    comm.broadcast(trident::space_span<T, cuda_space>(out.data(), count), 0);
    CHECK(result_is(comm, out, host));
    // The send buffer of every collective is untouched.
    CHECK(trident::to_vector(in) == host);
  }
}

TEST_CASE("one rank: the shared backend suite") {
  auto comm = one_rank();
  SUBCASE("all_reduce") { suite::all_reduce(comm); }
  SUBCASE("all_reduce_large") { suite::all_reduce_large(comm); }
  SUBCASE("deterministic") { suite::deterministic(comm); }
  SUBCASE("reduce_scatter") { suite::reduce_scatter(comm); }
  SUBCASE("all_gather") { suite::all_gather(comm); }
  SUBCASE("broadcast") { suite::broadcast(comm); }
  SUBCASE("reduce") { suite::reduce(comm); }
  SUBCASE("all_to_all") { suite::all_to_all(comm); }
  SUBCASE("point_to_point") { suite::point_to_point(comm); }
  SUBCASE("asynchronous") { suite::asynchronous(comm); }
  SUBCASE("split") { suite::split(comm); }
  SUBCASE("traffic") { suite::traffic(comm); }
  SUBCASE("bad_input") { suite::bad_input(comm); }
  SUBCASE("average_without_overflow") { suite::average_without_overflow(comm); }
  // One rank holding NaN is every rank holding it: NaN stays, as on the host backends.
  SUBCASE("max_min_with_nan") { suite::max_min_with_nan(comm); }
}

TEST_CASE("one rank: what the communicator reports about itself") {
  int device = -1;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
  auto comm = one_rank();
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.device() == device);
  CHECK(comm.native() != nullptr);
  CHECK(comm.stream() != nullptr);
  int nccl_count = 0;
  TRIDENT_NCCL_CHECK(ncclCommCount(comm.native(), &nccl_count));
  CHECK(nccl_count == 1);
  comm.barrier();
  comm.synchronize();
}

TEST_CASE("one rank: a stream given in the options is used and not destroyed") {
  cudaStream_t mine = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  {
    auto comm = one_rank({.stream = mine});
    CHECK(comm.stream() == mine);
    auto child = comm.split(0, 0);
    CHECK(child.stream() == mine);
    auto x = upload(std::vector<float>{1.0f, 2.0f});
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());  // upload ran on the legacy stream; `mine` does not wait for it
    comm.all_reduce(x);
    comm.synchronize();
    CHECK(trident::to_vector(x) == std::vector<float>{1.0f, 2.0f});
  }
  CHECK(cudaStreamQuery(mine) == cudaSuccess);  // still a valid stream
  TRIDENT_CUDA_CHECK(cudaStreamDestroy(mine));
}

TEST_CASE("one rank: host memory is a usage_error naming the collective and the buffer") {
  auto comm = one_rank();
  std::vector<float> host(8, 1.0f);
  trident::space_span<float, cuda_space> fake(host.data(), host.size());
  trident::buffer<float, cuda_space> device(8);
  CHECK_THROWS_WITH_AS(comm.all_reduce(fake),
                       doctest::Contains("all_reduce: send buffer is host memory; the NCCL backend needs device memory "
                                         "(cuda_space)"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.all_gather(device, fake), doctest::Contains("all_gather: receive buffer is host memory"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS((void)comm.broadcast_async(fake, 0), doctest::Contains("broadcast: send buffer is host memory"),
                       trident::usage_error);
  using op = trident::p2p_op<cuda_space>;
  CHECK_THROWS_WITH_AS(comm.exchange({op::send(fake, 0), op::recv(device, 0)}),
                       doctest::Contains("send buffer is host memory"), trident::usage_error);

  trident::buffer<float, trident::pinned_host_space> pinned(8);
  CHECK_THROWS_WITH_AS(comm.all_reduce(trident::space_span<float, cuda_space>(pinned.data(), 8)),
                       doctest::Contains("pinned host memory"), trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.all_reduce(trident::space_span<float, cuda_space>(nullptr, 8)),
                       doctest::Contains("null but has 8 elements"), trident::usage_error);

  // Managed memory is device-accessible: accepted.
  float* managed = nullptr;
  TRIDENT_CUDA_CHECK(cudaMallocManaged(&managed, 8 * sizeof(float)));
  for (int i = 0; i < 8; ++i) managed[i] = static_cast<float>(i);
  comm.all_reduce(trident::space_span<float, cuda_space>(managed, 8), reduce_op::max);
  comm.synchronize();
  CHECK(managed[7] == 7.0f);
  TRIDENT_CUDA_CHECK(cudaFree(managed));

  // The communicator is still usable after the refusals.
  auto ok = upload(std::vector<float>(3, 2.0f));
  comm.all_reduce(ok);
  comm.synchronize();
  CHECK(trident::to_vector(ok) == std::vector<float>(3, 2.0f));
}

TEST_CASE("one rank: zero elements are a no-op, even without memory") {
  auto comm = one_rank();
  trident::space_span<float, cuda_space> none;
  comm.all_reduce(none);
  comm.all_gather(none, none);
  comm.reduce_scatter(none, none);
  comm.broadcast(none, 0);
  comm.all_to_all(none, none);
  using op = trident::p2p_op<cuda_space>;
  comm.exchange({op::send(none, 0), op::recv(none, 0)});
  auto r = comm.all_reduce_async(none);
  r.wait();
  CHECK(r.test());
  comm.synchronize();
}

TEST_CASE("one rank: requests complete, test() polls, waiting twice is harmless, moving is fine") {
  auto comm = one_rank();
  auto x = upload(pattern<float>(1 << 22));
  auto r = comm.all_reduce_async(x, reduce_op::sum);
  while (!r.test()) std::this_thread::yield();
  r.wait();  // already complete: returns at once
  CHECK(r.test());
  auto moved = comm.all_reduce_async(x, reduce_op::max);
  trident::nccl_comm::request other = std::move(moved);
  other.wait();
  {
    auto forgotten = comm.all_reduce_async(x, reduce_op::min);  // the destructor waits
  }
  CHECK(trident::to_vector(x) == pattern<float>(1 << 22));
  // A request outlives its communicator.
  trident::nccl_comm::request late;
  {
    auto short_lived = one_rank();
    late = short_lived.all_reduce_async(x);
  }
  late.wait();
}

TEST_CASE("one rank: a wait longer than the timeout aborts the communicator and throws") {
  auto comm = one_rank({.timeout = std::chrono::milliseconds(300)});
  auto x = upload(std::vector<float>(16, 1.0f));
  comm.all_reduce(x);
  // Something that holds the stream for a second: here a host callback, in real life a peer that
  // never joins the collective.
  TRIDENT_CUDA_CHECK(cudaLaunchHostFunc(comm.stream(), sleep_one_second, nullptr));
  CHECK_THROWS_WITH_AS(comm.synchronize(), doctest::Contains("did not complete within 300 ms"), trident::nccl_error);
  CHECK(comm.native() == nullptr);
  CHECK_THROWS_WITH_AS(comm.all_reduce(x), doctest::Contains("aborted"), trident::usage_error);
  CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("timed out after 300 ms"), trident::usage_error);
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("one rank: a request's wait has the same timeout") {
  auto comm = one_rank({.timeout = std::chrono::milliseconds(200)});
  auto x = upload(std::vector<float>(16, 1.0f));
  TRIDENT_CUDA_CHECK(cudaLaunchHostFunc(comm.stream(), sleep_one_second, nullptr));
  // In place, sum, one rank: NCCL enqueues no kernel that could run after the abort freed the
  // communicator; the request's event is what waits behind the callback.
  auto r = comm.all_reduce_async(x);
  CHECK_FALSE(r.test());
  CHECK_THROWS_AS(r.wait(), trident::nccl_error);
  r.wait();  // reported once
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("one rank: split, and its argument checks") {
  auto comm = one_rank();
  CHECK_THROWS_WITH_AS((void)comm.split(-1, 0), doctest::Contains("colour -1"), trident::usage_error);
  auto part = comm.split(3, 0);
  CHECK(part.size() == 1);
  CHECK(part.rank() == 0);
  CHECK(part.native() != comm.native());
  CHECK(part.stream() != comm.stream());
  auto x = upload(std::vector<std::int64_t>{5});
  part.all_reduce(x);
  part.synchronize();
  CHECK(trident::to_vector(x) == std::vector<std::int64_t>{5});
}

TEST_CASE("one rank: a moved-from communicator says so") {
  auto comm = one_rank();
  auto moved = std::move(comm);
  CHECK(moved.native() != nullptr);
  CHECK(comm.native() == nullptr);  // NOLINT(bugprone-use-after-move): the point of the test
  CHECK_THROWS_WITH_AS(comm.synchronize(), doctest::Contains("moved from"), trident::usage_error);
  moved.barrier();
}

TEST_CASE("select_device picks local_rank modulo the device count") {
  int count = 0;
  TRIDENT_CUDA_CHECK(cudaGetDeviceCount(&count));
  trident::launch_env env;
  env.local_rank = count;  // wraps around to device 0
  env.local_size = count + 1;
  env.size = count + 1;
  CHECK(trident::select_device(env) == 0);
  int current = -1;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&current));
  CHECK(current == 0);
}
