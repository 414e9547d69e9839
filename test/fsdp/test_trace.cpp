// trace_recorder writes Chrome trace JSON: metadata, complete events with bucket and bytes.
#include <doctest/doctest.h>

#include <string>

#include <kfsdp/fsdp/trace.hpp>

TEST_CASE("a trace holds its regions as complete events, pid = rank, with bucket and bytes") {
  kfsdp::trace_recorder trace(3);
  {
    auto region = trace.span("forward block 0");
  }
  trace.complete("all_gather", "comm", kfsdp::trace_recorder::comm_lane, trace.now(), 5, 4096);
  kfsdp::trace_recorder::scope nothing(nullptr, "ignored", "compute", 0, -1, 0);  // no recorder: no event
  CHECK(trace.size() == 2);
  const std::string json = trace.json();
  CHECK(json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  CHECK(json.find("\"args\":{\"name\":\"rank 3\"}") != std::string::npos);
  CHECK(json.find("{\"name\":\"forward block 0\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":") != std::string::npos);
  CHECK(json.find("\"pid\":3,\"tid\":1,\"args\":{\"bucket\":5,\"bytes\":4096}}") != std::string::npos);
  CHECK(json.ends_with("\n]}\n"));
  CHECK_THROWS_AS(trace.write("no/such/dir/trace.json"), std::runtime_error);
}
