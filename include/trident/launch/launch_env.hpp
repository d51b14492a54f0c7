// trident/launch/launch_env.hpp — where this process sits in the job, as its launcher says.
//
// Synopsis
//   struct launch_env                      rank, size, local_rank, local_size, source
//     static launch_env detect()           OpenMPI, torchrun or Slurm variables; 0 of 1 when none
//     static launch_env require()          the same, but a usage_error when no launcher is found
//
// Host-only: MPI-only and thread builds use it as well as the NCCL bootstrap. Which GPU a rank
// takes is launch/device.hpp; getting a token to every rank through a file, launch/rendezvous.hpp.
#pragma once

#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "trident/core/error.hpp"

namespace trident {

namespace detail {

inline std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

//! A whole decimal number from an environment variable; the message names the variable.
inline int parse_env_int(const char* name, const std::string& value) {
  int result = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  const auto [end, ec] = std::from_chars(first, last, result);
  if (value.empty() || ec != std::errc{} || end != last) {
    throw usage_error(concat("launch_env: environment variable ", name, "='", value,
                             "' is not a whole number (expected a decimal integer such as 0 or 8)"),
                      "launch_env::detect");
  }
  return result;
}

inline std::optional<int> env_int(const char* name) {
  auto value = env_value(name);
  if (!value) return std::nullopt;
  return parse_env_int(name, *value);
}

inline int require_env_int(const char* launcher, const char* name, const char* seen) {
  auto value = env_int(name);
  if (!value) {
    throw usage_error(concat("launch_env: ", seen, " is set, so this looks like a ", launcher, " launch, but ", name,
                             " is not set; set it or unset the other ", launcher, " variables"),
                      "launch_env::detect");
  }
  return *value;
}

//! Slurm's SLURM_TASKS_PER_NODE, e.g. "4(x2),3": tasks on node `node` (0-based).
inline int slurm_tasks_on_node(const std::string& list, int node) {
  const auto bad = [&]() -> usage_error {
    return usage_error(concat("launch_env: SLURM_TASKS_PER_NODE='", list,
                              "' is not a list like \"4(x2),3\" (tasks per node, with repetitions)"),
                       "launch_env::detect");
  };
  std::size_t at = 0;
  int seen_nodes = 0;
  while (at < list.size()) {
    std::size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(at, comma - at);
    int tasks = 0;
    int repeat = 1;
    const char* first = item.data();
    const char* last = item.data() + item.size();
    auto [end, ec] = std::from_chars(first, last, tasks);
    if (ec != std::errc{} || end == first || tasks < 0) throw bad();
    if (end != last) {
      // "(xN)"
      if (last - end < 4 || end[0] != '(' || end[1] != 'x' || last[-1] != ')') throw bad();
      auto [rend, rec] = std::from_chars(end + 2, last - 1, repeat);
      if (rec != std::errc{} || rend != last - 1 || repeat < 1) throw bad();
    }
    if (node < seen_nodes + repeat) return tasks;
    seen_nodes += repeat;
    at = comma + 1;
  }
  throw usage_error(concat("launch_env: SLURM_NODEID=", node, " but SLURM_TASKS_PER_NODE='", list, "' lists only ",
                           seen_nodes, " nodes"),
                    "launch_env::detect");
}

}  // namespace detail

//! Where this process sits in the job, as its launcher describes it: global rank and size, and
//! rank and process count on this node (which pick the GPU, see select_device()).
//!
//! Read from, in this order (the first launcher with any of its variables set wins):
//!   OpenMPI    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//!              OMPI_COMM_WORLD_LOCAL_SIZE
//!   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//!   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and SLURM_NTASKS_PER_NODE or
//!              SLURM_TASKS_PER_NODE (with SLURM_NODEID)
//! OpenMPI and torchrun come before Slurm because they are routinely started *inside* a Slurm
//! allocation, where the inherited SLURM_* variables describe the allocation or the srun step
//! that started the launcher, not this process. The rank and size variables are required once a
//! launcher is recognised; when the local ones are missing the job is taken to be one node
//! (local_rank = rank, local_size = size) and `source` says so.
//!
//!   auto env = trident::launch_env::detect();
//!   trident::select_device(env);
//!   auto id = trident::nccl_unique_id_from_file("/shared/job42.id", env.rank, std::chrono::minutes(5));
//!   auto comm = trident::nccl_comm::init(id, env.rank, env.size);
struct launch_env {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  //! Which launcher's variables were read ("OpenMPI", "torchrun", "Slurm"), or "none".
  std::string source = "none";

  //! The launcher's view; a single rank (0 of 1, source "none") only when no variable of any
  //! launcher is set. Unparsable or inconsistent values are a usage_error naming the variable.
  static launch_env detect() {
    if (auto env = from_openmpi()) return *env;
    if (auto env = from_torchrun()) return *env;
    if (auto env = from_slurm()) return *env;
    return launch_env{};
  }

  //! Like detect(), but a usage_error when no launcher variable is set at all: for programs
  //! that must never silently run as one rank.
  static launch_env require() {
    launch_env env = detect();
    if (env.source == "none") {
      throw usage_error(
          "launch_env: no launcher variables are set (looked for OMPI_COMM_WORLD_RANK/SIZE from mpirun, "
          "RANK/WORLD_SIZE from torchrun, SLURM_PROCID/SLURM_NTASKS from srun); start the program with a launcher",
          "launch_env::require");
    }
    return env;
  }

 private:
  static bool any_set(std::initializer_list<const char*> names, const char** first_set) {
    for (const char* name : names) {
      if (std::getenv(name) != nullptr) {
        *first_set = name;
        return true;
      }
    }
    return false;
  }

  static launch_env checked(launch_env env, const char* rank_name, const char* size_name, const char* local_rank_name,
                            const char* local_size_name) {
    TRIDENT_EXPECT(env.size >= 1, "launch_env: ", size_name, "=", env.size, " must be at least 1");
    TRIDENT_EXPECT(env.rank >= 0 && env.rank < env.size, "launch_env: ", rank_name, "=", env.rank,
                   " is not a rank of a job of ", size_name, "=", env.size, " processes (expected 0..", env.size - 1,
                   ")");
    TRIDENT_EXPECT(env.local_size >= 1 && env.local_size <= env.size, "launch_env: ", local_size_name, "=",
                   env.local_size, " must be between 1 and ", size_name, "=", env.size);
    TRIDENT_EXPECT(env.local_rank >= 0 && env.local_rank < env.local_size, "launch_env: ", local_rank_name, "=",
                   env.local_rank, " is not a rank of a node with ", local_size_name, "=", env.local_size,
                   " processes (expected 0..", env.local_size - 1, ")");
    return env;
  }

  // The rank on this node from the launcher's two local variables: both set, or neither (one
  // node assumed, and said in `source`); one without the other is a usage_error (half_set()).
  template <class Message>
  void place_on_node(std::optional<int> node_rank, std::optional<int> node_size, const std::string& names,
                     Message half_set) {
    if (node_rank && node_size) {
      local_rank = *node_rank;
      local_size = *node_size;
    } else if (!node_rank && !node_size) {
      local_rank = rank;
      local_size = size;
      source += detail::concat(" (", names, " unset: one node assumed)");
    } else {
      throw usage_error(half_set(), "launch_env::detect");
    }
  }

  // The common shape of OpenMPI's and torchrun's variables.
  static std::optional<launch_env> from_four(const char* launcher, const char* rank_name, const char* size_name,
                                             const char* local_rank_name, const char* local_size_name) {
    const char* seen = nullptr;
    if (!any_set({rank_name, size_name, local_rank_name, local_size_name}, &seen)) return std::nullopt;
    launch_env env;
    env.rank = detail::require_env_int(launcher, rank_name, seen);
    env.size = detail::require_env_int(launcher, size_name, seen);
    const auto local_rank = detail::env_int(local_rank_name);
    const auto local_size = detail::env_int(local_size_name);
    env.source = launcher;
    env.place_on_node(local_rank, local_size, detail::concat(local_rank_name, " and ", local_size_name), [&] {
      return detail::concat("launch_env: ", local_rank ? local_rank_name : local_size_name, " is set but ",
                            local_rank ? local_size_name : local_rank_name, " is not; set both or neither");
    });
    return checked(env, rank_name, size_name, local_rank_name, local_size_name);
  }

  static std::optional<launch_env> from_openmpi() {
    return from_four("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                     "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  static std::optional<launch_env> from_torchrun() {
    return from_four("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  }

  static std::optional<launch_env> from_slurm() {
    const char* seen = nullptr;
    if (!any_set({"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}, &seen)) return std::nullopt;
    launch_env env;
    env.source = "Slurm";
    env.rank = detail::require_env_int("Slurm", "SLURM_PROCID", seen);
    env.size = detail::require_env_int("Slurm", "SLURM_NTASKS", seen);
    const auto local_rank = detail::env_int("SLURM_LOCALID");
    const char* local_size_name = "SLURM_NTASKS_PER_NODE";
    std::optional<int> local_size = detail::env_int("SLURM_NTASKS_PER_NODE");
    if (!local_size) {
      if (auto list = detail::env_value("SLURM_TASKS_PER_NODE")) {
        local_size_name = "SLURM_TASKS_PER_NODE";
        const auto node = detail::env_int("SLURM_NODEID");
        if (node) {
          TRIDENT_EXPECT(*node >= 0, "launch_env: SLURM_NODEID=", *node, " must not be negative");
          local_size = detail::slurm_tasks_on_node(*list, *node);
        } else {
          // Without SLURM_NODEID only a uniform list ("4" or "4(x8)") says how many tasks are here.
          const int first = detail::slurm_tasks_on_node(*list, 0);
          TRIDENT_EXPECT(list->find(',') == std::string::npos, "launch_env: SLURM_TASKS_PER_NODE='", *list,
                         "' differs between nodes and SLURM_NODEID is not set, so the tasks on this node are unknown");
          local_size = first;
        }
      }
    }
    env.place_on_node(local_rank, local_size, "SLURM_LOCALID and SLURM_(N)TASKS_PER_NODE", [&] {
      return std::string(local_rank ? "launch_env: SLURM_LOCALID is set but neither SLURM_NTASKS_PER_NODE nor "
                                      "SLURM_TASKS_PER_NODE is; the tasks on this node are unknown"
                                    : "launch_env: SLURM_LOCALID is not set but the tasks per node are; set both or "
                                      "neither");
    });
    return checked(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_size_name);
  }
};

}  // namespace trident
