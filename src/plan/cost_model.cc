// The planner's cost model: causal pairs, FLOPs, and measured-time tables.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "distca/plan.h"

namespace distca {

CostModel CostModel::Flops(const PlanModel& model) {
  CostModel c;
  c.flops_per_pair_ = 4.0 * model.head_dim * model.q_heads;
  return c;
}

namespace {

// floor(log2(x)) for a normal positive x (std::ilogb's value, without its
// library call): the exponent bits less the bias.
int BinaryExponent(double x) { return int((std::bit_cast<uint64_t>(x) >> 52) & 0x7ff) - 1023; }

// Index i with grid[i] <= x <= grid[i + 1] (x clamped into the grid; the
// last i <= size - 2 with grid[i] <= x), and the interpolation weight of
// grid[i + 1]. Grid points are at least 1 (FromTableCsv checks q_len >= 1).
template <typename Octaves>
std::pair<size_t, double> Bracket(const std::vector<double>& grid, const Octaves& octaves, double x) {
  if (grid.size() == 1) return {0, 0.0};
  x = std::clamp(x, grid.front(), grid.back());
  // The cell lies between x's octave's start and the next octave's (the
  // axis's last cell for the last octave): one comparison on a
  // power-of-two grid, a binary search over the octave's points on a
  // denser one.
  const size_t k = size_t(BinaryExponent(x) - octaves.base);
  const size_t lo = octaves.start[k], hi = k + 1 < octaves.start.size() ? octaves.start[k + 1] : grid.size() - 2;
  const auto first = grid.begin() + std::ptrdiff_t(lo) + 1, last = grid.begin() + std::ptrdiff_t(hi) + 1;
  const size_t i = size_t(std::upper_bound(first, last, x) - grid.begin()) - 1;
  return {i, (x - grid[i]) / (grid[i + 1] - grid[i])};
}

}  // namespace

CostModel::Octaves CostModel::OctavesOf(const std::vector<double>& grid) {
  Octaves o;
  if (grid.size() < 2) return o;
  o.base = BinaryExponent(grid.front());
  for (int e = o.base; e <= BinaryExponent(grid.back()); ++e) {
    const double edge = std::ldexp(1.0, e);
    size_t i = static_cast<size_t>(std::upper_bound(grid.begin(), grid.end(), edge) - grid.begin());
    i = std::clamp<size_t>(i, 1, grid.size() - 1) - 1;
    o.start.push_back(static_cast<uint32_t>(i));
  }
  return o;
}

double CostModel::TableSeconds(double q_len, double kv_len) const {
  const size_t nk = kv_grid_.size();
  auto at = [&](size_t qi, size_t ki) { return seconds_[qi * nk + ki]; };
  const auto [qi, qw] = Bracket(q_grid_, q_octaves_, q_len);
  const auto [ki, kw] = Bracket(kv_grid_, kv_octaves_, kv_len);
  const size_t qj = std::min(qi + 1, q_grid_.size() - 1);
  const size_t kj = std::min(ki + 1, nk - 1);
  const double interpolated =
      (1 - qw) * ((1 - kw) * at(qi, ki) + kw * at(qi, kj)) + qw * ((1 - kw) * at(qj, ki) + kw * at(qj, kj));
  // Outside the grid, scale from the clamped point by the causal-pair ratio.
  const double qc = std::clamp(q_len, q_grid_.front(), q_grid_.back());
  const double kc = std::clamp(kv_len, kv_grid_.front(), kv_grid_.back());
  if (qc == q_len && kc == kv_len) return interpolated;
  const double inside = CausalPairsReal(std::min(qc, kc), kc);
  return inside > 0 ? interpolated * CausalPairsReal(q_len, kv_len) / inside : interpolated;
}

Status CostModel::FromTableCsv(std::string_view csv_text, CostModel* model) {
  if (model == nullptr) return Status::InvalidArgument("model is null");
  std::istringstream in{std::string(csv_text)};
  std::string line;
  int line_no = 0;
  std::map<std::pair<double, double>, double> points;
  bool header = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      if (line != "q_len,kv_len,seconds")
        return Status::InvalidArgument(fmt::format("table line {}: expected header 'q_len,kv_len,seconds'", line_no));
      header = true;
      continue;
    }
    // A bound on the parse and on the grid a lookup searches: a full
    // triangle of 4.5 million rows took 25 s and 660 MB to load.
    if (int64_t(points.size()) == kMaxTableRows)
      return Status::InvalidArgument(
          fmt::format("table line {}: more than {} data rows, the limit of a table", line_no, kMaxTableRows));
    double q = 0, kv = 0, s = 0;
    char c1 = 0, c2 = 0;
    std::istringstream row(line);
    if (!(row >> q >> c1 >> kv >> c2 >> s) || c1 != ',' || c2 != ',' || !(row >> std::ws).eof())
      return Status::InvalidArgument(fmt::format("table line {}: expected three comma-separated numbers", line_no));
    if (!(q >= 1) || !(kv >= q) || !(s > 0) || !std::isfinite(s))
      return Status::InvalidArgument(
          fmt::format("table line {}: need 1 <= q_len <= kv_len and seconds > 0, got {},{},{}", line_no, q, kv, s));
    // Bounds far past any measurement (31 years a task; a femtosecond), so
    // that loads summed and extrapolated from the table stay finite, and
    // costs scaled down from it stay above zero (a denormal time made every
    // small task cost 0, and any plan of them look balanced).
    if (s > 1e9)
      return Status::InvalidArgument(
          fmt::format("table line {}: {} seconds for one task is beyond 1e9 (31 years)", line_no, s));
    if (s < 1e-15)
      return Status::InvalidArgument(
          fmt::format("table line {}: {} seconds for one task is below 1e-15 (a femtosecond)", line_no, s));
    // Lengths up to 2^32 (twice the longest document a plan holds): a
    // point far beyond would scale small tasks' costs down to denormals,
    // or overflow its causal pairs.
    if (kv > 0x1p32)
      return Status::InvalidArgument(fmt::format("table line {}: kv_len {} is beyond 2^32 = 4294967296", line_no, kv));
    if (!points.emplace(std::pair{q, kv}, s).second)
      return Status::InvalidArgument(fmt::format("table line {}: duplicate point ({}, {})", line_no, q, kv));
  }
  if (points.empty()) return Status::InvalidArgument("table has no data rows");
  CostModel c;
  for (const auto& [key, s] : points) {
    c.q_grid_.push_back(key.first);
    c.kv_grid_.push_back(key.second);
  }
  for (auto* g : {&c.q_grid_, &c.kv_grid_}) {
    std::sort(g->begin(), g->end());
    g->erase(std::unique(g->begin(), g->end()), g->end());
  }
  // kv < q cannot occur for a task; such grid cells are filled from the
  // diagonal (q = kv) so that the grid is complete.
  for (double q : c.q_grid_) {
    for (double kv : c.kv_grid_) {
      auto it = points.find({q, kv});
      if (it != points.end()) {
        c.seconds_.push_back(it->second);
      } else if (kv < q && points.count({kv, kv})) {
        c.seconds_.push_back(points.at({kv, kv}));
      } else {
        return Status::InvalidArgument(fmt::format("table is not a full grid: no row for q_len {}, kv_len {}", q, kv));
      }
    }
  }
  c.q_octaves_ = OctavesOf(c.q_grid_);
  c.kv_octaves_ = OctavesOf(c.kv_grid_);
  *model = std::move(c);
  return Status::Ok();
}

}  // namespace distca
