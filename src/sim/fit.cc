// Fixed batches as the simulator's shape, and fitting a profile's linear MFU
// and attention level to measured colocated training steps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "distca/plan.h"
#include "distca/sim.h"
#include "sim/costs.h"

namespace distca {
namespace {

// Every table's scale times f, the efficiency curve divided by f: core
// attention's time, whichever of them serves the model, times f.
void ScaleAttention(double f, HardwareProfile* hw) {
  for (AttentionTable& t : hw->attention_tables) t.scale *= f;
  for (auto& point : hw->attention_efficiency) point.second /= f;
}

// The colocated strategy's predicted iteration of one batch.
Status ColocatedSeconds(const SimOptions& options, const std::vector<int64_t>& batch, double* seconds) {
  std::vector<SimResult> r;
  DISTCA_RETURN_IF_ERROR(Simulate(options, {batch}, {SimStrategy::kColocated}, &r));
  *seconds = r.at(0).iteration_s;
  return Status::Ok();
}

}  // namespace

Status ShapeFromBatches(const std::vector<std::vector<int64_t>>& batches, SimOptions* o) {
  if (o == nullptr) return Status::InvalidArgument("options is null");
  if (o->tp <= 0 || o->pp <= 0 || o->gpus <= 0 || o->gpus % (int64_t{o->tp} * o->pp) != 0)
    return Status::InvalidArgument(
        fmt::format("gpus ({}) must be a positive multiple of tp x pp ({} x {})", o->gpus, o->tp, o->pp));
  if (batches.empty()) return Status::InvalidArgument("no batches");
  const int ranks = static_cast<int>(o->gpus / (int64_t{o->tp} * o->pp));
  int64_t total = -1;
  for (size_t b = 0; b < batches.size(); ++b) {
    int64_t t = 0;
    for (int64_t len : batches[b]) {
      // Sums stay far from overflow: every length and the running total are
      // at most the limit.
      if (len > kMaxSimIterationTokens - t)
        return Status::OutOfRange(fmt::format(
            "batches[{}] holds more than the simulator's limit of {} tokens per iteration", b, kMaxSimIterationTokens));
      t += len;
    }
    if (total >= 0 && t != total)
      return Status::InvalidArgument(
          fmt::format("batches[{}] holds {} tokens, batches[0] {}: every batch must hold the same total", b, t, total));
    total = t;
  }
  if (total <= 0 || total % ranks != 0)
    return Status::InvalidArgument(fmt::format(
        "the batch total {} is not a positive multiple of the {} ranks per stage (gpus / (tp x pp))", total, ranks));
  o->max_doc_len = total / ranks;
  o->batch_size = ranks;
  return Status::Ok();
}

Status EfficiencyCurveFromTable(std::string_view csv, double peak_flops, int q_heads, int head_dim,
                                double backward_factor, std::vector<std::pair<double, double>>* curve) {
  if (curve == nullptr) return Status::InvalidArgument("curve is null");
  if (!(peak_flops > 0) || q_heads <= 0 || head_dim <= 0 || !(backward_factor >= 1))
    return Status::InvalidArgument("peak_flops, q_heads and head_dim must be positive, backward_factor >= 1");
  CostModel table;
  DISTCA_RETURN_IF_ERROR(CostModel::FromTableCsv(std::string(csv), &table));
  curve->clear();
  // The grid's whole-document cells (q_len == kv_len), as the table parsed
  // them (any number format it takes).
  const std::vector<double>& qs = table.q_grid();
  const std::vector<double>& kvs = table.kv_grid();
  for (size_t qi = 0; qi < qs.size(); ++qi) {
    const auto kv = std::find(kvs.begin(), kvs.end(), qs[qi]);
    if (kv == kvs.end()) continue;
    const double q = qs[qi], seconds = table.grid_seconds()[qi * kvs.size() + size_t(kv - kvs.begin())];
    const double flops = (1 + backward_factor) * 4.0 * (0.5 * q * (q + 1)) * head_dim * q_heads;
    curve->emplace_back(q, std::min(1.0, flops / (peak_flops * seconds)));
  }
  if (curve->empty()) return Status::InvalidArgument("the table has no whole-document (q_len == kv_len) task");
  std::sort(curve->begin(), curve->end());
  return Status::Ok();
}

Status MeasuredBackwardFactor(const AttentionTable& table, double* factor, double* median_out) {
  if (factor == nullptr) return Status::InvalidArgument("factor is null");
  CostModel total;
  std::optional<CostModel> forward_table;
  DISTCA_RETURN_IF_ERROR(sim::ParseAttentionTable(table, &total, &forward_table));
  if (!forward_table) return Status::InvalidArgument("attention table '" + table.file + "' has no forward table");
  const CostModel& forward = *forward_table;
  std::vector<double> ratios;
  const std::vector<double>& qs = total.q_grid();
  const std::vector<double>& kvs = total.kv_grid();
  for (size_t i = 0; i < qs.size(); ++i) {
    for (size_t k = 0; k < kvs.size(); ++k) {
      if (kvs[k] != qs[i]) continue;
      const double f = forward.grid_seconds()[i * kvs.size() + k], fb = total.grid_seconds()[i * kvs.size() + k];
      ratios.push_back((fb - f) / f);
    }
  }
  if (ratios.empty())
    return Status::InvalidArgument("attention table '" + table.file + "' has no whole-document (q_len == kv_len) task");
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double median = n % 2 == 1 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  *factor = std::clamp(median, 1.0, 100.0);
  if (median_out != nullptr) *median_out = median;
  return Status::Ok();
}

Status FitColocatedSteps(const std::vector<MeasuredStep>& steps, SimOptions* options, ProfileFit* fit) {
  if (options == nullptr || fit == nullptr) return Status::InvalidArgument("options and fit must not be null");
  if (steps.size() < 2)
    return Status::InvalidArgument(
        fmt::format("fitting two constants needs at least two measured steps, got {}", steps.size()));
  // Per step, seconds(u, s) with the linear time multiplied by u and the
  // attention time by s. Where every rank takes part in every exchange the
  // ranks' clocks meet at each one and seconds = c + u a + s b exactly; a
  // rank with no bytes in an exchange runs on unsynchronized, which makes
  // it piecewise linear. So: linearize around the current (u, s) from three
  // simulations per step (u and s each doubled), solve the least squares for
  // the multipliers of u and s, and repeat from the solution until they
  // settle (exact in one round where the time is linear over the doubling).
  const HardwareProfile base = options->hardware;
  std::vector<SimOptions> shaped;
  for (size_t i = 0; i < steps.size(); ++i) {
    const MeasuredStep& step = steps[i];
    if (!(step.step_s > 0) || !std::isfinite(step.step_s))
      return Status::InvalidArgument(fmt::format("step {}: measured time must be positive, got {}", i, step.step_s));
    SimOptions o = *options;
    DISTCA_RETURN_IF_ERROR(ShapeFromBatches({step.lengths}, &o).WithContext(fmt::format("step {}", i)));
    shaped.push_back(std::move(o));
  }
  // Step i's simulated seconds with linear time x u and attention x s.
  auto seconds_at = [&](size_t i, double u, double s, double* t) {
    SimOptions o = shaped[i];
    o.hardware = base;
    o.hardware.linear_mfu = base.linear_mfu / u;
    ScaleAttention(s, &o.hardware);
    return ColocatedSeconds(o, steps[i].lengths, t).WithContext(fmt::format("step {}", i));
  };
  // Nothing runs faster than the device's peak: where a table would (or the
  // efficiency curve, when it serves the model, would pass 1), the
  // attention factor is bounded below. peak_flops is itself measured (one
  // thread's sgemm rate on the cpu profile, which a near-peak attention
  // kernel can match within noise), so a solution within kPeakSlack of the
  // bound is held at it, the linear multiplier refitted alone; one further
  // below is refused by the checks after the fit.
  constexpr double kPeakSlack = 1.1;
  const bool table_serves = sim::RankCosts(options->model, base, options->tp).measured_attention();
  double s_floor = 0;
  for (const AttentionTable& t : base.attention_tables) {
    double least = 0;
    DISTCA_RETURN_IF_ERROR(MinimumTableScale(t, base.peak_flops, &least).WithContext("table '" + t.file + "'"));
    if (t.scale > 0) s_floor = std::max(s_floor, least / t.scale);
  }
  if (!table_serves)
    for (const auto& [q, f] : base.attention_efficiency) s_floor = std::max(s_floor, f);
  s_floor *= 1 + 1e-9;  // held at the bound, a table passes its check despite rounding
  bool at_peak = false;
  double u = 1, s = 1;
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    // Per step around (u, s): seconds(x u, y s) = c + x a + y b.
    double saa = 0, sab = 0, sbb = 0, sar = 0, sbr = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      double t11 = 0, t21 = 0, t12 = 0;
      DISTCA_RETURN_IF_ERROR(seconds_at(i, u, s, &t11));
      DISTCA_RETURN_IF_ERROR(seconds_at(i, 2 * u, s, &t21));
      DISTCA_RETURN_IF_ERROR(seconds_at(i, u, 2 * s, &t12));
      const double a = t21 - t11, b = t12 - t11, c = t11 - a - b, m = steps[i].step_s;
      // Least squares in relative error: rows (a, b) / m, right side (m - c) / m.
      const double x = a / m, y = b / m, r = (m - c) / m;
      saa += x * x;
      sab += x * y;
      sbb += y * y;
      sar += x * r;
      sbr += y * r;
    }
    // det / (saa sbb) is the squared sine of the angle between the linear
    // and attention columns: below 1e-3 (about 2 degrees) measurement noise
    // of a few percent would swing the two constants by far more than that.
    const double det = saa * sbb - sab * sab, sin2 = det / (saa * sbb);
    if (!(sin2 > 1e-3))
      return Status::InvalidArgument(fmt::format(
          "the measured steps do not tell linear from attention time apart (their attention shares are too alike: "
          "sin^2 of the angle between them is {:.2g}, needs > 1e-3)",
          sin2));
    double x = (sar * sbb - sbr * sab) / det, y = (saa * sbr - sab * sar) / det;
    at_peak = y * s < s_floor && y * s >= s_floor / kPeakSlack;
    if (at_peak) {
      // The attention multiplier at the bound, the linear one the least
      // squares for it.
      y = s_floor / s;
      x = (sar - y * sab) / saa;
    }
    if (!(x > 0) || !(y > 0))
      return Status::InvalidArgument(fmt::format(
          "the fit gives a non-positive {} time multiplier ({}): the measured steps are not explained by the model",
          x > 0 ? "attention" : "linear", x > 0 ? y * s : x * u));
    u *= x;
    s *= y;
    if (std::abs(x - 1) < 1e-12 && std::abs(y - 1) < 1e-12) break;
  }
  HardwareProfile fitted = base;
  fitted.linear_mfu = base.linear_mfu / u;
  ScaleAttention(s, &fitted);
  if (fitted.linear_mfu > 1)
    return Status::InvalidArgument(
        fmt::format("the fitted linear MFU {:.3f} exceeds 1: is peak_flops ({:.4g}) too low?", fitted.linear_mfu,
                    fitted.peak_flops));
  // The curve must stay a fraction of peak. Where a table serves the model
  // the curve serves other head shapes only and is capped at 1; where the
  // curve itself was fitted, a fraction above 1 is an error.
  for (auto& [q, f] : fitted.attention_efficiency) {
    if (f <= 1 + 1e-9) {  // at the bound, within rounding
      f = std::min(f, 1.0);
      continue;
    }
    if (!table_serves)
      return Status::InvalidArgument(fmt::format(
          "the fitted attention efficiency at {} query rows is {:.3f}, above 1: is peak_flops ({:.4g}) too low?", q, f,
          fitted.peak_flops));
    f = 1.0;
  }
  for (const AttentionTable& t : fitted.attention_tables)
    DISTCA_RETURN_IF_ERROR(ValidateAttentionTable(t, fitted.peak_flops)
                               .WithContext(fmt::format("the fitted attention level (x {:.3f})", s)));
  ProfileFit out;
  out.linear_mfu = fitted.linear_mfu;
  out.attention_factor = s;
  out.attention_at_peak = at_peak;
  // The predictions are what the fitted profile simulates.
  for (size_t i = 0; i < steps.size(); ++i) {
    SimOptions o = shaped[i];
    o.hardware = fitted;
    double p = 0;
    DISTCA_RETURN_IF_ERROR(ColocatedSeconds(o, steps[i].lengths, &p).WithContext(fmt::format("step {}", i)));
    out.predicted_s.push_back(p);
    out.max_relative_error = std::max(out.max_relative_error, std::abs(p / steps[i].step_s - 1));
  }
  options->hardware = std::move(fitted);
  *fit = std::move(out);
  return Status::Ok();
}

}  // namespace distca
