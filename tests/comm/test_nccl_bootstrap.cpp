// The shared-file bootstrap between real processes started without mpirun, the way torchrun or
// srun start them: each process learns its rank from the launcher's variables (launch_env),
// rank 0 makes the NCCL unique id and publishes it in a file, the others wait for it. Every
// process must end up with the same id; with a GPU the processes also build one NCCL
// communicator from it and all-reduce (several ranks share GPU 0 through NCCL_HOSTID).
// Without a GPU the id exchange still runs for real (ncclGetUniqueId needs no device).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trident/core/cuda_runtime.hpp"

extern char** environ;

namespace {

// Launcher variables the parent may itself run under, and NCCL settings the children must get
// from us (getenv takes the first of two entries of one name); children get only ours.
bool is_launcher_variable(const std::string& entry) {
  for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "SLURM_", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=",
                             "LOCAL_WORLD_SIZE=", "TRIDENT_TEST_BOOTSTRAP_", "NCCL_SOCKET_IFNAME=", "NCCL_HOSTID="})
    if (entry.rfind(prefix, 0) == 0) return true;
  return false;
}

struct job {
  std::filesystem::path dir;
  std::vector<pid_t> pids;

  explicit job(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("trident-bootstrap-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~job() {
    for (pid_t p : pids) ::kill(p, SIGKILL);  // only those still running after a failed check
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    std::filesystem::remove_all(dir);
  }

  void start(const std::map<std::string, std::string>& variables) {
    std::vector<std::string> entries;
    for (char** e = environ; *e != nullptr; ++e)
      if (!is_launcher_variable(*e)) entries.emplace_back(*e);
    for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
    entries.emplace_back("NCCL_SOCKET_IFNAME=lo");  // the one interface of a machine without network
    std::vector<char*> envp;
    for (auto& e : entries) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string program = TRIDENT_BOOTSTRAP_WORKER;
    std::string directory = dir.string();
    char* argv[] = {program.data(), directory.data(), nullptr};
    // Each process's stderr goes to <dir>/spawn<i>.err, so tests can check what it said.
    const std::string err = (dir / ("spawn" + std::to_string(pids.size()) + ".err")).string();
    posix_spawn_file_actions_t actions;
    REQUIRE(::posix_spawn_file_actions_init(&actions) == 0);
    REQUIRE(::posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv, envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn(", program, "): ", std::strerror(rc));
    pids.push_back(pid);
  }

  // Exit status of every process, in start order; -1 for one killed after `limit`.
  std::vector<int> wait_all(std::chrono::seconds limit) {
    std::vector<int> status(pids.size(), -2);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::size_t left = pids.size();
    while (left > 0) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (status[i] != -2) continue;
        int s = 0;
        const pid_t done = ::waitpid(pids[i], &s, WNOHANG);
        if (done == pids[i] || done < 0) {  // < 0: not our child any more; count it as failed
          status[i] = done == pids[i] && WIFEXITED(s) ? WEXITSTATUS(s) : -1;
          --left;
        }
      }
      if (left == 0) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (std::size_t i = 0; i < pids.size(); ++i)
          if (status[i] == -2) {
            ::kill(pids[i], SIGKILL);
            ::waitpid(pids[i], nullptr, 0);
            status[i] = -1;
          }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pids.clear();
    return status;
  }

  std::string stderr_of(std::size_t spawned) const {
    std::ifstream in(dir / ("spawn" + std::to_string(spawned) + ".err"));
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  std::map<std::string, std::string> report(int rank) const {
    std::ifstream in(dir / ("rank" + std::to_string(rank) + ".txt"));
    std::map<std::string, std::string> fields;
    std::string line;
    while (std::getline(in, line)) {
      const auto space = line.find(' ');
      if (space != std::string::npos) fields[line.substr(0, space)] = line.substr(space + 1);
    }
    return fields;
  }
};

// Every rank exited 0 and reported the launcher's view, one id, and (with a GPU) the sum.
void check_reports(const job& j, const std::vector<int>& status, int size, const std::string& source) {
  const bool gpu = trident::cuda_device_count() > 0;
  std::string first_id;
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    CHECK(status[static_cast<std::size_t>(r)] == 0);
    auto fields = j.report(r);
    REQUIRE(fields.count("id") == 1);
    CHECK(fields["source"] == source);
    CHECK(fields["rank"] == std::to_string(r) + " size " + std::to_string(size) + " local_rank " +
                                std::to_string(r) + " local_size " + std::to_string(size));
    CHECK(fields["id"].size() == 256);
    CHECK(fields["id"].find_first_not_of('0') != std::string::npos);  // not an all-zero id
    if (r == 0) first_id = fields["id"];
    CHECK(fields["id"] == first_id);
    const float sum = static_cast<float>(size * (size + 1) / 2);
    std::ostringstream expected;
    expected << sum << " " << sum;
    CHECK(fields["all_reduce"] == (gpu ? expected.str() : std::string("none (no CUDA device)")));
  }
}

}  // namespace

TEST_CASE("file bootstrap, torchrun-style: 3 processes, rank 0 started last, share one NCCL id") {
  job j("torchrun");
  const int size = 3;
  for (int r : {1, 2, 0}) {  // ranks 1 and 2 must wait for the file
    j.start({{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(size)}, {"LOCAL_RANK", std::to_string(r)},
             {"LOCAL_WORLD_SIZE", std::to_string(size)}});
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const auto status = j.wait_all(std::chrono::seconds(240));
  // Reports are read by rank; processes were started in the order 1, 2, 0.
  check_reports(j, {status[2], status[0], status[1]}, size, "torchrun");
}

TEST_CASE("file bootstrap, Slurm-style variables: 2 processes share one NCCL id") {
  job j("slurm");
  const int size = 2;
  for (int r = 0; r < size; ++r)
    j.start({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", std::to_string(size)},
             {"SLURM_LOCALID", std::to_string(r)}, {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}});
  check_reports(j, j.wait_all(std::chrono::seconds(240)), size, "Slurm");
}

TEST_CASE("file bootstrap: without rank 0 the other processes fail after their timeout, naming the file") {
  job j("no-rank-0");
  for (int r : {1, 2})
    j.start({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}, {"TRIDENT_TEST_BOOTSTRAP_TIMEOUT_MS", "300"}});
  const auto started = std::chrono::steady_clock::now();
  const auto status = j.wait_all(std::chrono::seconds(60));
  CHECK(status == std::vector<int>{1, 1});  // an error exit, not a hang (killed would be -1)
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(300));
  CHECK_FALSE(std::filesystem::exists(j.dir / "rank1.txt"));
  for (std::size_t i = 0; i < 2; ++i) {
    const std::string said = j.stderr_of(i);
    CAPTURE(said);
    CHECK(said.find((j.dir / "nccl.id").string()) != std::string::npos);
    CHECK(said.find("did not appear within 300 ms") != std::string::npos);
  }
}
