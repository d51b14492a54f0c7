#include <doctest/doctest.h>

#include <barrier>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"

using trident::buffer;
using trident::mem_category;
using trident::memory_ledger;
using trident::space_kind;

namespace {

std::shared_ptr<memory_ledger> fresh_ledger(const char* label = "test") { return std::make_shared<memory_ledger>(label); }

// A memory space defined outside the library: counts its allocations. Shows how a type opts in.
struct counting_space {
  static constexpr space_kind kind = space_kind::host;
  static constexpr std::string_view name = "counting";
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool available = true;
  static inline int live = 0;
  static void* allocate(std::size_t bytes) {
    ++live;
    return trident::host_space::allocate(bytes);
  }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    --live;
    trident::host_space::deallocate(p, bytes);
  }
};

template <class B>
concept has_span = requires(B& b) { b.span(); };

}  // namespace

TEST_CASE("a buffer is move-only and its handle is trivially copyable") {
  static_assert(!std::is_copy_constructible_v<buffer<float>>);
  static_assert(!std::is_copy_assignable_v<buffer<float>>);
  static_assert(std::is_nothrow_move_constructible_v<buffer<float>>);
  static_assert(std::is_nothrow_move_assignable_v<buffer<float>>);
  static_assert(std::is_trivially_copyable_v<trident::device_span<trident::bf16>>);
  static_assert(trident::memory_space<counting_space>);
  static_assert(!trident::memory_space<int>);
  // Only host-accessible spaces offer std::span views: device memory cannot be touched by the host.
  static_assert(has_span<buffer<float, trident::host_space>>);
  static_assert(has_span<buffer<float, trident::pinned_host_space>>);
  static_assert(!has_span<buffer<float, trident::cuda_space>>);
  CHECK(true);
}

TEST_CASE("zero elements are allowed: no memory, no charge") {
  auto ledger = fresh_ledger();
  buffer<float> empty(0, mem_category::parameters, ledger);
  CHECK(empty.empty());
  CHECK(empty.data() == nullptr);
  CHECK(empty.size_bytes() == 0);
  CHECK(empty.span().empty());
  CHECK(ledger->bytes(space_kind::host) == 0);
  CHECK(ledger->live_allocations(space_kind::host, mem_category::parameters) == 0);
  buffer<float> defaulted;
  CHECK(defaulted.empty());
  CHECK(defaulted.ledger() == nullptr);
}

TEST_CASE("every allocation is 256-byte aligned, whatever the size and type") {
  for (std::size_t n : {1u, 3u, 7u, 255u, 256u, 1000u, 4097u}) {
    buffer<std::uint8_t> bytes(n);
    buffer<double> doubles(n);
    buffer<trident::fp16> halves(n);
    CHECK(reinterpret_cast<std::uintptr_t>(bytes.data()) % trident::buffer_alignment == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(doubles.data()) % trident::buffer_alignment == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(halves.data()) % trident::buffer_alignment == 0);
  }
}

TEST_CASE("bytes are charged per space and category, and given back on destruction") {
  auto ledger = fresh_ledger("rank 0");
  {
    buffer<float> params(1000, mem_category::parameters, ledger);
    buffer<trident::bf16> grads(1000, mem_category::gradients, ledger);
    buffer<double> state(10, mem_category::optimizer_state, ledger);
    CHECK(ledger->bytes(space_kind::host, mem_category::parameters) == 4000);
    CHECK(ledger->bytes(space_kind::host, mem_category::gradients) == 2000);
    CHECK(ledger->bytes(space_kind::host, mem_category::optimizer_state) == 80);
    CHECK(ledger->bytes(space_kind::host, mem_category::activations) == 0);
    CHECK(ledger->bytes(space_kind::host) == 6080);
    CHECK(ledger->bytes(space_kind::cuda) == 0);
    CHECK(ledger->live_allocations(space_kind::host, mem_category::parameters) == 1);
    const std::string report = ledger->report();
    CHECK(report.find("rank 0") != std::string::npos);
    CHECK(report.find("parameters") != std::string::npos);
    CHECK(report.find("5.938 KiB") != std::string::npos);  // 6080 bytes in the total column
  }
  CHECK(ledger->bytes(space_kind::host) == 0);
  CHECK(ledger->live_allocations(space_kind::host, mem_category::parameters) == 0);
  CHECK(ledger->peak(space_kind::host) == 6080);
  CHECK(ledger->peak(space_kind::host, mem_category::parameters) == 4000);
  ledger->reset_peaks();
  CHECK(ledger->peak(space_kind::host) == 0);
}

TEST_CASE("peak follows the largest simultaneous holding, not the sum of all allocations") {
  auto ledger = fresh_ledger();
  for (int i = 0; i < 10; ++i) buffer<float> transient(256, mem_category::activations, ledger);
  CHECK(ledger->peak(space_kind::host, mem_category::activations) == 1024);
  CHECK(ledger->allocations(space_kind::host) == 10);  // every allocation counted, freed or not
  CHECK(ledger->allocations(space_kind::cuda) == 0);
  { buffer<float> none(0, mem_category::activations, ledger); }  // no memory: no allocation
  CHECK(ledger->allocations(space_kind::host) == 10);
  buffer<float> a(256, mem_category::activations, ledger);
  buffer<float> b(512, mem_category::activations, ledger);
  CHECK(ledger->peak(space_kind::host, mem_category::activations) == 3072);
  const auto snap = ledger->snapshot();
  CHECK(snap.of(space_kind::host, mem_category::activations) == 3072);
  CHECK(snap.total(space_kind::host) == 3072);
}

TEST_CASE("moving a buffer moves its charge; the moved-from buffer is empty") {
  auto first = fresh_ledger("first");
  auto second = fresh_ledger("second");
  buffer<int> a(100, mem_category::communication, first);
  int* const data = a.data();
  buffer<int> b = std::move(a);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  CHECK(a.data() == nullptr);
  CHECK(b.data() == data);
  CHECK(first->bytes(space_kind::host, mem_category::communication) == 400);

  buffer<int> c(10, mem_category::other, second);
  c = std::move(b);  // c's old bytes go back to `second`, b's stay charged to `first`
  CHECK(second->bytes(space_kind::host) == 0);
  CHECK(first->bytes(space_kind::host) == 400);
  CHECK(c.category() == mem_category::communication);
  CHECK(c.ledger() == first);

  auto& alias = c;
  c = std::move(alias);  // self-move keeps the buffer
  CHECK(c.size() == 100);
  c = buffer<int>{};
  CHECK(first->bytes(space_kind::host) == 0);
}

TEST_CASE("scoped_ledger makes a ledger current for a scope, nests, and restores") {
  auto outer = fresh_ledger("outer");
  auto inner = fresh_ledger("inner");
  const auto before = trident::current_ledger();
  CHECK(before == trident::process_ledger());
  {
    trident::scoped_ledger use_outer{outer};
    buffer<float> x(8);
    {
      trident::scoped_ledger use_inner{inner};
      buffer<float> y(16);
      CHECK(inner->bytes(space_kind::host) == 64);
      CHECK(x.ledger() == outer);
    }
    CHECK(trident::current_ledger() == outer);
    CHECK(outer->bytes(space_kind::host) == 32);
  }
  CHECK(trident::current_ledger() == before);
}

TEST_CASE("a buffer freed on another thread gives its bytes back to the ledger it was charged to") {
  auto ledger = fresh_ledger();
  buffer<float> x;
  {
    trident::scoped_ledger use{ledger};
    x = buffer<float>(1 << 10, mem_category::parameters);
  }
  std::thread([moved = std::move(x)]() mutable { moved = buffer<float>{}; }).join();
  CHECK(ledger->bytes(space_kind::host) == 0);
  CHECK(ledger->live_allocations(space_kind::host, mem_category::parameters) == 0);
}

TEST_CASE("a ledger shared by many threads counts exactly") {
  auto ledger = fresh_ledger();
  constexpr int threads_count = 8;
  constexpr int per_thread = 500;
  std::barrier sync(threads_count + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t) {
    threads.emplace_back([&ledger, &sync, t] {
      std::vector<buffer<std::uint8_t>> held;
      for (int i = 0; i < per_thread; ++i) held.emplace_back(static_cast<std::size_t>(t + 1), mem_category::other, ledger);
      held.resize(per_thread / 2);  // free half, keep half
      sync.arrive_and_wait();       // the main thread counts now
      sync.arrive_and_wait();       // then everything is freed
    });
  }
  sync.arrive_and_wait();
  std::size_t expected = 0;
  for (int t = 0; t < threads_count; ++t) expected += static_cast<std::size_t>(t + 1) * (per_thread / 2);
  CHECK(ledger->bytes(space_kind::host, mem_category::other) == expected);
  CHECK(ledger->live_allocations(space_kind::host, mem_category::other) == threads_count * per_thread / 2);
  sync.arrive_and_wait();
  for (auto& t : threads) t.join();
  CHECK(ledger->bytes(space_kind::host) == 0);
  CHECK(ledger->live_allocations(space_kind::host, mem_category::other) == 0);
}

TEST_CASE("copy moves elements between buffers and spans, and rejects mismatched sizes") {
  buffer<float> a(5);
  std::iota(a.span().begin(), a.span().end(), 1.0f);
  buffer<float> b(5);
  trident::copy(a, b);
  CHECK(trident::to_vector(b) == std::vector<float>{1, 2, 3, 4, 5});

  std::vector<float> host(5, 0.0f);
  trident::copy(b, host);
  CHECK(host == std::vector<float>{1, 2, 3, 4, 5});
  const std::vector<float> source{9, 8, 7, 6, 5};
  trident::copy(source, b);
  CHECK(b[0] == 9.0f);
  CHECK(b[4] == 5.0f);

  trident::fill_zero(b);
  CHECK(trident::to_vector(b) == std::vector<float>(5, 0.0f));

  buffer<float> wrong(4);
  try {
    trident::copy(a, wrong);
    FAIL("copy of mismatched sizes did not throw");
  } catch (const trident::usage_error& e) {
    CHECK(std::string(e.what()).find("source has 5 elements, destination 4") != std::string::npos);
  }
}

TEST_CASE("a byte count that overflows size_t is a usage_error, not a tiny allocation") {
  const std::size_t too_many = std::numeric_limits<std::size_t>::max() / 4;
  CHECK_THROWS_AS(buffer<double>{too_many}, trident::usage_error);
  CHECK_THROWS_AS(buffer<float>(16, mem_category::other, nullptr), trident::usage_error);
}

TEST_CASE("a space defined outside the library works with buffer") {
  auto ledger = fresh_ledger();
  {
    buffer<float, counting_space> x(64, mem_category::activations, ledger);
    CHECK(counting_space::live == 1);
    CHECK(reinterpret_cast<std::uintptr_t>(x.data()) % trident::buffer_alignment == 0);
    x.span()[63] = 1.0f;
    CHECK(ledger->bytes(space_kind::host, mem_category::activations) == 256);
  }
  CHECK(counting_space::live == 0);
}

TEST_CASE("device_span views, subspans and converts to const") {
  buffer<int> x(10);
  std::iota(x.span().begin(), x.span().end(), 0);
  trident::device_span<int> all = x.device_handle();
  trident::device_span<const int> tail = all.subspan(7, 3);
  CHECK(tail.size() == 3);
  CHECK(tail[0] == 7);
  int sum = 0;
  for (int v : tail) sum += v;
  CHECK(sum == 7 + 8 + 9);
}

#include "trident/core/space_span.hpp"

TEST_CASE("space_span: a host-accessible one is a std::span, and copy works between any spans") {
  trident::buffer<float> b(5, trident::mem_category::other);
  for (std::size_t i = 0; i < 5; ++i) b.data()[i] = static_cast<float>(i);
  const trident::space_span<const float, trident::host_space> view(b);
  const std::span<const float> plain = view;  // what nn:: layers and host optimizers take
  CHECK(plain.size() == 5);
  CHECK(plain[4] == 4.0f);
  CHECK(view.host().data() == b.data());
  std::vector<float> out(5);
  trident::copy(view, trident::space_span<float, trident::host_space>(out));
  CHECK(out == std::vector<float>{0, 1, 2, 3, 4});
  std::vector<float> small(4);
  CHECK_THROWS_WITH_AS(trident::copy(view, trident::space_span<float, trident::host_space>(small)),
                       doctest::Contains("source has 5 elements, destination 4"), trident::usage_error);
  static_assert(!std::is_convertible_v<trident::space_span<float, trident::cuda_space>, std::span<float>>,
                "device memory must not pass for a host span");
}
