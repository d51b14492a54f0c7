#pragma once
// What the offload tests share (thread ranks and MPI): a scratch directory for the NVMe tier's
// files, the tiers to compare, and "train the MLP with this tier, the parameters by name".
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "trident/offload/nvme.hpp"
#include "trident/offload/store.hpp"
#include "zero/zero_training.hpp"

namespace offload_training {

//! A directory of its own under $TMPDIR (or /tmp), removed with the object.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& tag) {
    static std::atomic<int> counter{0};
    const char* tmp = std::getenv("TMPDIR");
    path = std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") /
           ("trident-offload-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::size_t files() const {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(path)) n += e.is_regular_file() ? 1 : 0;
    return n;
  }
};

//! Small buckets (several pieces per rank) with the state in `placement`.
inline trident::zero::zero_options with(std::shared_ptr<const trident::offload::placement> placement) {
  auto o = zero_training::small_buckets();
  o.offload = std::move(placement);
  return o;
}

}  // namespace offload_training
