#pragma once
#include <kfsdp/export.hpp>  // KFSDP_EXPORT: what the module exports
// trace_recorder — a timeline of one rank in the Chrome trace / Perfetto JSON format: every compute
// region (a unit's forward or backward) and every collective (bucket, bytes) as a complete
// event ("ph": "X"), pid = rank, tid 0 = compute, tid 1 = communication. Open the file in
// https://ui.perfetto.dev or chrome://tracing to see where communication overlaps compute.
//
//   kfsdp::trace_recorder trace(rank);
//   engine.set_trace(&trace);                       // collectives
//   { auto region = trace.span("forward transformer.h.0", "compute"); ... }
//   trace.write("step.trace.json");
//   -> {"traceEvents":[{"name":"all_gather","cat":"comm","ph":"X","ts":12.5,"dur":80.1,
//                       "pid":0,"tid":1,"args":{"bucket":3,"bytes":196608}}, ...]}

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kfsdp {

KFSDP_EXPORT class trace_recorder {
 public:
  static constexpr int compute_lane = 0;
  static constexpr int comm_lane = 1;

  explicit trace_recorder(int rank) : rank_(rank), origin_(std::chrono::steady_clock::now()) {}

  // Microseconds since the recorder was made.
  [[nodiscard]] double now() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
  }

  // A region from start (microseconds, from now()) until now.
  void complete(std::string name, std::string category, int lane, double start, std::int64_t bucket = -1,
                std::size_t bytes = 0) {
    events_.push_back({std::move(name), std::move(category), lane, start, now() - start, bucket, bytes});
  }

  // RAII: the region lasts as long as the returned object.
  class scope {
   public:
    scope(trace_recorder* t, std::string name, std::string category, int lane, std::int64_t bucket, std::size_t bytes)
        : trace_(t), name_(std::move(name)), category_(std::move(category)), lane_(lane), bucket_(bucket),
          bytes_(bytes), start_(t ? t->now() : 0) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() {
      if (trace_) trace_->complete(std::move(name_), std::move(category_), lane_, start_, bucket_, bytes_);
    }

   private:
    trace_recorder* trace_;
    std::string name_, category_;
    int lane_;
    std::int64_t bucket_;
    std::size_t bytes_;
    double start_;
  };
  [[nodiscard]] scope span(std::string name, std::string category = "compute", int lane = compute_lane,
                           std::int64_t bucket = -1, std::size_t bytes = 0) {
    return scope(this, std::move(name), std::move(category), lane, bucket, bytes);
  }

  // One region or collective, as json() writes it (start and duration in microseconds).
  struct event {
    std::string name, category;
    int lane;
    double start, duration;
    std::int64_t bucket;
    std::size_t bytes;
  };

  [[nodiscard]] std::size_t size() const noexcept { return events_.size(); }
  // In the order they ended (a region is recorded when it closes).
  [[nodiscard]] const std::vector<event>& events() const noexcept { return events_; }

  // The JSON text of the trace (names are plain: letters, digits, spaces, dots and underscores).
  [[nodiscard]] std::string json() const {
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    out += fmt::format(
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},\n"
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"compute\"}}}},\n"
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":1,\"args\":{{\"name\":\"communication\"}}}}",
        rank_);
    for (const event& e : events_) {
      out += fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}",
                         escaped(e.name), escaped(e.category), e.start, e.duration, rank_, e.lane);
      if (e.bucket >= 0) out += fmt::format(",\"args\":{{\"bucket\":{},\"bytes\":{}}}", e.bucket, e.bytes);
      out += "}";
    }
    return out + "\n]}\n";
  }

  // Writes json() to path (whole, or throws naming the path).
  void write(const std::string& path) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string text = json();
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) throw std::runtime_error("kfsdp::trace_recorder: cannot write the trace file '" + path + "'");
  }

 private:
  static std::string escaped(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out;
  }
  int rank_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<event> events_;
};

}  // namespace kfsdp
