// Tracing: compute and comm spans, written as Chrome trace JSON (open in
// chrome://tracing or https://ui.perfetto.dev). docs/tracing.md explains how
// to read a distca trace.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "distca/status.h"

namespace distca {

struct TraceSpan {
  int rank = 0;
  std::string thread;  // "compute" or "comm"
  std::string name;
  double start_us = 0;  // since the tracer's epoch
  double end_us = 0;
  int64_t bytes = 0;  // bytes moved by a comm span, else 0
};

// Thread-safe span recorder. One per process; spans of every rank (thread)
// go into it.
class Tracer {
 public:
  Tracer();
  double NowUs() const;
  void Add(TraceSpan span);
  std::vector<TraceSpan> Spans() const;
  // {"traceEvents": [...]}: one complete event ("ph": "X") per span, pid =
  // rank, tid = thread, args.bytes.
  std::string ToChromeJson() const;
  Status WriteChromeJson(const std::string& path) const;

  // Records [construction, destruction) as a span; no-op for a null tracer.
  class Scope {
   public:
    Scope(Tracer* tracer, int rank, std::string thread, std::string name, int64_t bytes = 0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* tracer_;
    TraceSpan span_;
  };

 private:
  int64_t epoch_ns_;
  mutable std::mutex mu_;
  std::vector<TraceSpan> spans_;
};

}  // namespace distca
