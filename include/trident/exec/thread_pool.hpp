// trident/exec/thread_pool.hpp — where host work runs: a pool of threads that lives as long as
// the program, instead of threads started for every call.
//
// Synopsis
//   class thread_pool
//     explicit thread_pool(unsigned workers)       that many worker threads (0: the caller only)
//     static thread_pool& shared()                 hardware_concurrency - 1 workers, made on first use
//     unsigned concurrency() const                 workers + the calling thread
//     void parallel_for(std::size_t tasks, fn)     fn(i) for every i in [0, tasks); returns when all
//                                                  are done and rethrows the first exception
//
// The calling thread takes tasks of its own job too, so a job always progresses even when every
// worker is busy with other callers' jobs (thread ranks share one pool: each rank's optimizer
// step is a job). Which thread runs task i is not fixed; callers that need reproducible results
// make each task's arithmetic independent of that (the host optimizer step does).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace trident {

//! A fixed set of worker threads running parallel_for jobs.
//!
//!   trident::thread_pool::shared().parallel_for(chunks, [&](std::size_t c) { update(c); });
class thread_pool {
 public:
  explicit thread_pool(unsigned workers) {
    threads_.reserve(workers);
    for (unsigned w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  //! One pool for the whole program: hardware_concurrency - 1 workers (the caller is the last).
  static thread_pool& shared() {
    static thread_pool pool(std::max(1u, std::thread::hardware_concurrency()) - 1);
    return pool;
  }

  unsigned concurrency() const noexcept { return static_cast<unsigned>(threads_.size()) + 1; }

  //! Runs fn(i) for i in [0, tasks) on the workers and the calling thread; returns when every
  //! task is done. The first exception a task throws is rethrown here (the others still run).
  template <class Fn>
  void parallel_for(std::size_t tasks, const Fn& fn) {
    if (tasks == 0) return;
    if (tasks == 1 || threads_.empty()) {
      for (std::size_t i = 0; i < tasks; ++i) fn(i);
      return;
    }
    job j;
    j.total = tasks;
    j.run = [&fn](std::size_t i) { fn(i); };
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(&j);
    }
    wake_.notify_all();
    take_tasks(j);  // the caller works on its own job too
    std::unique_lock lock(mutex_);
    // Not only every task finished: no worker may still hold the job (it lives on this stack).
    done_.wait(lock, [&] { return j.finished == j.total && j.active == 0; });
    if (auto it = std::find(jobs_.begin(), jobs_.end(), &j); it != jobs_.end()) jobs_.erase(it);
    if (j.failure) std::rethrow_exception(j.failure);
  }

 private:
  struct job {
    std::function<void(std::size_t)> run;
    std::size_t total = 0;
    std::atomic<std::size_t> next{0};
    std::size_t finished = 0;  // under mutex_
    std::size_t active = 0;    // workers inside take_tasks(*this), under mutex_
    std::exception_ptr failure;  // under mutex_
  };

  // Claims and runs tasks of j until none is left to claim.
  void take_tasks(job& j) {
    for (;;) {
      const std::size_t i = j.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= j.total) return;
      std::exception_ptr failure;
      try {
        j.run(i);
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      if (failure && !j.failure) j.failure = failure;
      if (++j.finished == j.total) done_.notify_all();
    }
  }

  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job* j = jobs_.front();
      // Every task of it claimed: take it off the queue (its caller waits for the stragglers).
      if (j->next.load(std::memory_order_relaxed) >= j->total) {
        jobs_.pop_front();
        continue;
      }
      ++j->active;
      lock.unlock();
      take_tasks(*j);
      lock.lock();
      if (!jobs_.empty() && jobs_.front() == j) jobs_.pop_front();
      if (--j->active == 0 && j->finished == j->total) done_.notify_all();  // j may be gone after this
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<job*> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace trident
