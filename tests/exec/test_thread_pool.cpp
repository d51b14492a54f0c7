// exec/thread_pool.hpp: every task runs exactly once, errors come back, and several callers
// (thread ranks each stepping an optimizer) share the pool without waiting on each other forever.
#include <doctest/doctest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "trident/exec/thread_pool.hpp"

TEST_CASE("thread_pool: every task once, on any number of workers") {
  for (unsigned workers : {0u, 1u, 3u}) {
    trident::thread_pool pool(workers);
    CHECK(pool.concurrency() == workers + 1);
    for (std::size_t tasks : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.parallel_for(tasks, [&](std::size_t i) { hits[i].fetch_add(1); });
      int wrong = 0;
      for (auto& h : hits) wrong += h.load() != 1;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("thread_pool: the first exception is rethrown after every task has run") {
  trident::thread_pool pool(2);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(pool.parallel_for(50,
                                         [&](std::size_t i) {
                                           ++ran;
                                           if (i % 10 == 3) throw std::runtime_error("task failed");
                                         }),
                       "task failed", std::runtime_error);
  CHECK(ran == 50);
  pool.parallel_for(4, [&](std::size_t) { ++ran; });  // still usable
  CHECK(ran == 54);
}

TEST_CASE("thread_pool: many callers at once, each making progress on its own job") {
  trident::thread_pool pool(2);
  constexpr int callers = 6, jobs = 200;
  std::vector<long long> sums(callers);
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      for (int j = 0; j < jobs; ++j) {
        std::vector<long long> part(16);
        pool.parallel_for(part.size(), [&](std::size_t i) { part[i] = static_cast<long long>(i) + c; });
        sums[static_cast<std::size_t>(c)] += std::accumulate(part.begin(), part.end(), 0LL);
      }
    });
  for (auto& t : threads) t.join();
  for (int c = 0; c < callers; ++c) CHECK(sums[static_cast<std::size_t>(c)] == jobs * (120LL + 16LL * c));
  CHECK(&trident::thread_pool::shared() == &trident::thread_pool::shared());
}
