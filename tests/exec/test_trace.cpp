// exec/trace.hpp: spans go to the calling thread's recorder and nowhere without one; the Chrome
// trace names each track and writes times in microseconds from the earliest span.
#include <doctest/doctest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trident/exec/trace.hpp"

TEST_CASE("trace: spans go to the calling thread's recorder, names are built only when recording") {
  int built = 0;
  auto name = [&] {
    ++built;
    return std::string("lazy");
  };
  { const trident::trace_span nothing("compute", name); }
  CHECK(built == 0);  // no recorder: the name was never made
  CHECK(trident::current_trace() == nullptr);
  trident::trace_recorder rec(3, "rank 3");
  {
    const trident::scoped_trace on(rec);
    CHECK(trident::current_trace() == &rec);
    const trident::trace_span outer("forward", "outer");
    { const trident::trace_span inner("comm", name); }
    std::thread other([] { CHECK(trident::current_trace() == nullptr); });  // per thread
    other.join();
  }
  CHECK(trident::current_trace() == nullptr);
  CHECK(built == 1);
  REQUIRE(rec.events().size() == 2);
  CHECK(rec.events()[0].name == "lazy");  // the inner span ends first
  CHECK(std::string(rec.events()[0].category) == "comm");
  CHECK(rec.events()[1].name == "outer");
  CHECK(rec.events()[1].begin <= rec.events()[0].begin);
  CHECK(rec.events()[0].end <= rec.events()[1].end);
}

TEST_CASE("trace: a scoped_trace from nullptr keeps the thread's recorder; end() restores it early") {
  trident::trace_recorder outer(0), inner(1);
  const trident::scoped_trace a(outer);
  {
    const trident::scoped_trace none(static_cast<trident::trace_recorder*>(nullptr));
    CHECK(trident::current_trace() == &outer);
  }
  CHECK(trident::current_trace() == &outer);
  {
    trident::scoped_trace b(&inner);
    CHECK(trident::current_trace() == &inner);
    b.end();
    CHECK(trident::current_trace() == &outer);
    const trident::scoped_trace c(inner);  // b's destructor must not undo c
  }
  CHECK(trident::current_trace() == &outer);
}

TEST_CASE("trace: the Chrome trace has one named track per recorder and fixed-point microseconds") {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  trident::trace_recorder a(0, "rank 0"), b(1, "rank \"1\"");
  a.record("F0 mb 0", "forward", t0 + std::chrono::seconds(2), t0 + std::chrono::milliseconds(2500));
  b.record("all_reduce", "comm", t0, t0 + std::chrono::microseconds(1500));
  std::ostringstream os;
  const std::vector<const trident::trace_recorder*> both{&a, &b};
  trident::write_chrome_trace(os, both);
  const std::string json = os.str();
  CHECK(json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  CHECK(json.find(R"("args":{"name":"rank 0"})") != std::string::npos);
  CHECK(json.find(R"("args":{"name":"rank \"1\""})") != std::string::npos);  // escaped
  // Times from the earliest span (b's), in microseconds: 2 s later is 2000000.000, not 2e+06.
  CHECK(json.find(R"("name":"F0 mb 0","ts":2000000.000,"dur":500000.000})") != std::string::npos);
  CHECK(json.find(R"("tid":1,"cat":"comm","name":"all_reduce","ts":0.000,"dur":1500.000})") != std::string::npos);
}
