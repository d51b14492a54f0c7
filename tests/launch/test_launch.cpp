// launch/: what the launcher says (launch_env) and the shared-file rendezvous (with a fake
// 128-byte token the size of an NCCL unique id). Host-only: no CUDA, NCCL or MPI.
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>

#include "trident/launch/launch_env.hpp"
#include "trident/launch/rendezvous.hpp"

namespace {

constexpr const char* launcher_variables[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"};

// Each test starts from an environment without launcher variables (ctest may run under one).
struct clean_environment {
  clean_environment() {
    for (const char* name : launcher_variables) ::unsetenv(name);
  }
  ~clean_environment() {
    for (const char* name : launcher_variables) ::unsetenv(name);
  }
  void set(const char* name, const char* value) { REQUIRE(::setenv(name, value, 1) == 0); }
};

std::string usage_message(void (*f)()) {
  try {
    f();
  } catch (const trident::usage_error& e) {
    return e.what();
  }
  return "(no usage_error)";
}

std::filesystem::path fresh_path(const char* stem) {
  auto path = std::filesystem::temp_directory_path() /
              (std::string("trident-test-") + stem + "-" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  return path;
}

}  // namespace

TEST_CASE("launch_env: no launcher variable at all is one rank, and require() refuses it") {
  clean_environment env;
  const auto e = trident::launch_env::detect();
  CHECK(e.rank == 0);
  CHECK(e.size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 1);
  CHECK(e.source == "none");
  CHECK_THROWS_WITH_AS(trident::launch_env::require(), doctest::Contains("no launcher variables are set"),
                       trident::usage_error);
}

TEST_CASE("launch_env: OpenMPI's variables") {
  clean_environment env;
  env.set("OMPI_COMM_WORLD_RANK", "5");
  env.set("OMPI_COMM_WORLD_SIZE", "8");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  const auto e = trident::launch_env::require();
  CHECK(e.rank == 5);
  CHECK(e.size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.source == "OpenMPI");
}

TEST_CASE("launch_env: torchrun's variables, and one node assumed when the local ones are missing") {
  clean_environment env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "16");
  env.set("LOCAL_RANK", "3");
  env.set("LOCAL_WORLD_SIZE", "8");
  auto e = trident::launch_env::detect();
  CHECK(e.rank == 3);
  CHECK(e.size == 16);
  CHECK(e.local_rank == 3);
  CHECK(e.local_size == 8);
  CHECK(e.source == "torchrun");

  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  e = trident::launch_env::detect();
  CHECK(e.local_rank == 3);
  CHECK(e.local_size == 16);
  CHECK(e.source.starts_with("torchrun"));
  CHECK(e.source.find("one node assumed") != std::string::npos);
}

TEST_CASE("launch_env: Slurm's variables, with SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE") {
  clean_environment env;
  env.set("SLURM_PROCID", "9");
  env.set("SLURM_NTASKS", "11");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_NTASKS_PER_NODE", "4");
  auto e = trident::launch_env::detect();
  CHECK(e.rank == 9);
  CHECK(e.size == 11);
  CHECK(e.local_rank == 0);
  CHECK(e.local_size == 4);
  CHECK(e.source == "Slurm");

  // 4 + 4 + 3 tasks: the third node (SLURM_NODEID 2) has 3.
  ::unsetenv("SLURM_NTASKS_PER_NODE");
  env.set("SLURM_TASKS_PER_NODE", "4(x2),3");
  env.set("SLURM_NODEID", "2");
  env.set("SLURM_LOCALID", "1");
  e = trident::launch_env::detect();
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 3);
  env.set("SLURM_NODEID", "1");
  CHECK(trident::launch_env::detect().local_size == 4);

  // A uniform list needs no node id.
  ::unsetenv("SLURM_NODEID");
  env.set("SLURM_TASKS_PER_NODE", "4(x3)");
  env.set("SLURM_NTASKS", "12");
  CHECK(trident::launch_env::detect().local_size == 4);

  // Neither local variable: one node assumed, and said; the tasks per node alone: refused.
  ::unsetenv("SLURM_TASKS_PER_NODE");
  ::unsetenv("SLURM_LOCALID");
  e = trident::launch_env::detect();
  CHECK(e.local_rank == 9);
  CHECK(e.local_size == 12);
  CHECK(e.source == "Slurm (SLURM_LOCALID and SLURM_(N)TASKS_PER_NODE unset: one node assumed)");
  env.set("SLURM_NTASKS_PER_NODE", "4");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("SLURM_LOCALID is not set but"),
                       trident::usage_error);
}

TEST_CASE("launch_env: OpenMPI and torchrun win over the Slurm allocation they run in") {
  clean_environment env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  env.set("RANK", "6");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "2");
  env.set("LOCAL_WORLD_SIZE", "4");
  CHECK(trident::launch_env::detect().source == "torchrun");
  CHECK(trident::launch_env::detect().rank == 6);
  env.set("OMPI_COMM_WORLD_RANK", "1");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  CHECK(trident::launch_env::detect().source == "OpenMPI");
  CHECK(trident::launch_env::detect().rank == 1);
}

TEST_CASE("launch_env: bad values are usage errors naming the variable and the value") {
  clean_environment env;
  env.set("RANK", "abc");
  env.set("WORLD_SIZE", "4");
  auto message = usage_message([] { (void)trident::launch_env::detect(); });
  CHECK(message.find("RANK='abc'") != std::string::npos);
  CHECK(message.find("not a whole number") != std::string::npos);

  env.set("RANK", "4");  // outside 0..3
  message = usage_message([] { (void)trident::launch_env::detect(); });
  CHECK(message.find("RANK=4") != std::string::npos);
  CHECK(message.find("expected 0..3") != std::string::npos);

  env.set("RANK", "-1");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("RANK=-1"), trident::usage_error);

  env.set("RANK", "1 ");  // trailing garbage
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("RANK='1 '"), trident::usage_error);

  env.set("RANK", "1");
  env.set("WORLD_SIZE", "0");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("WORLD_SIZE=0"), trident::usage_error);

  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "2");
  env.set("LOCAL_WORLD_SIZE", "2");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("LOCAL_RANK=2"), trident::usage_error);
  env.set("LOCAL_WORLD_SIZE", "5");  // more on this node than in the job
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("LOCAL_WORLD_SIZE=5"), trident::usage_error);
  ::unsetenv("LOCAL_WORLD_SIZE");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("LOCAL_WORLD_SIZE is not"),
                       trident::usage_error);
}

TEST_CASE("launch_env: a partial launcher is an error naming what is missing, not one rank") {
  clean_environment env;
  env.set("WORLD_SIZE", "4");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("RANK is not set"), trident::usage_error);

  clean_environment slurm;
  slurm.set("SLURM_PROCID", "1");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("SLURM_NTASKS is not set"),
                       trident::usage_error);
  slurm.set("SLURM_NTASKS", "4");
  slurm.set("SLURM_LOCALID", "1");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("SLURM_TASKS_PER_NODE"),
                       trident::usage_error);
  slurm.set("SLURM_TASKS_PER_NODE", "2(x");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("SLURM_TASKS_PER_NODE='2(x'"),
                       trident::usage_error);
  slurm.set("SLURM_TASKS_PER_NODE", "3,1");  // differs between nodes, and no SLURM_NODEID
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("SLURM_NODEID is not set"),
                       trident::usage_error);
  slurm.set("SLURM_NODEID", "5");
  CHECK_THROWS_WITH_AS(trident::launch_env::detect(), doctest::Contains("lists only 2 nodes"), trident::usage_error);
}

namespace {
struct fake_id {
  std::array<unsigned char, 128> bytes;
};
fake_id make_fake_id() {
  fake_id id{};
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  return id;
}
}  // namespace

TEST_CASE("file bootstrap: rank 0 publishes, a rank started earlier waits and reads the same bytes") {
  const auto path = fresh_path("bootstrap");
  fake_id seen{};
  std::thread reader([&] {
    seen = trident::share_via_file<fake_id>(path, 1, std::chrono::seconds(20), [] { return fake_id{}; });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the reader is polling by now
  const fake_id made = trident::share_via_file<fake_id>(path, 0, std::chrono::seconds(20), make_fake_id);
  reader.join();
  CHECK(made.bytes == make_fake_id().bytes);
  CHECK(seen.bytes == made.bytes);
  // Written atomically: the temporary file is gone, the file has exactly the id's size.
  CHECK(std::filesystem::file_size(path) == 128);
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path()))
    CHECK(entry.path().filename().string().find(path.filename().string() + ".tmp") == std::string::npos);
  // A rank arriving after rank 0 finds the file at once.
  const fake_id late = trident::share_via_file<fake_id>(path, 3, std::chrono::milliseconds(1), make_fake_id);
  CHECK(late.bytes == made.bytes);
  std::filesystem::remove(path);
}

TEST_CASE("file bootstrap: a missing file is an error naming the path and the timeout") {
  const auto path = fresh_path("never");
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)trident::share_via_file<fake_id>(path, 1, std::chrono::milliseconds(120), make_fake_id);  // rank 1 waits
    FAIL("no error although the file never appeared");
  } catch (const trident::error& e) {
    const std::string what = e.what();
    CHECK(what.find(path.string()) != std::string::npos);
    CHECK(what.find("120 ms") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(120));
}

TEST_CASE("file bootstrap: a file of the wrong size is refused, not read as an id") {
  const auto path = fresh_path("short");
  const std::array<std::byte, 5> junk{};
  trident::publish_file(path, junk);
  CHECK_THROWS_WITH_AS((void)trident::share_via_file<fake_id>(path, 2, std::chrono::seconds(1), make_fake_id),
                       doctest::Contains("has 5 bytes, expected 128"), trident::error);
  CHECK_THROWS_AS((void)trident::share_via_file<fake_id>(path, -1, std::chrono::seconds(1), make_fake_id), trident::usage_error);
  std::filesystem::remove(path);
}
