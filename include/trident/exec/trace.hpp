#pragma once
// Timelines of where each rank spends its time, written in Chrome's trace format (open the file
// in https://ui.perfetto.dev or chrome://tracing): one track per rank, spans for compute and
// communication. Host-only, standard library only.
//
//   class trace_recorder     the spans of one rank (one track), kept in memory
//   current_trace()          the recorder the calling thread records into (nullptr: none)
//   class scoped_trace       makes a recorder the calling thread's for a scope
//   class trace_span         RAII: records [construction, destruction) into current_trace()
//   write_chrome_trace(os, recorders)   every recorder's spans as one JSON trace
//   chrome_trace_events(r, origin)       one recorder's events, for ranks in other processes
//
// The library records where it knows what happens: every blocking collective and point-to-
// point call of a communicator ("comm": all_reduce, send, ...; for NCCL that is the time to
// enqueue, not to run), the pipeline executor's forward and backward of each stage and micro-
// batch and its waits for stage messages, and the ZeRO step. A trainer adds its own spans. A
// thread without a recorder pays one thread_local read per span; with one, a span costs a
// clock read at each end and its name.
//
// Thread ranks (local_world) are threads, so each makes its recorder current on its own thread;
// MPI ranks are processes on one machine (or a shared clock): steady_clock is the system's
// monotonic clock, so their spans line up when every rank's events go into one file.
//
//   trident::trace_recorder rec(comm.rank(), "rank " + std::to_string(comm.rank()));
//   {
//     trident::scoped_trace on(rec);
//     trident::trace_span span("forward", "block 3");
//     ...
//   }
//   std::ofstream f("trace.json");
//   trident::write_chrome_trace(f, std::vector<const trident::trace_recorder*>{&rec});
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace trident {

//! One span: what, which kind of work, when (steady_clock).
struct trace_event {
  std::string name;
  const char* category;
  std::chrono::steady_clock::time_point begin, end;
};

//! The spans of one track (a rank). Not thread-safe: one thread records into it at a time.
class trace_recorder {
 public:
  explicit trace_recorder(int track = 0, std::string track_name = {}) : track_(track), track_name_(std::move(track_name)) {}

  void record(std::string name, const char* category, std::chrono::steady_clock::time_point begin,
              std::chrono::steady_clock::time_point end) {
    events_.push_back({std::move(name), category, begin, end});
  }
  std::span<const trace_event> events() const noexcept { return events_; }
  void clear() noexcept { events_.clear(); }
  int track() const noexcept { return track_; }
  const std::string& track_name() const noexcept { return track_name_; }

 private:
  int track_;
  std::string track_name_;
  std::vector<trace_event> events_;
};

//! The recorder of the calling thread, or nullptr when it records nothing.
inline trace_recorder*& current_trace() noexcept {
  thread_local trace_recorder* recorder = nullptr;
  return recorder;
}

//! Makes `r` the calling thread's recorder until the end of the scope (then the previous one).
//! From a pointer, nullptr leaves the thread's recorder as it is: a scope that records only
//! sometimes needs no std::optional<scoped_trace> (whose destructor GCC 12 at -O1 takes for a
//! read of an uninitialised member, an error under -Werror).
//!
//! end() restores the previous recorder before the scope ends.
//!
//!   std::optional<trace_recorder> recorder;
//!   scoped_trace tracing(step == traced ? &recorder.emplace(rank) : nullptr);
//!   ...
//!   tracing.end();  // before writing the recorder out
class scoped_trace {
 public:
  explicit scoped_trace(trace_recorder& r) noexcept : previous_(std::exchange(current_trace(), &r)) {}
  explicit scoped_trace(trace_recorder* r) noexcept
      : previous_(r != nullptr ? std::exchange(current_trace(), r) : current_trace()) {}
  scoped_trace(const scoped_trace&) = delete;
  scoped_trace& operator=(const scoped_trace&) = delete;
  ~scoped_trace() { end(); }
  //! The previous recorder again, now (the destructor then does nothing).
  void end() noexcept {
    if (!active_) return;
    current_trace() = previous_;
    active_ = false;
  }

 private:
  trace_recorder* previous_ = nullptr;
  bool active_ = true;
};

//! Records its lifetime into the calling thread's recorder, if any. The name is built only
//! when recording: pass a string, or a callable that returns one.
class trace_span {
 public:
  template <class Name>
  trace_span(const char* category, Name&& name) : recorder_(current_trace()) {
    if (recorder_ == nullptr) return;
    category_ = category;
    if constexpr (std::is_invocable_v<Name>) name_ = std::string(name());
    else name_ = std::string(std::forward<Name>(name));
    begin_ = std::chrono::steady_clock::now();
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  ~trace_span() {
    if (recorder_ != nullptr) recorder_->record(std::move(name_), category_, begin_, std::chrono::steady_clock::now());
  }

 private:
  trace_recorder* recorder_;
  const char* category_ = "";
  std::string name_;
  std::chrono::steady_clock::time_point begin_{};
};

namespace detail {

inline void json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') os << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) os << ' ';
    else os << c;
  }
  os << '"';
}

}  // namespace detail

//! One recorder's spans as Chrome trace events (comma-separated JSON objects, no brackets):
//! the track's name, then its spans in microseconds from `origin`. Ranks in other processes
//! send these to the one that writes the file (write_chrome_trace does it for one process).
inline std::string chrome_trace_events(const trace_recorder& r, std::chrono::steady_clock::time_point origin) {
  std::ostringstream os;
  auto micros = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - origin).count();
  };
  os << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":" << r.track() << ",\"args\":{\"name\":";
  detail::json_string(os, r.track_name().empty() ? "track " + std::to_string(r.track()) : r.track_name());
  os << "}}";
  for (const auto& e : r.events()) {
    os << ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":" << r.track() << ",\"cat\":";
    detail::json_string(os, e.category);
    os << ",\"name\":";
    detail::json_string(os, e.name);
    // Fixed-point microseconds: the stream's default 6 digits would round a span after 1 s.
    char times[64];
    std::snprintf(times, sizeof times, ",\"ts\":%.3f,\"dur\":%.3f}", micros(e.begin), micros(e.end) - micros(e.begin));
    os << times;
  }
  return os.str();
}

//! The earliest span of a recorder (time_point::max() when it has none).
inline std::chrono::steady_clock::time_point earliest(const trace_recorder& r) noexcept {
  auto t = std::chrono::steady_clock::time_point::max();
  for (const auto& e : r.events()) t = std::min(t, e.begin);
  return t;
}

//! A whole Chrome trace (JSON object format) around event lists from chrome_trace_events.
inline void write_chrome_trace(std::ostream& os, std::span<const std::string> event_lists) {
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  for (const auto& list : event_lists) {
    if (list.empty()) continue;
    if (!first) os << ",\n";
    first = false;
    os << list;
  }
  os << "]}\n";
}

//! The spans of `recorders` as one Chrome trace: process 0, one thread per recorder (its track,
//! named by its track name), times in microseconds from the earliest span.
inline void write_chrome_trace(std::ostream& os, std::span<const trace_recorder* const> recorders) {
  auto origin = std::chrono::steady_clock::time_point::max();
  for (const auto* r : recorders) origin = std::min(origin, earliest(*r));
  std::vector<std::string> lists;
  for (const auto* r : recorders) lists.push_back(chrome_trace_events(*r, origin));
  write_chrome_trace(os, std::span<const std::string>(lists));
}

}  // namespace trident
