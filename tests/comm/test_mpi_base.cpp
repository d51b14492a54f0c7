// MPI's vocabulary, under mpirun with two ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/mpi/base.hpp"

using trident::dtype;

TEST_CASE("every dtype maps to an MPI datatype of the element's size") {
  for (dtype t : {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16, dtype::int8, dtype::uint8,
                  dtype::int32, dtype::uint32, dtype::int64, dtype::uint64}) {
    int size = 0;
    TRIDENT_MPI_CHECK(MPI_Type_size(trident::to_mpi(t), &size));
    CHECK_MESSAGE(static_cast<std::size_t>(size) == trident::size_of(t), trident::name_of(t));
  }
  CHECK(trident::mpi_type_of<float>() == MPI_FLOAT);
  CHECK(trident::mpi_type_of<std::int64_t>() == MPI_INT64_T);
}

TEST_CASE("fp16 and bf16 are two distinct, named, committed datatypes made once") {
  const MPI_Datatype h = trident::to_mpi(dtype::float16);
  const MPI_Datatype b = trident::to_mpi(dtype::bfloat16);
  CHECK(h != b);
  CHECK(h == trident::mpi_type_of<trident::fp16>());  // the same handle every time
  char name[MPI_MAX_OBJECT_NAME] = {};
  int length = 0;
  TRIDENT_MPI_CHECK(MPI_Type_get_name(b, name, &length));
  CHECK(std::string(name, static_cast<std::size_t>(length)) == "trident_bfloat16");
}

TEST_CASE("the mapped types move data between ranks") {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::int64_t> values{rank + 1, 10 * (rank + 1)};
  TRIDENT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), 2, trident::mpi_type_of<std::int64_t>(), MPI_SUM,
                                  MPI_COMM_WORLD));
  CHECK(values[0] == size * (size + 1) / 2);
  CHECK(values[1] == 10 * size * (size + 1) / 2);

  std::vector<trident::bf16> halves(3, trident::bf16{static_cast<float>(rank)});
  TRIDENT_MPI_CHECK(MPI_Bcast(halves.data(), 3, trident::to_mpi(dtype::bfloat16), 0, MPI_COMM_WORLD));
  CHECK(static_cast<float>(halves[2]) == 0.0f);
}

TEST_CASE("a predefined reduction of bf16 is refused by MPI and reported as mpi_error") {
  MPI_Comm comm = MPI_COMM_NULL;
  TRIDENT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  TRIDENT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  std::vector<trident::bf16> x(4, trident::bf16{1.0f});
  try {
    TRIDENT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x.data(), 4, trident::to_mpi(dtype::bfloat16), MPI_SUM, comm));
    FAIL("MPI accepted MPI_SUM on a two-byte opaque type");
  } catch (const trident::mpi_error& e) {
    CHECK(e.status() != MPI_SUCCESS);
    CHECK(e.operation().find("MPI_Allreduce") == 0);
    CHECK(std::string(e.what()).find("MPI error: ") != std::string::npos);
  }
  MPI_Comm_free(&comm);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context context(argc, argv);
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
