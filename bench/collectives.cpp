// One CLI for every collective and backend, mirroring nccl-tests' flags and columns.
//
//   collectives [--backend local|mpi|nccl] [--coll all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all]
//               [-t ranks (local)] [-b min bytes] [-e max bytes] [-f factor] [-n iters] [-w warmup]
//               [-c check 0/1] [-d float|double|half|bfloat16|int32|int64|uint8] [-o sum|prod|max|min|avg]
//               [-r root] [-R rounds]
//
//   collectives --backend local -t 4 -b 1K -e 64M -f 4          # 4 thread ranks
//   mpirun -np 4 collectives --backend mpi -b 1M -e 64M         # also times raw MPI calls
//   mpirun -np 2 collectives --backend nccl -e 256M             # also times raw NCCL calls
//
// Columns as in nccl-tests: size is the largest buffer per rank in bytes (the input of
// reduce_scatter, the output of all_gather), time is the mean per call in microseconds (the
// slowest rank's; the median of -R rounds of -n calls), algbw = size / time, busbw = algbw x the collective's bus factor
// (all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1),
// which makes figures comparable across rank counts. For MPI and NCCL the raw library call on
// the same buffers is timed in the same run and the ratio wrapper/raw printed. For MPI with the
// cross-rank argument check on (the default; TRIDENT_CHECK_COLLECTIVES=0 turns it off), trident
// without the check is timed in the same run too (columns nocheck(us) and its ratio to raw), so
// the check's cost per call is the difference of time(us) and nocheck(us). For the thread
// backend, the single-thread memcpy bandwidth of the machine is printed as the reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "trident/comm/host_reduce.hpp"
#include "trident/comm/local.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif
#if TRIDENT_HAS_NCCL
#include "trident/comm/nccl.hpp"
#endif

namespace {

using trident::collective;
using trident::dtype;
using trident::reduce_op;

struct options {
  std::string backend = "local";
  collective coll = collective::all_reduce;
  int ranks = 4;
  std::size_t min_bytes = std::size_t{32} << 20;
  std::size_t max_bytes = std::size_t{32} << 20;
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  dtype type = dtype::float32;
  reduce_op op = reduce_op::sum;
  int root = 0;
  int rounds = 5;
};

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::size_t mult = 1;
  if (end && *end) {
    switch (*end) {
      case 'K': case 'k': mult = std::size_t{1} << 10; break;
      case 'M': case 'm': mult = std::size_t{1} << 20; break;
      case 'G': case 'g': mult = std::size_t{1} << 30; break;
      default: throw trident::usage_error("size '" + s + "': expected a number with an optional K, M or G suffix");
    }
  }
  return static_cast<std::size_t>(v * static_cast<double>(mult));
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw trident::usage_error("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend") o.backend = value();
    else if (a == "--coll") {
      const auto v = value();
      bool found = false;
      for (auto c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                     collective::reduce, collective::all_to_all})
        if (v == trident::name_of(c)) o.coll = c, found = true;
      if (!found) throw trident::usage_error("--coll " + v + ": expected all_reduce, reduce_scatter, all_gather, broadcast, reduce or all_to_all");
    } else if (a == "-t") o.ranks = std::stoi(value());
    else if (a == "-b") o.min_bytes = parse_size(value());
    else if (a == "-e") o.max_bytes = parse_size(value());
    else if (a == "-f") o.factor = std::stod(value());
    else if (a == "-n") o.iters = std::stoi(value());
    else if (a == "-w") o.warmup = std::stoi(value());
    else if (a == "-c") o.check = std::stoi(value()) != 0;
    else if (a == "-r") o.root = std::stoi(value());
    else if (a == "-R") o.rounds = std::stoi(value());
    else if (a == "-d") {
      const auto v = value();
      const std::pair<const char*, dtype> names[] = {{"float", dtype::float32}, {"double", dtype::float64}, {"half", dtype::float16},
                                                     {"bfloat16", dtype::bfloat16}, {"int32", dtype::int32}, {"int64", dtype::int64},
                                                     {"uint8", dtype::uint8}};
      bool found = false;
      for (auto [n, t] : names)
        if (v == n) o.type = t, found = true;
      if (!found) throw trident::usage_error("-d " + v + ": expected float, double, half, bfloat16, int32, int64 or uint8");
    } else if (a == "-o") {
      const auto v = value();
      bool found = false;
      for (auto op : {reduce_op::sum, reduce_op::prod, reduce_op::max, reduce_op::min, reduce_op::avg})
        if (v == trident::name_of(op)) o.op = op, found = true;
      if (!found) throw trident::usage_error("-o " + v + ": expected sum, prod, max, min or avg");
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: collectives [--backend local|mpi|nccl] [--coll NAME] [-t ranks] [-b min] [-e max] [-f factor] "
                "[-n iters] [-w warmup] [-c 0|1] [-d type] [-o op] [-r root]");
      std::exit(0);
    } else {
      throw trident::usage_error("unknown option " + a + " (try --help)");
    }
  }
  TRIDENT_EXPECT(o.factor > 1, "-f: the step factor must be greater than 1, got ", o.factor);
  TRIDENT_EXPECT(o.min_bytes <= o.max_bytes, "-b (", o.min_bytes, ") must not exceed -e (", o.max_bytes, ")");
  TRIDENT_EXPECT(o.iters >= 1 && o.warmup >= 0 && o.rounds >= 1, "-n and -R must be >= 1 and -w >= 0");
  return o;
}

double bus_factor(collective c, int n) {
  switch (c) {
    case collective::all_reduce: return 2.0 * (n - 1) / n;
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all: return static_cast<double>(n - 1) / n;
    case collective::broadcast:
    case collective::reduce: return 1.0;
  }
  return 1.0;
}

// Elements of the larger buffer for `bytes` (rounded down to a multiple of n where chunks must divide).
std::size_t elements_for(const options& o, std::size_t bytes, int n) {
  std::size_t count = bytes / trident::size_of(o.type);
  if (o.coll == collective::reduce_scatter || o.coll == collective::all_gather || o.coll == collective::all_to_all)
    count -= count % static_cast<std::size_t>(n);
  return count;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One value reduced over the ranks, through the communicator's own memory space.
template <class C, class T>
T reduce_scalar(C& comm, T value, reduce_op op) {
  trident::buffer<T, typename C::space> b(1, trident::mem_category::communication);
  trident::copy(std::span<const T>(&value, 1), b);
  comm.all_reduce(b, op);
  comm.synchronize();
  return trident::to_vector(b)[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Runs `body` warmup + iters times between barriers; returns the slowest rank's mean in µs.
template <class C>
double time_loop(C& comm, const options& o, const std::function<void()>& body) {
  for (int i = 0; i < o.warmup; ++i) body();
  comm.synchronize();
  comm.barrier();
  const double t0 = now_us();
  for (int i = 0; i < o.iters; ++i) body();
  comm.synchronize();
  return reduce_scalar(comm, (now_us() - t0) / o.iters, reduce_op::max);
}

// One (collective, size) on buffers of the communicator's space, through trident's API.
template <class C, class T>
struct bench_buffers {
  using S = typename C::space;
  trident::buffer<T, S> in, out;
  std::size_t send_count, recv_count;
};

template <class C, class T>
bench_buffers<C, T> make_buffers(C& comm, const options& o, std::size_t count) {
  const auto n = static_cast<std::size_t>(comm.size());
  std::size_t send = count, recv = count;
  if (o.coll == collective::reduce_scatter) recv = count / n;
  if (o.coll == collective::all_gather) send = count / n;
  bench_buffers<C, T> b{trident::buffer<T, typename C::space>(send, trident::mem_category::communication),
                        trident::buffer<T, typename C::space>(recv, trident::mem_category::communication), send, recv};
  std::vector<T> host(send);
  for (std::size_t i = 0; i < send; ++i)
    host[i] = static_cast<T>(static_cast<std::conditional_t<std::is_integral_v<T>, int, float>>((i + static_cast<std::size_t>(comm.rank())) % 3));
  if (send) trident::copy(std::span<const T>(host), b.in);
  return b;
}

template <class C, class T>
void call_trident(C& comm, const options& o, bench_buffers<C, T>& b) {
  switch (o.coll) {
    case collective::all_reduce: comm.all_reduce(b.in, b.out, o.op); break;
    case collective::reduce_scatter: comm.reduce_scatter(b.in, b.out, o.op); break;
    case collective::all_gather: comm.all_gather(b.in, b.out); break;
    case collective::broadcast: comm.broadcast(b.in, o.root); break;
    case collective::reduce: comm.reduce(b.in, b.out, o.root, o.op); break;
    case collective::all_to_all: comm.all_to_all(b.in, b.out); break;
  }
}

// Expected first elements after one call (inputs are (i + rank) % 3), -1 where not checked.
template <class C, class T>
long long count_wrong(C& comm, const options& o, bench_buffers<C, T>& b) {
  const int n = comm.size();
  const int r = comm.rank();
  comm.synchronize();
  const auto out = trident::to_vector(o.coll == collective::broadcast ? b.in : b.out);
  const std::size_t check = std::min<std::size_t>(out.size(), 4096);
  long long wrong = 0;
  auto value = [&](int rank, std::size_t i) { return static_cast<double>((i + static_cast<std::size_t>(rank)) % 3); };
  for (std::size_t j = 0; j < check; ++j) {
    double want;
    std::size_t i = j;
    if (o.coll == collective::reduce_scatter) i = static_cast<std::size_t>(r) * b.recv_count + j;
    if (o.coll == collective::all_gather) {
      want = value(static_cast<int>(j / b.send_count), j % b.send_count);
    } else if (o.coll == collective::all_to_all) {
      const std::size_t chunk = b.send_count / static_cast<std::size_t>(n);
      want = value(static_cast<int>(j / chunk), static_cast<std::size_t>(r) * chunk + j % chunk);
    } else if (o.coll == collective::broadcast) {
      want = value(o.root, j);
    } else {
      if (o.coll == collective::reduce && r != o.root) break;
      want = value(0, i);
      for (int q = 1; q < n; ++q) {
        const double x = value(q, i);
        switch (o.op) {
          case reduce_op::sum: case reduce_op::avg: want += x; break;
          case reduce_op::prod: want *= x; break;
          case reduce_op::max: want = std::max(want, x); break;
          case reduce_op::min: want = std::min(want, x); break;
        }
      }
      if (o.op == reduce_op::avg) want = std::is_integral_v<T> ? std::trunc(want / n) : want / n;
    }
    const double got = static_cast<double>(static_cast<std::conditional_t<std::is_integral_v<T>, long long, float>>(out[j]));
    const double tol = o.op == reduce_op::avg && !std::is_integral_v<T> ? 1e-2 * std::max(1.0, std::fabs(want)) : 0.0;
    if (std::fabs(got - want) > tol) ++wrong;
  }
  return reduce_scalar(comm, static_cast<std::int64_t>(wrong), reduce_op::sum);
}

//! Raw library call on the same buffers, or nothing when the backend has no raw equivalent.
using raw_call = std::function<void(const trident::collective_call&)>;

#if TRIDENT_HAS_MPI
// MPI on the wrapper's own (duplicated) communicator. fp16/bf16 have no built-in MPI reduction,
// so there is no raw figure for them; avg is MPI_SUM plus the same host division the wrapper does.
raw_call raw_mpi(MPI_Comm comm, const options& o) {
  const bool reduces = o.coll == collective::all_reduce || o.coll == collective::reduce_scatter || o.coll == collective::reduce;
  if (reduces && (o.type == dtype::float16 || o.type == dtype::bfloat16)) return nullptr;
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  return [=](const trident::collective_call& c) {
    const MPI_Datatype t = trident::to_mpi(c.type);
    MPI_Op op = MPI_SUM;
    if (c.op == reduce_op::prod) op = MPI_PROD;
    if (c.op == reduce_op::max) op = MPI_MAX;
    if (c.op == reduce_op::min) op = MPI_MIN;
    const int sc = static_cast<int>(c.send_count), rc = static_cast<int>(c.recv_count);
    switch (c.kind) {
      case collective::all_reduce: MPI_Allreduce(c.send, c.recv, sc, t, op, comm); break;
      case collective::reduce_scatter: MPI_Reduce_scatter_block(c.send, c.recv, rc, t, op, comm); break;
      case collective::all_gather: MPI_Allgather(c.send, sc, t, c.recv, sc, t, comm); break;
      case collective::broadcast: MPI_Bcast(c.recv, rc, t, c.root, comm); break;
      case collective::reduce: MPI_Reduce(c.send, c.recv, sc, t, op, c.root, comm); break;
      case collective::all_to_all: MPI_Alltoall(c.send, sc / size, t, c.recv, sc / size, t, comm); break;
    }
    if (c.op == reduce_op::avg && (c.kind != collective::reduce || rank == c.root))
      trident::detail::host_divide(c.type, c.recv, c.kind == collective::reduce_scatter ? c.recv_count : c.send_count, size);
  };
}
#endif

#if TRIDENT_HAS_NCCL
// NCCL on the wrapper's own communicator and stream, enqueued the same way.
raw_call raw_nccl(ncclComm_t comm, cudaStream_t stream, int size) {
  return [=](const trident::collective_call& c) {
    const ncclDataType_t t = trident::to_nccl(c.type);
    ncclRedOp_t op = ncclSum;
    if (c.op == reduce_op::prod) op = ncclProd;
    if (c.op == reduce_op::max) op = ncclMax;
    if (c.op == reduce_op::min) op = ncclMin;
    if (c.op == reduce_op::avg) op = ncclAvg;
    const std::size_t e = trident::size_of(c.type);
    switch (c.kind) {
      case collective::all_reduce: ncclAllReduce(c.send, c.recv, c.send_count, t, op, comm, stream); break;
      case collective::reduce_scatter: ncclReduceScatter(c.send, c.recv, c.recv_count, t, op, comm, stream); break;
      case collective::all_gather: ncclAllGather(c.send, c.recv, c.send_count, t, comm, stream); break;
      case collective::broadcast: ncclBroadcast(c.recv, c.recv, c.recv_count, t, c.root, comm, stream); break;
      case collective::reduce: ncclReduce(c.send, c.recv, c.send_count, t, op, c.root, comm, stream); break;
      case collective::all_to_all: {
        const std::size_t chunk = c.send_count / static_cast<std::size_t>(size);
        ncclGroupStart();
        for (int p = 0; p < size; ++p) {
          ncclSend(static_cast<const char*>(c.send) + static_cast<std::size_t>(p) * chunk * e, chunk, t, p, comm, stream);
          ncclRecv(static_cast<char*>(c.recv) + static_cast<std::size_t>(p) * chunk * e, chunk, t, p, comm, stream);
        }
        ncclGroupEnd();
        break;
      }
    }
  };
}
#endif

//! Turns the backend's cross-rank argument check on or off, where it has one that is on (MPI).
using check_switch = std::function<void(bool)>;

template <class C>
void run_sizes(C& comm, const options& o, const raw_call& raw, const char* raw_name, const check_switch& check = nullptr) {
  const int n = comm.size();
  if (comm.rank() == 0) {
    fmt::print("# backend {}, {} ranks, {}, {}, {} iterations after {} warm-up\n", o.backend, n, trident::name_of(o.coll),
               trident::name_of(o.type), o.iters, o.warmup);
    if (check) fmt::print("# time: trident with its cross-rank argument check (the default); nocheck: without it\n");
    fmt::print("#{:>11} {:>12} {:>8} {:>6} {:>5} {:>10} {:>8} {:>8} {:>6}", "size(B)", "count", "type", "redop", "root",
               "time(us)", "algbw", "busbw", "#wrong");
    if (raw) fmt::print(" {:>12} {:>8} {:>8}", fmt::format("{}(us)", raw_name), "busbw", "ratio");
    if (check) fmt::print(" {:>12} {:>8}", "nocheck(us)", "ratio");
    fmt::print("\n");
  }
  for (double bytes = static_cast<double>(o.min_bytes); bytes <= static_cast<double>(o.max_bytes) * 1.0000001; bytes *= o.factor) {
    const std::size_t count = elements_for(o, static_cast<std::size_t>(bytes), n);
    trident::detail::visit_dtype(o.type, [&](auto tag) {
      using T = decltype(tag);
      auto b = make_buffers<C, T>(comm, o, count);
      long long wrong = -1;
      if (o.check) {
        call_trident(comm, o, b);
        wrong = count_wrong(comm, o, b);
      }
      trident::collective_call call;
      call.kind = o.coll;
      call.send = b.in.data();
      call.recv = o.coll == collective::broadcast ? static_cast<void*>(b.in.data()) : static_cast<void*>(b.out.data());
      call.send_count = b.send_count;
      call.recv_count = o.coll == collective::broadcast ? b.send_count : b.recv_count;
      call.type = o.type;
      call.op = o.op;
      call.root = o.root;
      // Wrapper, raw call (and the wrapper without its argument check) alternate in rounds and
      // each reports its median round, so slow phases of a shared machine hit all alike.
      struct variant {
        std::function<void()> body;
        std::vector<double> times;
      };
      std::vector<variant> variants;
      variants.push_back({[&] { call_trident(comm, o, b); }, {}});
      if (raw) variants.push_back({[&] { raw(call); }, {}});
      if (check) {
        variants.push_back({[&] {
                              check(false);
                              call_trident(comm, o, b);
                              check(true);
                            },
                            {}});
      }
      // The order rotates too (round r starts with variant r mod k), so no variant always runs
      // right after another one's caches and clocks settled.
      for (int round = 0; round < o.rounds; ++round)
        for (std::size_t k = 0; k < variants.size(); ++k) {
          auto& v = variants[(static_cast<std::size_t>(round) + k) % variants.size()];
          v.times.push_back(time_loop(comm, o, v.body));
        }
      const double t = median(variants[0].times);
      const double raw_t = raw ? median(variants[1].times) : 0.0;
      const double unchecked_t = check ? median(variants.back().times) : 0.0;
      const double size = static_cast<double>(count * sizeof(T));
      const double algbw = size / t / 1e3;  // GB/s
      const double busbw = algbw * bus_factor(o.coll, n);
      const bool reduces = o.coll == collective::all_reduce || o.coll == collective::reduce_scatter || o.coll == collective::reduce;
      if (comm.rank() == 0) {
        fmt::print("{:>12} {:>12} {:>8} {:>6} {:>5} {:>10.1f} {:>8.2f} {:>8.2f} {:>6}", count * sizeof(T), count,
                   trident::name_of(o.type), reduces ? trident::name_of(o.op) : std::string_view("none"), o.root, t, algbw,
                   busbw, wrong);
        if (raw) fmt::print(" {:>12.1f} {:>8.2f} {:>8.3f}", raw_t, size / raw_t / 1e3 * bus_factor(o.coll, n), t / raw_t);
        if (check) fmt::print(" {:>12.1f} {:>8.3f}", unchecked_t, raw ? unchecked_t / raw_t : 0.0);
        fmt::print("\n");
      }
    });
  }
}

// The reference for the thread backend: one thread copying memory.
double memcpy_bandwidth_gbs(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes);
  std::memcpy(b.data(), a.data(), bytes);
  const int reps = 5;
  const double t0 = now_us();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(b.data(), a.data(), bytes);
    a[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(i) + 1];  // keep the copies observable
  }
  return static_cast<double>(bytes) * reps / (now_us() - t0) / 1e3;  // bytes copied per second
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    if (o.backend == "local") {
      const double copy = memcpy_bandwidth_gbs(std::size_t{64} << 20);
      fmt::print("# single-thread memcpy of 64 MiB: {:.2f} GB/s copied ({:.2f} GB/s read + written); half of it: {:.2f} GB/s\n",
                 copy, 2 * copy, copy / 2);
      trident::local_world::run(o.ranks, [&](trident::local_comm& comm) { run_sizes(comm, o, nullptr, ""); });
      return 0;
    }
#if TRIDENT_HAS_MPI
    if (o.backend == "mpi") {
      trident::mpi_environment env(argc, argv);
      auto comm = trident::mpi_comm::world();
      check_switch check;
      if (comm.check_arguments()) check = [&comm](bool on) { comm.check_arguments(on); };
      run_sizes(comm, o, raw_mpi(comm.native(), o), "MPI", check);
      return 0;
    }
#endif
#if TRIDENT_HAS_NCCL && TRIDENT_HAS_MPI
    if (o.backend == "nccl") {
      trident::mpi_environment env(argc, argv);
      trident::select_device(trident::launch_env::detect());
      auto comm = trident::nccl_comm::from_mpi(MPI_COMM_WORLD);
      run_sizes(comm, o, raw_nccl(comm.native(), comm.stream(), comm.size()), "NCCL");
      return 0;
    }
#endif
    throw trident::usage_error("--backend " + o.backend + ": this build has local" +
                               (trident::has_mpi ? std::string(", mpi") : std::string()) +
                               (trident::has_nccl && trident::has_mpi ? std::string(", nccl") : std::string()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives: %s\n", e.what());
    return 1;
  }
}
