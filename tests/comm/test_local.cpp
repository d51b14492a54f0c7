// The thread backend: the shared suite on n = 1..8 ranks, then what is specific to threads
// (failure propagation, timeouts, detection of mismatched calls, results returned by run()).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;

namespace {

// Every behaviour of the suite on every group size 1..8 (3, 5, 6 and 7 do not divide evenly).
template <class Body>
void on_every_size(Body body) {
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    local_world::run(n, [&](local_comm& comm) { body(comm); });
  }
}

}  // namespace

TEST_CASE("local: all_reduce, every type x op x size") { on_every_size([](auto& c) { suite::all_reduce(c); }); }
TEST_CASE("local: all_reduce of 10M floats") {
  for (int n : {1, 3, 8}) local_world::run(n, [](auto& c) { suite::all_reduce_large(c); });
}
TEST_CASE("local: results identical on every rank and run to run") { on_every_size([](auto& c) { suite::deterministic(c); }); }
// ZeRO's stages agree bit for bit only because a reduce-scatter sums each element in the same
// order as the all-reduce of the same count: for the one-step algorithm (small) and the ring.
TEST_CASE("local: all_reduce equals reduce_scatter + all_gather bit for bit, small and large, fp32 and bf16") {
  on_every_size([](local_comm& comm) {
    const auto n = static_cast<std::size_t>(comm.size());
    for (std::size_t chunk : {std::size_t{3}, std::size_t{700}}) {
      const std::size_t count = chunk * n;
      std::vector<float> x(count);
      std::uint64_t state = 0x2545f4914f6cdd1dull * static_cast<std::uint64_t>(comm.rank() + 7);
      for (auto& v : x) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5);
      }
      std::vector<trident::bf16> h(x.begin(), x.end());
      auto check = [&](auto values) {
        using T = typename decltype(values)::value_type;
        auto whole = values;
        comm.all_reduce(whole, trident::reduce_op::sum);
        std::vector<T> mine(chunk), gathered(count);
        comm.reduce_scatter(values, mine, trident::reduce_op::sum);
        comm.all_gather(mine, gathered);
        CAPTURE(chunk);
        CHECK(std::memcmp(whole.data(), gathered.data(), count * sizeof(T)) == 0);
      };
      check(x);
      check(h);
    }
  });
}
// After a yield lost the core to another process, waits skip the spin and sleep at once; that
// path must read the same data as the spinning one. (A missed wake-up would only cost a sleep of
// at most 2 ms, so this checks results, not speed: bench/contention.sh measures that.)
TEST_CASE("local: spinning stops for a while after a yield lost the core, and waits that sleep at once stay right") {
  using trident::detail::local_spinning;
  const auto t = std::chrono::steady_clock::now();
  local_spinning fresh;
  CHECK(fresh.budget(t) == trident::detail::local_spin);
  fresh.lost_core(t);
  CHECK(fresh.budget(t + std::chrono::milliseconds(1)) == std::chrono::nanoseconds(0));
  CHECK(fresh.budget(t + trident::detail::local_spin_pause + std::chrono::microseconds(1)) == trident::detail::local_spin);

  auto& shared = local_spinning::instance();
  for (int n : {2, 3, 8}) {
    CAPTURE(n);
    local_world::run(n, [&](local_comm& comm) {
      for (int round = 0; round < 300; ++round) {
        if (comm.rank() == 0 && round % 16 == 0) shared.lost_core(std::chrono::steady_clock::now());
        const std::size_t count = round % 2 ? 5 : 3000;  // the one-step path and the ring
        std::vector<double> x(count, static_cast<double>(comm.rank() + round));
        comm.all_reduce(x);
        const double want = static_cast<double>(n) * round + n * (n - 1) / 2.0;
        CHECK(x.front() == want);
        CHECK(x.back() == want);
      }
    });
  }
}
TEST_CASE("local: reduce_scatter") { on_every_size([](auto& c) { suite::reduce_scatter(c); }); }
TEST_CASE("local: all_gather") { on_every_size([](auto& c) { suite::all_gather(c); }); }
TEST_CASE("local: broadcast") { on_every_size([](auto& c) { suite::broadcast(c); }); }
TEST_CASE("local: reduce") { on_every_size([](auto& c) { suite::reduce(c); }); }
TEST_CASE("local: all_to_all") { on_every_size([](auto& c) { suite::all_to_all(c); }); }
TEST_CASE("local: point to point") { on_every_size([](auto& c) { suite::point_to_point(c); }); }
TEST_CASE("local: asynchronous forms") { on_every_size([](auto& c) { suite::asynchronous(c); }); }
TEST_CASE("local: split") { on_every_size([](auto& c) { suite::split(c); }); }
TEST_CASE("local: bad input") { on_every_size([](auto& c) { suite::bad_input(c); }); }
TEST_CASE("local: mismatched calls are detected on every rank") { on_every_size([](auto& c) { suite::mismatched_counts(c); }); }
TEST_CASE("local: fp16/bf16 avg does not overflow") { on_every_size([](auto& c) { suite::average_without_overflow(c); }); }
TEST_CASE("local: max and min propagate NaN from any rank") {
  static_assert(trident::local_comm::max_min_nan == trident::nan_in_max_min::propagate);
  on_every_size([](auto& c) { suite::max_min_with_nan(c); });
}

TEST_CASE("local: traffic counts calls and payload bytes per kind") { on_every_size([](auto& c) { suite::traffic(c); }); }

TEST_CASE("local: a rank calling a different collective is a usage_error everywhere") {
  local_world::run(3, [](local_comm& comm) {
    std::vector<float> x(4, 1.0f);
    if (comm.rank() == 2) CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("called all_reduce"), trident::usage_error);
    else CHECK_THROWS_WITH_AS(comm.all_reduce(x), doctest::Contains("called barrier"), trident::usage_error);
    comm.all_reduce(x);  // and the group goes on
    CHECK(x[0] == 3.0f);
  });
}

TEST_CASE("local: run returns each rank's result in rank order") {
  const auto ranks = local_world::run(5, [](local_comm& c) { return c.rank() * 10 + c.size(); });
  CHECK(ranks == std::vector<int>{5, 15, 25, 35, 45});
  CHECK_THROWS_AS(local_world::run(0, [](local_comm&) {}), trident::usage_error);
}

TEST_CASE("local: an exception on one rank reaches the others as an error and run rethrows it") {
  std::atomic<int> peers_failed{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    local_world::run(4, [&](local_comm& comm) {
      std::vector<float> x(1000, 1.0f);
      comm.all_reduce(x);
      if (comm.rank() == 2) throw std::runtime_error("loss is NaN at step 1");
      try {
        comm.all_reduce(x);  // rank 2 never comes: must not hang
      } catch (const trident::error& e) {
        CHECK(std::string(e.what()).find("rank 2 failed: loss is NaN at step 1") != std::string::npos);
        ++peers_failed;
        throw;
      }
    });
    FAIL("run should have rethrown rank 2's exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "loss is NaN at step 1");  // the root cause, not a peer's echo
  }
  CHECK(peers_failed == 3);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("local: when the first rank to fail only echoes another's failure (error::echo), run rethrows the other's") {
  // A collective check raises on every rank: the rank that found the problem raises the details,
  // the others an echo naming it, and an echo may abort the world first.
  try {
    local_world::run(3, [](local_comm& comm) {
      std::vector<int> bad{comm.rank() == 2 ? 1 : 0};
      comm.all_reduce(bad, trident::reduce_op::max);
      if (comm.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the echoes get there first
        throw trident::usage_error("token 300 at position 20 is outside the vocabulary [0, 256) (rank 2)");
      }
      trident::usage_error echo("rank 2 read a token outside the vocabulary");
      echo.mark_echo();
      throw echo;
    });
    FAIL("run should have rethrown");
  } catch (const trident::usage_error& e) {
    CHECK(e.message() == "token 300 at position 20 is outside the vocabulary [0, 256) (rank 2)");
    CHECK_FALSE(e.echo());
  }
  // Echoes alone: one of them is raised.
  CHECK_THROWS_WITH_AS(local_world::run(2,
                                        [](local_comm&) {
                                          trident::error echo("rank 5 failed");
                                          echo.mark_echo();
                                          throw echo;
                                        }),
                       doctest::Contains("rank 5 failed"), trident::error);
}

TEST_CASE("local: a rank that never arrives times out, naming the operation and the peer") {
  trident::local_options options;
  options.timeout = std::chrono::milliseconds(200);
  std::atomic<int> timeouts{0};
  CHECK_THROWS_AS(local_world::run(3,
                                   [&](local_comm& comm) {
                                     if (comm.rank() == 1) {
                                       std::this_thread::sleep_for(std::chrono::seconds(2));  // busy elsewhere
                                       return;
                                     }
                                     try {
                                       comm.barrier();
                                     } catch (const trident::error& e) {
                                       const std::string what = e.what();
                                       CHECK((what.find("timed out after 200 ms in barrier waiting for rank 1") != std::string::npos ||
                                              what.find("aborted because") != std::string::npos));
                                       ++timeouts;
                                       throw;
                                     }
                                   },
                                   options),
                  trident::error);
  CHECK(timeouts == 2);
}

TEST_CASE("local: p2p size mismatch is a usage_error on both sides") {
  local_world::run(2, [](local_comm& comm) {
    std::vector<float> x(comm.rank() == 0 ? 4 : 5);
    if (comm.rank() == 0) CHECK_THROWS_WITH_AS(comm.send(x, 1), doctest::Contains("matching recv expects 5"), trident::usage_error);
    else CHECK_THROWS_WITH_AS(comm.recv(x, 0), doctest::Contains("matching send has 4"), trident::usage_error);
  });
}

TEST_CASE("local: an asynchronous failure is rethrown by wait()") {
  trident::local_options options;
  options.timeout = std::chrono::milliseconds(100);
  CHECK_THROWS_AS(local_world::run(2,
                                   [](local_comm& comm) {
                                     std::vector<double> x(10, 1.0);
                                     if (comm.rank() == 0) {
                                       auto r = comm.all_reduce_async(x);  // rank 1 has returned
                                       CHECK_THROWS_WITH_AS(r.wait(), doctest::Contains("returned from its function"), trident::error);
                                       r.wait();  // a second wait is a no-op
                                     }
                                   },
                                   options),
                  trident::error);
}

TEST_CASE("local: communicators move, and scratch memory is accounted as communication") {
  auto ledger = std::make_shared<trident::memory_ledger>("test");
  local_world::run(2, [&](local_comm& comm) {
    trident::scoped_ledger use{ledger};
    local_comm moved = std::move(comm);
    CHECK(moved.size() == 2);
    std::vector<float> in(64, 1.0f), out(32);
    moved.reduce_scatter(in, out);
    CHECK(out[0] == 2.0f);
    CHECK(ledger->peak(trident::space_kind::host, trident::mem_category::communication) >= 64 * sizeof(float));
  });
}

#include "comm/grid_suite.hpp"
TEST_CASE("local: process grid, every factorisation of 1..8 ranks") { on_every_size([](auto& c) { suite::grid(c); }); }

// ---- bad input that must not crash, hang or give silently wrong results (issue 17) ----------

TEST_CASE("local: reduce_scatter into the start of its own input is an error, not wrong data") {
  // In place is this rank's chunk; rank 1 passing the start of its own send buffer used to pass
  // the overlap check (equal pointers) and peers read input that it had already overwritten.
  std::atomic<int> errors{0};
  CHECK_THROWS_AS(local_world::run(2,
                                   [&](local_comm& comm) {
                                     std::vector<float> x(8, 1.0f);
                                     try {
                                       comm.reduce_scatter(std::span<const float>(x), std::span<float>(x.data(), 4));
                                     } catch (const trident::error& e) {
                                       const std::string what = e.what();
                                       if (comm.rank() == 1) CHECK(what.find("reduce_scatter on rank 1: send and receive buffers overlap") != std::string::npos);
                                       else CHECK(what.find("rank 1 failed") != std::string::npos);
                                       ++errors;
                                       throw;
                                     }
                                   }),
                  trident::usage_error);
  CHECK(errors == 2);
  // The same call is legal on rank 0 (its chunk is the start) and stays in place there.
  local_world::run(1, [](local_comm& comm) {
    std::vector<float> x(4, 2.0f);
    comm.reduce_scatter(std::span<const float>(x), std::span<float>(x.data(), 4));
    CHECK(x[0] == 2.0f);
  });
  // all_gather's input may start where its output starts, on every rank: legal and right.
  local_world::run(3, [](local_comm& comm) {
    std::vector<float> x(6, 0.0f);
    x[0] = x[1] = static_cast<float>(comm.rank() + 1);
    comm.all_gather(std::span<const float>(x.data(), 2), std::span<float>(x));
    CHECK(x == std::vector<float>{1, 1, 2, 2, 3, 3});
  });
}

TEST_CASE("local: a rank that returns while a peer waits for it fails the peer at once") {
  // The default timeout is 300 s; the peer must not wait it out.
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> peers_failed{0};
  try {
    local_world::run(3, [&](local_comm& comm) {
      if (comm.rank() == 1) return;  // forgets the all_reduce
      std::vector<float> x(100, 1.0f);
      try {
        comm.all_reduce(x);
      } catch (const trident::error& e) {
        CHECK(std::string(e.what()).find("rank 1, which has returned from its function") != std::string::npos);
        ++peers_failed;
        throw;
      }
    });
    FAIL("run should have reported the abandoned all_reduce");
  } catch (const trident::error& e) {
    CHECK(std::string(e.what()).find("returned from its function") != std::string::npos);
  }
  CHECK(peers_failed == 2);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  // Point-to-point too: a receive from a rank that has returned.
  CHECK_THROWS_WITH_AS(local_world::run(2,
                                        [](local_comm& comm) {
                                          std::vector<float> x(4);
                                          if (comm.rank() == 0) comm.recv(x, 1);
                                        }),
                       doctest::Contains("returned from its function without sending"), trident::error);
}

TEST_CASE("local: an exception with an asynchronous collective queued is reported as itself, at once") {
  const auto start = std::chrono::steady_clock::now();
  try {
    local_world::run(2, [](local_comm& comm) {
      std::vector<float> x(1000, 1.0f);
      if (comm.rank() == 0) {
        auto pending = comm.all_reduce_async(x);
        throw std::runtime_error("loss is NaN");  // the request is destroyed while unwinding
      }
      comm.barrier();  // rank 1 is elsewhere: rank 0's all_reduce can never complete
    });
    FAIL("run should have rethrown rank 0's exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "loss is NaN");  // not rank 1's echo, not a mismatch
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("local: the error of an asynchronous operation dropped without wait() is raised by the next call") {
  local_world::run(2, [](local_comm& comm) {
    std::vector<float> x(comm.rank() == 0 ? 8 : 12);
    { auto dropped = comm.all_reduce_async(x); }  // fails (counts differ); nobody waits for it
    CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("element count"), trident::usage_error);
    comm.barrier();  // raised once; the communicator goes on
  });
  // Not lost at the end of the rank's function either: run() reports it.
  CHECK_THROWS_WITH_AS(local_world::run(2,
                                        [](local_comm& comm) {
                                          std::vector<float> x(comm.rank() == 0 ? 8 : 12);
                                          auto dropped = comm.all_reduce_async(x);
                                        }),
                       doctest::Contains("element count"), trident::usage_error);
}

// An all-gather against a reduce-scatter (ZeRO stage 3 prefetching in another order on one
// rank): the operations queued behind it must not be matched by position with the peers' (here
// two equal-sized all-reduces of different data would pass), so every rank fails them too, and
// after the error reaches the caller the ranks are matched again.
TEST_CASE("local: after an asynchronous collective disagrees, what each rank queued behind it fails too, and the ranks go on matched") {
  for (int n : {2, 3})
    for (bool wait_each : {true, false}) {
      CAPTURE(n);
      CAPTURE(wait_each);
      local_world::run(n, [&](local_comm& comm) {
        const bool odd = comm.rank() == 1;
        std::vector<float> in(4 * static_cast<std::size_t>(comm.size()), 1.0f), chunk(4), gathered(in.size());
        std::vector<float> a(6, float(comm.rank() + 1)), b(6, 10.0f * float(comm.rank() + 1));
        auto first = odd ? comm.all_gather_async(std::span<const float>(chunk), std::span<float>(gathered))
                         : comm.reduce_scatter_async(std::span<const float>(in), std::span<float>(chunk));
        auto second = comm.all_reduce_async(odd ? b : a);  // rank 1's b would meet the others' a
        auto third = comm.all_reduce_async(odd ? a : b);
        if (wait_each) {
          CHECK_THROWS_WITH_AS(first.wait(), doctest::Contains("at the same point"), trident::usage_error);
          CHECK_THROWS_WITH_AS(second.wait(), doctest::Contains("was not run"), trident::usage_error);
          CHECK_THROWS_WITH_AS(third.wait(), doctest::Contains("was not run"), trident::usage_error);
        } else {
          // A synchronous call raises it, and what was queued before it still fails.
          CHECK_THROWS_WITH_AS(comm.synchronize(), doctest::Contains("synchronize on rank"), trident::usage_error);
          CHECK_THROWS_WITH_AS(third.wait(), doctest::Contains("at the same point"), trident::usage_error);
          CHECK_THROWS_AS(first.wait(), trident::usage_error);
          CHECK_THROWS_AS(second.wait(), trident::usage_error);
        }
        CHECK(a == std::vector<float>(6, float(comm.rank() + 1)));  // untouched: nothing was matched wrongly
        CHECK(b == std::vector<float>(6, 10.0f * float(comm.rank() + 1)));
        // Matched again, synchronously and asynchronously.
        const float total = float(comm.size() * (comm.size() + 1) / 2);
        comm.all_reduce(a);
        CHECK(a == std::vector<float>(6, total));
        comm.all_reduce_async(b).wait();
        CHECK(b == std::vector<float>(6, 10.0f * total));
        comm.barrier();
      });
    }
}

TEST_CASE("local: each rank's ledger holds what that rank allocated, asynchronous scratch included") {
  std::vector<std::shared_ptr<trident::memory_ledger>> ledgers(2);
  const auto process_before = trident::process_ledger()->bytes(trident::space_kind::host);
  local_world::run(2, [&](local_comm& comm) {
    const auto& mine = comm.ledger();
    ledgers[static_cast<std::size_t>(comm.rank())] = mine;
    CHECK(mine == trident::current_ledger());
    CHECK(mine->label() == "rank " + std::to_string(comm.rank()));
    const std::size_t n = comm.rank() == 0 ? 1000 : 3000;
    trident::buffer<float> params(n, trident::mem_category::parameters);
    CHECK(mine->bytes(trident::space_kind::host, trident::mem_category::parameters) == n * sizeof(float));
    // 16 KiB reduce_scatter on the worker thread: its scratch is this rank's.
    std::vector<float> in(4096, 1.0f), out(2048);
    comm.reduce_scatter_async(in, out).wait();
    CHECK(out[0] == 2.0f);
    CHECK(mine->bytes(trident::space_kind::host, trident::mem_category::communication) >= in.size() * sizeof(float));
  });
  CHECK(ledgers[0] != ledgers[1]);
  for (const auto& l : ledgers) {
    CHECK(l->bytes(trident::space_kind::host) == 0);  // everything given back
    CHECK(l->peak(trident::space_kind::host, trident::mem_category::communication) >= 4096 * sizeof(float));
  }
  CHECK(ledgers[0]->peak(trident::space_kind::host, trident::mem_category::parameters) == 1000 * sizeof(float));
  CHECK(ledgers[1]->peak(trident::space_kind::host, trident::mem_category::parameters) == 3000 * sizeof(float));
  CHECK(trident::process_ledger()->bytes(trident::space_kind::host) == process_before);
}

TEST_CASE("local: a rank that leaves a collective because the world aborted waits until no peer reads its memory") {
  // Ranks 0 and 1 run large ring all-reduces, small one-shot ones and large sends between them
  // (each iteration with fresh heap buffers) while rank 2, outside their group, throws at some
  // moment. A rank that sees the abort while its peer is still combining or copying from its
  // buffers must not free them under the peer: AddressSanitizer (the asan-ci build runs this
  // test) reports a heap-use-after-free otherwise, as it did in gpt.local before.
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    const int mode = trial % 3;  // 0: ring all_reduce, 1: one-shot all_reduce, 2: send/recv
    const auto delay = std::chrono::microseconds(500 + 1700 * trial);
    CHECK_THROWS_WITH_AS(local_world::run(3,
                                          [&](local_comm& world) {
                                            local_comm pair = world.split(world.rank() < 2 ? 0 : 1, world.rank());
                                            if (world.rank() == 2) {
                                              std::this_thread::sleep_for(delay);
                                              throw std::runtime_error("rank 2 gives up");
                                            }
                                            const std::size_t n = mode == 1 ? 256 : (std::size_t{1} << 21);
                                            for (;;) {
                                              std::vector<float> x(n, 1.0f + static_cast<float>(pair.rank()));
                                              if (mode == 2) {
                                                if (pair.rank() == 0)
                                                  pair.send(std::span<const float>(x), 1);
                                                else
                                                  pair.recv(std::span<float>(x), 0);
                                              } else {
                                                pair.all_reduce(x);
                                              }
                                            }
                                          }),
                         "rank 2 gives up", std::runtime_error);
  }
}
