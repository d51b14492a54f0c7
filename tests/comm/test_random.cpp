// Random call sequences against the thread backend (issue 17): legal calls must equal the serial
// reference; illegal ones must end in a usage_error on every rank, never a crash, a hang or a
// wrong value. Seeded and budgeted: CI runs TRIDENT_RANDOM_EPISODES (default 40) episodes from
// TRIDENT_RANDOM_SEED (default 1); bench/random_misuse.sh runs thousands.
//
// An episode is a world of 1..6 ranks and a plan of up to 24 calls that every rank derives from
// the same seed. Each call is legal, or carries one fault:
//   disagree   one rank passes another count / root / op / collective: the ranks' descriptors
//              differ, so every rank gets a usage_error naming it, and the world goes on;
//   local      one rank passes an argument that is wrong on its own (root out of range, sizes
//              that do not divide, overlapping buffers): that rank gets the usage_error, the
//              others an error saying that rank failed; the world is over, and run() must
//              rethrow that usage_error.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "comm/collective_suite.hpp"
#include "trident/comm/local.hpp"

namespace {

using trident::reduce_op;

enum class kind { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, all_reduce_async, barrier };
enum class fault { none, disagree_count, disagree_root, disagree_op, disagree_kind, local_root, local_size, local_overlap };

struct call {
  kind what;
  int type;  // 0 float, 1 double, 2 int32, 3 bf16
  reduce_op op;
  std::size_t chunk;  // elements per rank's chunk
  int root;
  fault bad = fault::none;
  int culprit = 0;
};

std::int64_t env_or(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

std::vector<call> make_plan(std::mt19937_64& rng, int n) {
  std::vector<call> plan(std::uniform_int_distribution<int>(1, 24)(rng));
  for (auto& c : plan) {
    c.what = static_cast<kind>(std::uniform_int_distribution<int>(0, 7)(rng));
    c.type = std::uniform_int_distribution<int>(0, 3)(rng);
    const reduce_op ops[] = {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::avg};
    c.op = c.type == 2 ? reduce_op::sum : ops[std::uniform_int_distribution<int>(0, 3)(rng)];
    // Sizes around the thread backend's one-step limit (2 KiB) and the ring's chunking.
    const std::size_t sizes[] = {0, 1, 3, 64, 257, 700, 1500};
    c.chunk = sizes[std::uniform_int_distribution<int>(0, 6)(rng)];
    c.root = std::uniform_int_distribution<int>(0, n - 1)(rng);
    c.culprit = std::uniform_int_distribution<int>(0, n - 1)(rng);
    if (n > 1 && std::uniform_int_distribution<int>(0, 5)(rng) == 0)
      c.bad = static_cast<fault>(std::uniform_int_distribution<int>(1, 7)(rng));
    // Faults that need a feature of the call: fall back to one that applies.
    const bool reduces = c.what == kind::all_reduce || c.what == kind::reduce_scatter || c.what == kind::reduce ||
                         c.what == kind::all_reduce_async;
    const bool rooted = c.what == kind::broadcast || c.what == kind::reduce;
    if ((c.bad == fault::disagree_root || c.bad == fault::local_root) && !rooted) c.bad = fault::disagree_kind;
    if (c.bad == fault::disagree_op && !reduces) c.bad = fault::disagree_kind;
    if (c.bad == fault::local_size && !(c.what == kind::reduce_scatter || c.what == kind::all_gather || c.what == kind::all_to_all))
      c.bad = fault::disagree_count;
    if (c.bad == fault::local_overlap && !(c.what == kind::all_reduce || c.what == kind::reduce_scatter)) c.bad = fault::disagree_count;
    if (c.bad == fault::local_overlap && c.what == kind::all_reduce && c.chunk < 2) c.bad = fault::disagree_kind;
    if (c.bad == fault::local_overlap && c.what == kind::reduce_scatter) {
      if (c.chunk == 0) c.bad = fault::disagree_kind;
      else if (c.culprit == 0) c.culprit = 1;  // rank 0's chunk is the start: that is in place, legal
    }
    if (c.bad == fault::disagree_count && c.what == kind::barrier) c.bad = fault::disagree_kind;
  }
  return plan;
}

bool is_local(fault f) { return f == fault::local_root || f == fault::local_size || f == fault::local_overlap; }

// Runs call c on this rank (with its fault, if it is the culprit) and checks a legal result.
template <class T>
void run_typed(trident::local_comm& comm, const call& c, std::size_t index) {
  const int n = comm.size();
  const int me = comm.rank();
  const bool culprit = c.bad != fault::none && me == c.culprit;
  const auto un = static_cast<std::size_t>(n);
  std::size_t chunk = c.chunk;
  if (culprit && c.bad == fault::disagree_count) chunk += 1;
  int root = c.root;
  if (culprit && c.bad == fault::disagree_root) root = (root + 1) % n;
  if (culprit && c.bad == fault::local_root) root = n + 2;
  reduce_op op = c.op;
  if (culprit && c.bad == fault::disagree_op) op = op == reduce_op::max ? reduce_op::min : reduce_op::max;
  kind what = c.what;
  if (culprit && c.bad == fault::disagree_kind) what = what == kind::barrier ? kind::all_reduce : kind::barrier;
  const std::size_t offset = index * 13;  // inputs differ from call to call
  // Not INFO: doctest records INFO contexts in one global list when an exception unwinds through
  // them, which is a data race (and heap corruption) when several rank threads unwind at once.
  const std::string where = trident::detail::concat("call ", index, " kind ", static_cast<int>(what), " type ", c.type,
                                                    " chunk ", chunk, " root ", root, " op ", trident::name_of(op), " fault ",
                                                    static_cast<int>(c.bad), " culprit ", c.culprit, " rank ", me, "/", n);

  auto reference_of = [&](std::size_t i) { return suite::reference<T>(n, offset + i, op); };
  auto expect_reduced = [&](const std::vector<T>& got, std::size_t first) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!suite::close<T>(suite::as_double(got[i]), reference_of(first + i), op)) ++bad;
    CHECK_MESSAGE(bad == 0, where);
  };
  switch (what) {
    case kind::barrier: comm.barrier(); break;
    case kind::all_reduce:
    case kind::all_reduce_async: {
      auto x = suite::inputs<T>(me, chunk, op, offset);
      if (culprit && c.bad == fault::local_overlap && chunk > 1) {
        // receive one element into the send buffer: overlapping, not the same buffer
        comm.all_reduce(std::span<const T>(x.data(), chunk - 1), std::span<T>(x.data() + 1, chunk - 1), op);
        break;
      }
      if (what == kind::all_reduce_async) comm.all_reduce_async(x, op).wait();
      else comm.all_reduce(x, op);
      if (c.bad == fault::none) expect_reduced(x, 0);
      break;
    }
    case kind::reduce_scatter: {
      auto in = suite::inputs<T>(me, chunk * un, op, offset);
      std::vector<T> out(culprit && c.bad == fault::local_size ? chunk + 1 : chunk);
      if (culprit && c.bad == fault::local_overlap && chunk > 0 && me != 0) {
        comm.reduce_scatter(std::span<const T>(in), std::span<T>(in.data(), chunk), op);  // the start, not its chunk
        break;
      }
      comm.reduce_scatter(in, out, op);
      if (c.bad == fault::none) expect_reduced(out, static_cast<std::size_t>(me) * chunk);
      break;
    }
    case kind::all_gather: {
      auto in = suite::inputs<T>(me, chunk, reduce_op::sum, offset);
      std::vector<T> out(culprit && c.bad == fault::local_size ? chunk * un + 1 : chunk * un);
      comm.all_gather(in, out);
      if (c.bad == fault::none)
        for (int r = 0; r < n; ++r)
          CHECK_MESSAGE(std::vector<T>(out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * chunk),
                               out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * chunk)) ==
                suite::inputs<T>(r, chunk, reduce_op::sum, offset), where);
      break;
    }
    case kind::broadcast: {
      auto x = suite::inputs<T>(me, chunk, reduce_op::sum, offset);
      comm.broadcast(x, root);
      if (c.bad == fault::none) CHECK_MESSAGE(x == suite::inputs<T>(root, chunk, reduce_op::sum, offset), where);
      break;
    }
    case kind::reduce: {
      auto in = suite::inputs<T>(me, chunk, op, offset);
      std::vector<T> out(me == root ? chunk : 0);
      comm.reduce(in, out, root, op);
      if (c.bad == fault::none && me == root) expect_reduced(out, 0);
      break;
    }
    case kind::all_to_all: {
      auto in = suite::inputs<T>(me, chunk * un + (culprit && c.bad == fault::local_size ? 1 : 0), reduce_op::sum, offset);
      std::vector<T> out(in.size());
      comm.all_to_all(in, out);
      if (c.bad == fault::none)
        for (int r = 0; r < n; ++r) {
          const auto theirs = suite::inputs<T>(r, chunk * un, reduce_op::sum, offset);
          CHECK_MESSAGE(std::vector<T>(out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * chunk),
                               out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * chunk)) ==
                std::vector<T>(theirs.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * chunk),
                               theirs.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me + 1) * chunk)), where);
        }
      break;
    }
  }
}

void run_call(trident::local_comm& comm, const call& c, std::size_t index) {
  switch (c.type) {
    case 0: run_typed<float>(comm, c, index); break;
    case 1: run_typed<double>(comm, c, index); break;
    case 2: run_typed<std::int32_t>(comm, c, index); break;
    default: run_typed<trident::bf16>(comm, c, index); break;
  }
}

}  // namespace

TEST_CASE("random call sequences: legal calls equal the serial result, illegal ones are usage errors everywhere") {
  const auto seed = static_cast<std::uint64_t>(env_or("TRIDENT_RANDOM_SEED", 1));
  const auto episodes = env_or("TRIDENT_RANDOM_EPISODES", 40);
  trident::local_options options;
  options.timeout = std::chrono::seconds(60);  // nothing may need it: a hang fails the test
  std::int64_t legal = 0, disagreements = 0, local_faults = 0;
  for (std::int64_t e = 0; e < episodes; ++e) {
    std::mt19937_64 rng(seed * 1'000'003 + static_cast<std::uint64_t>(e));
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    const auto plan = make_plan(rng, n);
    // The calls up to and including the first local fault: that one ends the world.
    std::size_t end = plan.size();
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (is_local(plan[i].bad)) {
        end = i + 1;
        break;
      }
    const bool ends_in_local_fault = end > 0 && is_local(plan[end - 1].bad);
    const std::string episode = trident::detail::concat("seed ", seed, " episode ", e, " ranks ", n);
    std::atomic<int> usage_errors{0}, culprit_errors{0}, echoes{0};
    try {
      trident::local_world::run(n, [&](trident::local_comm& comm) {
        for (std::size_t i = 0; i < end; ++i) {
          const call& c = plan[i];
          if (c.bad == fault::none) {
            run_call(comm, c, i);
            continue;
          }
          try {
            run_call(comm, c, i);
            FAIL(episode, ": call ", i, " with fault ", static_cast<int>(c.bad), " on rank ", c.culprit,
                 " did not fail on rank ", comm.rank());
          } catch (const trident::usage_error&) {
            ++usage_errors;
            if (is_local(c.bad)) {
              CHECK_MESSAGE(comm.rank() == c.culprit, episode);  // only the culprit sees its own argument error
              ++culprit_errors;
              throw;
            }
          } catch (const trident::error& e) {
            // A peer of the culprit of a local fault: told that the culprit failed.
            CHECK_MESSAGE(is_local(c.bad), episode, ": ", e.what());
            CHECK_MESSAGE(std::string(e.what()).find("rank " + std::to_string(c.culprit) + " failed") != std::string::npos,
                          episode, ": ", e.what());
            ++echoes;
            throw;
          }
        }
      }, options);
      CHECK_MESSAGE(!ends_in_local_fault, episode);
    } catch (const trident::usage_error&) {
      CHECK_MESSAGE(ends_in_local_fault, episode);  // run() reports the culprit's own usage error, not an echo
    }
    for (std::size_t i = 0; i < end; ++i) {
      if (plan[i].bad == fault::none) ++legal;
      else if (is_local(plan[i].bad)) ++local_faults;
      else ++disagreements;
    }
    if (ends_in_local_fault) {
      CHECK_MESSAGE(culprit_errors == 1, episode);
      CHECK_MESSAGE(echoes <= n - 1, episode);  // peers that were waiting for the culprit (others may have been elsewhere)
    }
  }
  MESSAGE("legal calls ", legal, ", disagreements ", disagreements, ", local faults ", local_faults);
  CHECK(legal > 0);
  if (episodes >= 40) {
    CHECK(disagreements > 0);
    CHECK(local_faults > 0);
  }
}
