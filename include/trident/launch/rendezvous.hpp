// trident/launch/rendezvous.hpp — a small value from rank 0 to every rank through a shared file:
// the bootstrap of a job without MPI (the NCCL unique id, llm.c's way).
//
// Synopsis
//   void publish_file(path, bytes)                    atomic write (temporary file, then rename)
//   void await_file(path, bytes, timeout)             poll until it appears, read exactly bytes
//   T share_via_file<T>(path, rank, timeout, make)    rank 0 makes and publishes, the others wait
#pragma once

#include <unistd.h>  // getpid

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <span>
#include <system_error>
#include <thread>
#include <type_traits>

#include "trident/core/error.hpp"

namespace trident {

//! Writes `bytes` to `path` atomically: into a temporary file next to it, then renamed, so a
//! reader polling for `path` sees either nothing or the whole content.
//!
//!   trident::publish_file("/shared/job42.id", std::as_bytes(std::span(&id, 1)));
inline void publish_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  auto temporary = path;
  temporary += detail::concat(".tmp.", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw error(detail::concat("cannot create '", temporary.string(), "'"), "publish_file");
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw error(detail::concat("cannot write ", bytes.size(), " bytes to '", temporary.string(), "'"),
                          "publish_file");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    throw error(detail::concat("cannot rename '", temporary.string(), "' to '", path.string(), "'"), "publish_file");
  }
}

//! Waits until `path` exists (publish_file made it) and reads exactly `bytes.size()` bytes from
//! it; trident::error naming the path and the timeout when it does not appear in time, or when
//! its size is wrong (a stale or foreign file).
inline void await_file(const std::filesystem::path& path, std::span<std::byte> bytes,
                       std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      const auto size = std::filesystem::file_size(path, ec);
      if (!ec && size != bytes.size()) {
        throw error(detail::concat("'", path.string(), "' has ", size, " bytes, expected ", bytes.size(),
                                   " (a stale or foreign file? use a fresh path for every job)"),
                    "await_file");
      }
      std::ifstream in(path, std::ios::binary);
      if (!ec && in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) return;
    }
    if (std::chrono::steady_clock::now() - start >= timeout) {
      throw error(detail::concat("'", path.string(), "' did not appear within ", timeout.count(),
                                 " ms (did rank 0 start, and does every rank see the same file system?)"),
                  "await_file");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

//! A value made on rank 0 by `make()` and read by every other rank from a shared file. The file
//! must be new for every job: a reader that finds an old one takes its contents (remove it when
//! the job is done, or put the job id in its name).
//!
//!   auto id = trident::share_via_file<my_token>("/shared/token", rank, std::chrono::seconds(60), make_token);
template <class T, std::invocable Make>
  requires std::is_trivially_copyable_v<T> && std::convertible_to<std::invoke_result_t<Make&>, T>
T share_via_file(const std::filesystem::path& path, int rank, std::chrono::milliseconds timeout, Make make) {
  TRIDENT_EXPECT(rank >= 0, "share_via_file: rank ", rank, " is negative");
  T value{};
  if (rank == 0) {
    value = make();
    publish_file(path, std::as_bytes(std::span(&value, 1)));
  } else {
    await_file(path, std::as_writable_bytes(std::span(&value, 1)), timeout);
  }
  return value;
}

}  // namespace trident
