// trident/exec/cuda/stream.hpp — where GPU work runs: streams, events, the current device, and
// asynchronous copies ordered on a stream. Host code over the CUDA runtime (no nvcc needed).
//
// Synopsis (only with TRIDENT_HAS_CUDA: link trident::cuda, or compile with nvcc)
//   class device_guard          makes a device current for a scope, restores the previous one
//   struct device_attributes    SM count, memory, compute capability: read once per device
//     static const device_attributes& of(int device)
//   class cuda_event            RAII cudaEvent_t (timing off unless asked): record(stream),
//                               make stream wait on it, synchronize(), query(), elapsed_ms()
//   class cuda_stream           RAII non-blocking stream on a device: get(), synchronize(),
//                               wait(event), record() -> cuda_event
//   class cuda_context          a device and a compute stream; what trident's CUDA work is
//                               enqueued on. order_after(other stream): the compute stream
//                               waits for work already queued there (llm.c's compute -> NCCL
//                               hand-off, both ways), without blocking the host
//   void copy_async(ctx, dst, src)       cudaMemcpyAsync between any spans on ctx's stream
//   void fill_zero_async(ctx, dst)       cudaMemsetAsync on ctx's stream
//
// Why a context of its own: the CUDA ZeRO engine borrowed the NCCL communicator's stream and
// buffer copies were synchronous calls on the legacy default stream, so compute and
// communication were serialised and correctness hung on which stream NCCL used. Tensor and
// pipeline parallelism need compute on its own stream, ordered against each communicator's
// stream by events. Nothing here allocates or synchronises per call (events are made once), so
// the work can be captured into a CUDA graph.
#pragma once

#include "trident/core/config.hpp"

#if TRIDENT_HAS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"

namespace trident {

//! Makes `device` current on this thread for the scope; the previous device comes back after.
//!
//!   { trident::device_guard on(1); /* allocations and launches go to GPU 1 */ }
class device_guard {
 public:
  explicit device_guard(int device) {
    TRIDENT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) TRIDENT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~device_guard() { (void)cudaSetDevice(previous_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
};

//! What kernels' launch configurations need to know about a device, read from the driver once
//! per device and process (as CUB caches them) instead of per launch.
struct device_attributes {
  int device = 0;
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  int max_threads_per_sm = 0;
  std::size_t total_memory = 0;

  static const device_attributes& of(int device) {
    static std::mutex mutex;
    static std::map<int, device_attributes> cache;
    std::lock_guard lock(mutex);
    auto it = cache.find(device);
    if (it != cache.end()) return it->second;
    device_attributes a;
    a.device = device;
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&a.sm_count, cudaDevAttrMultiProcessorCount, device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&a.major, cudaDevAttrComputeCapabilityMajor, device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&a.minor, cudaDevAttrComputeCapabilityMinor, device));
    TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&a.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    cudaDeviceProp props{};
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
    a.total_memory = props.totalGlobalMem;
    return cache.emplace(device, a).first->second;
  }
};

//! An owned CUDA event. Timing is off by default (cheaper to record and to wait on).
class cuda_event {
 public:
  explicit cuda_event(bool timing = false) {
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  cuda_event(cuda_event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  cuda_event& operator=(cuda_event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() { reset(); }

  cudaEvent_t get() const noexcept { return event_; }
  //! Marks the point in `stream` after everything queued there so far.
  void record(cudaStream_t stream) { TRIDENT_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  //! Makes `stream` wait (on the device, not the host) until this event has happened.
  void make_wait(cudaStream_t stream) const { TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  void synchronize() const { TRIDENT_CUDA_CHECK(cudaEventSynchronize(event_)); }
  //! True when the work before the recorded point is done.
  bool query() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    TRIDENT_CUDA_CHECK(status);
    return true;
  }
  //! Milliseconds between `start` and this event (both recorded with timing on).
  float elapsed_ms(const cuda_event& start) const {
    float ms = 0;
    TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  void reset() noexcept {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

//! An owned stream on a device. Non-blocking: it does not synchronise with the legacy default
//! stream, so work on it is ordered only by events (trident never relies on the legacy stream).
class cuda_stream {
 public:
  explicit cuda_stream(int device, int priority = 0) : device_(device) {
    device_guard on(device);
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  }
  cuda_stream(cuda_stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}
  cuda_stream& operator=(cuda_stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = std::exchange(other.stream_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() { reset(); }

  cudaStream_t get() const noexcept { return stream_; }
  int device() const noexcept { return device_; }
  void synchronize() const { TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  //! This stream waits for `event` (recorded on any stream of the same device).
  void wait(const cuda_event& event) const { event.make_wait(stream_); }

 private:
  void reset() noexcept {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

//! Where trident's GPU work runs: one device and a compute stream of its own, plus one event
//! for hand-offs (made once, reused: no allocation per step). A trainer makes one per device
//! and keeps it as long as it trains.
//!
//!   trident::cuda_context ctx(device);
//!   launch_forward(ctx.stream());
//!   ctx.hand_to(nccl.stream());        // NCCL's stream waits for the forward's output
//!   nccl.all_reduce(grads);
//!   ctx.order_after(nccl.stream());    // compute waits for the all-reduce, host never blocks
class cuda_context {
 public:
  explicit cuda_context(int device = current_device()) : device_(device), stream_(device), ready_() {}

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_.get(); }
  const device_attributes& attributes() const { return device_attributes::of(device_); }

  //! The compute stream waits for everything already queued on `other` (e.g. a communicator's
  //! stream); the host does not block.
  void order_after(cudaStream_t other) {
    if (other == stream_.get()) return;
    ready_.record(other);
    ready_.make_wait(stream_.get());
  }
  //! `other` waits for everything already queued on the compute stream.
  void hand_to(cudaStream_t other) {
    if (other == stream_.get()) return;
    ready_.record(stream_.get());
    ready_.make_wait(other);
  }
  void synchronize() const { stream_.synchronize(); }

  static int current_device() {
    int device = 0;
    TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }

 private:
  int device_;
  cuda_stream stream_;
  cuda_event ready_;  // reused for every hand-off: recording again is legal once waits are queued
};

//! Copies every element of `src` into `dst` (any spaces) on the context's stream, ordered with
//! the rest of its work. Between device memory and pinned host memory the host does not block;
//! with pageable host memory CUDA finishes the copy before returning (use pinned_host_space for
//! overlap). Sizes must match.
template <class T>
void copy_async(const cuda_context& ctx, std::span<T> dst, std::span<const std::type_identity_t<T>> src) {
  TRIDENT_EXPECT(dst.size() == src.size(), "copy_async: destination has ", dst.size(), " elements, source ", src.size());
  if (src.empty()) return;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault, ctx.stream()));
}
template <class T, memory_space To, memory_space From>
void copy_async(const cuda_context& ctx, buffer<T, To>& dst, const buffer<T, From>& src) {
  copy_async(ctx, std::span<T>(dst.data(), dst.size()), std::span<const T>(src.data(), src.size()));
}

//! Sets every byte of `dst` to zero on the context's stream.
template <class T, memory_space Space>
void fill_zero_async(const cuda_context& ctx, buffer<T, Space>& dst) {
  if (dst.size() == 0) return;
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(dst.data(), 0, dst.size() * sizeof(T), ctx.stream()));
}

}  // namespace trident
#endif  // TRIDENT_HAS_CUDA
