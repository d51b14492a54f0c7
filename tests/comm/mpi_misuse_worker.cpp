// A small MPI program that misuses the communicator on purpose, for tests/comm/mpi_misuse.sh:
// each mode must end (the job ended with a message, or an error on every rank), never hang.
//   mpi_misuse_worker leave-after-error | mismatch | mismatch-checked | symmetric-error |
//                     dropped-async | dropped-async-all-finish | huge-count | huge-count-unchecked |
//                     throws | stall | killed
// The script sets TRIDENT_CHECK_COLLECTIVES=0 where a mode needs the argument check off.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <exception>
#include <string>
#include <vector>

#include "trident/comm/mpi.hpp"

int main(int argc, char** argv) {
  trident::mpi_environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto comm = trident::mpi_comm::world();
  std::vector<float> x(1000, 1.0f);
  std::printf("rank %d: %s\n", comm.rank(), mode.c_str());
  std::fflush(stdout);
  if (mode == "throws" || mode == "stall" || mode == "killed") {
    // Rank 1 fails in the three ways a process can (an exception nobody catches, a stall, a
    // signal) while rank 0 waits for it in an all_reduce.
    if (comm.rank() == 1) {
      if (mode == "throws") throw std::runtime_error("rank 1: loss is NaN (thrown out of main on purpose)");
      if (mode == "killed") std::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::minutes(10));
    }
    comm.all_reduce(x);
    std::printf("rank 0: the all_reduce returned (it must not)\n");
  } else if (mode == "leave-after-error") {
    // Rank 1 hits an error, catches it and leaves main; rank 0 waits for it in an all_reduce.
    if (comm.rank() == 1) {
      try {
        comm.send(x, 1);  // to itself: a usage_error on this rank only
      } catch (const trident::usage_error& e) {
        std::printf("rank 1 caught: %s\n", e.what());
        std::fflush(stdout);
      }
      return 0;
    }
    comm.all_reduce(x);
    std::printf("rank 0: the all_reduce returned (it must not)\n");
  } else if (mode == "mismatch") {
    // A barrier against an all_reduce, with the argument check off (TRIDENT_CHECK_COLLECTIVES=0):
    // the watchdog ends the job.
    if (comm.rank() == 0) comm.barrier();
    else comm.all_reduce(x);
    std::printf("rank %d: the mismatched collective returned (it must not)\n", comm.rank());
  } else if (mode == "mismatch-checked") {
    // The same with the default settings, where the argument check is on: a usage_error on every
    // rank, and a clean exit.
    try {
      if (comm.rank() == 0) comm.barrier();
      else comm.all_reduce(x);
      std::printf("rank %d: no error (there must be one)\n", comm.rank());
    } catch (const trident::usage_error& e) {
      std::printf("rank %d caught: %s\n", comm.rank(), e.what());
    }
  } else if (mode == "symmetric-error") {
    // Every rank makes the same mistake and catches it: nobody waits for anybody, the job ends
    // normally (no MPI_Abort).
    try {
      comm.send(x, comm.rank());
    } catch (const trident::usage_error& e) {
      std::printf("rank %d caught: %s\n", comm.rank(), e.what());
    }
    comm.all_reduce(x);
    std::printf("rank %d: done, x[0] = %g\n", comm.rank(), static_cast<double>(x[0]));
  } else if (mode == "dropped-async") {
    // Rank 1 receives rank 0's 1000 floats into 10 (MPI truncates: an error) asynchronously and
    // drops the request without wait(): its destructor cannot throw, so the error is not raised,
    // but the rank counts as failed at exit. Rank 0 then waits for rank 1 in an all_reduce that
    // rank 1 never joins: rank 1's exit must end the job, naming the dropped call.
    using op = trident::p2p_op<trident::host_space>;
    if (comm.rank() == 0) {
      comm.exchange({op::send(x, 1)});
      comm.all_reduce(x);
      std::printf("rank 0: the all_reduce returned (it must not)\n");
    } else {
      std::vector<float> small(10);
      auto dropped = comm.exchange_async({op::recv(small, 0)});
    }
  } else if (mode == "dropped-async-all-finish") {
    // The same dropped request, but both ranks then meet in a barrier and leave normally:
    // nobody hangs, and the error that was never raised must still fail the job.
    using op = trident::p2p_op<trident::host_space>;
    if (comm.rank() == 0) {
      comm.exchange({op::send(x, 1)});
    } else {
      std::vector<float> small(10);
      auto dropped = comm.exchange_async({op::recv(small, 0)});
    }
    comm.barrier();
    std::printf("rank %d: reached the end\n", comm.rank());
  } else if (mode == "huge-count" || mode == "huge-count-unchecked") {
    // Rank 0 all-reduces 8 elements, rank 1 8M. huge-count (default settings): the argument
    // check compares the counts before MPI sees them, so both ranks get a usage_error and the
    // job ends normally. huge-count-unchecked (TRIDENT_CHECK_COLLECTIVES=0): nothing compares
    // the counts, so MPI may fail or write past rank 0's buffer (Open MPI 4.1 does: its malloc
    // aborts rank 0) while rank 1 waits for data that never comes; the job must still end, by
    // an error, the exit protocol or the watchdog, never hang.
    std::printf("rank %d: check_arguments %s\n", comm.rank(), comm.check_arguments() ? "on" : "off");
    std::fflush(stdout);
    std::vector<float> data(comm.rank() == 0 ? 8 : 8'000'000, 1.0f);
    try {
      comm.all_reduce(data);
      std::printf("rank %d: the mismatched all_reduce returned (it must not), data[0] = %g\n", comm.rank(),
                  static_cast<double>(data[0]));
    } catch (const std::exception& e) {
      std::printf("rank %d caught: %s\n", comm.rank(), e.what());
    }
  } else {
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  }
  std::fflush(stdout);
  return 0;
}
