#pragma once
// main() for doctest executables run under mpirun: MPI is initialised once, every test case
// uses mpi_world() (a duplicate of MPI_COMM_WORLD, argument checks off), and one failing rank
// fails the whole job. Include from exactly one translation unit that defines
// DOCTEST_CONFIG_IMPLEMENT, then write: int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "trident/comm/mpi.hpp"

namespace test_support {

inline trident::mpi_comm*& mpi_world_slot() {
  static trident::mpi_comm* world = nullptr;
  return world;
}
inline trident::mpi_comm& mpi_world() { return *mpi_world_slot(); }

inline int mpi_doctest_main(int argc, char** argv) {
  int any_failed = 1;
  try {
    trident::mpi_environment environment(argc, argv);
    {
      trident::mpi_comm world(MPI_COMM_WORLD, false);
      // A launcher that fails to wire the processes together starts n singletons of size 1,
      // which would pass every test; TRIDENT_TEST_MPI_SIZE says how many ranks there must be.
      if (const char* expected = std::getenv("TRIDENT_TEST_MPI_SIZE");
          expected != nullptr && std::atoi(expected) != world.size()) {
        throw trident::usage_error("MPI_COMM_WORLD has " + std::to_string(world.size()) + " ranks but TRIDENT_TEST_MPI_SIZE=" +
                                   expected + " (were the processes started as singletons?)");
      }
      mpi_world_slot() = &world;
      doctest::Context context(argc, argv);
      const int failed = context.run();
      mpi_world_slot() = nullptr;
      // Every rank reports the job's verdict, so that one failing rank fails the test.
      MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argc > 0 ? argv[0] : "test", e.what());
    return 1;
  }
  return any_failed != 0 ? 1 : 0;
}

}  // namespace test_support
