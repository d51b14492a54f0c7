#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "trident/core/error.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

int evaluations = 0;
int counted(int value) {
  ++evaluations;
  return value;
}

}  // namespace

TEST_CASE("an error carries its message, operation and location, and what() shows all three") {
  const int line = __LINE__ + 1;
  const trident::error e("the shard does not divide", "shard(10, 3)");
  CHECK(e.message() == "the shard does not divide");
  CHECK(e.operation() == "shard(10, 3)");
  CHECK(e.where().line() == line);
  CHECK(contains(e.where().file_name(), "test_error.cpp"));
  const std::string what = e.what();
  CHECK(contains(what, "the shard does not divide"));
  CHECK(contains(what, "[in shard(10, 3)]"));
  CHECK(contains(what, "test_error.cpp:" + std::to_string(line)));
}

TEST_CASE("an error that echoes another rank's failure says so, through copies and as its kind") {
  trident::usage_error e("rank 2 failed (its error is raised there)");
  CHECK_FALSE(e.echo());
  e.mark_echo();
  try {
    throw e;
  } catch (const trident::error& caught) {
    CHECK(caught.echo());
    CHECK(caught.message() == "rank 2 failed (its error is raised there)");
  }
}

TEST_CASE("TRIDENT_EXPECT throws usage_error with the parts and the caller's line, and is lazy") {
  evaluations = 0;
  TRIDENT_EXPECT(1 + 1 == 2, "never built ", counted(1));
  CHECK(evaluations == 0);  // the message parts are not evaluated when the check holds

  int line = 0;
  try {
    line = __LINE__ + 1;
    TRIDENT_EXPECT(3 % 2 == 0, "expected an even count, got ", 3, " (", counted(7), ")");
    FAIL("TRIDENT_EXPECT did not throw");
  } catch (const trident::usage_error& e) {
    CHECK(e.message() == "expected an even count, got 3 (7)");
    CHECK(e.where().line() == line);
    CHECK(evaluations == 1);
  }

  try {
    TRIDENT_EXPECT(false);
    FAIL("TRIDENT_EXPECT did not throw");
  } catch (const trident::usage_error& e) {
    CHECK(e.message() == "check failed: false");  // with no parts, the condition is the message
  }
}

TEST_CASE("status errors keep the library's status and are caught as trident::error and runtime_error") {
  CHECK_THROWS_AS(throw trident::cuda_error(2, "out of memory", "cudaMalloc"), trident::error);
  CHECK_THROWS_AS(throw trident::nccl_error(5, "invalid usage", "ncclGroupEnd"), std::runtime_error);
  try {
    throw trident::mpi_error(13, "MPI_ERR_TRUNCATE", "MPI_Recv");
  } catch (const trident::status_error& e) {
    CHECK(e.status() == 13);
    CHECK(e.operation() == "MPI_Recv");
    CHECK(contains(e.what(), "MPI error: MPI_ERR_TRUNCATE"));
  }
  try {
    throw trident::nccl_error(3, "internal error", "ncclAllReduce");
  } catch (const trident::nccl_error& e) {
    CHECK(e.status() == 3);
    CHECK(contains(e.what(), "NCCL error: internal error [in ncclAllReduce]"));
  }
}
