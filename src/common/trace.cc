#include "distca/trace.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace distca {
namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Tracer::Tracer() : epoch_ns_(SteadyNs()) {}

double Tracer::NowUs() const { return double(SteadyNs() - epoch_ns_) * 1e-3; }

void Tracer::Add(TraceSpan span) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(span));
}

std::vector<TraceSpan> Tracer::Spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

std::string Tracer::ToChromeJson() const {
  nlohmann::json events = nlohmann::json::array();
  for (const TraceSpan& s : Spans()) {
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"ts", s.start_us},
                      {"dur", s.end_us - s.start_us},
                      {"pid", s.rank},
                      {"tid", s.thread},
                      {"args", {{"bytes", s.bytes}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

Status Tracer::WriteChromeJson(const std::string& path) const { return WriteTextFile(path, ToChromeJson()); }

Tracer::Scope::Scope(Tracer* tracer, int rank, std::string thread, std::string name, int64_t bytes) : tracer_(tracer) {
  if (tracer_ == nullptr) return;
  span_ = {rank, std::move(thread), std::move(name), tracer_->NowUs(), 0, bytes};
}

Tracer::Scope::~Scope() {
  if (tracer_ == nullptr) return;
  span_.end_us = tracer_->NowUs();
  tracer_->Add(std::move(span_));
}

}  // namespace distca
