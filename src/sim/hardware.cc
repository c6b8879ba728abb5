// Hardware profiles: JSON parsing, validation, the attention-efficiency curve.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/excerpt.h"
#include "common/file_util.h"
#include "common/json_text.h"
#include "distca/plan.h"
#include "distca/sim.h"
#include "sim/costs.h"

namespace distca {
namespace {

using nlohmann::json;

// A positive number in [lo, hi]: the bounds keep every simulated time finite
// (a peak of 1e-300 FLOP/s would make every iteration infinite).
Status Number(const json& j, const std::string& where, const char* key, double* out, double lo, double hi) {
  if (!j.contains(key)) return Status::InvalidArgument(fmt::format("{}: missing \"{}\"", where, key));
  const json& v = j.at(key);
  if (!v.is_number()) return Status::InvalidArgument(fmt::format("{}: \"{}\" must be a number", where, key));
  *out = v.get<double>();
  if (!std::isfinite(*out) || *out <= 0)
    return Status::InvalidArgument(fmt::format("{}: \"{}\" must be positive, got {}", where, key, v.dump()));
  if (*out < lo || *out > hi)
    return Status::InvalidArgument(
        fmt::format("{}: \"{}\" must be in [{:g}, {:g}], got {}", where, key, lo, hi, v.dump()));
  return Status::Ok();
}

Status Integer(const json& j, const std::string& where, const char* key, int* out) {
  if (!j.contains(key)) return Status::InvalidArgument(fmt::format("{}: missing \"{}\"", where, key));
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 20))
    return Status::InvalidArgument(
        fmt::format("{}: \"{}\" must be a positive integer, at most {}, got {}", where, key, 1 << 20, v.dump()));
  *out = v.get<int>();
  return Status::Ok();
}

// Every key of object `j` is one of `known`: a misspelt optional key would
// otherwise be ignored without a word.
Status OnlyKeys(const json& j, const std::string& where, std::initializer_list<std::string_view> known) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      return Status::InvalidArgument(fmt::format("{}: unknown key \"{}\"", where, Excerpt(it.key())));
  return Status::Ok();
}

Status Text(const json& j, const char* key, std::string* out) {
  if (!j.contains(key) || !j.at(key).is_string())
    return Status::InvalidArgument(fmt::format("hardware profile: \"{}\" must be a string", key));
  *out = j.at(key).get<std::string>();
  return Status::Ok();
}

Status Link(const json& network, const char* key, LinkProfile* link) {
  const std::string where = fmt::format("hardware profile: network.{}", key);
  if (!network.contains(key) || !network.at(key).is_object())
    return Status::InvalidArgument(where + " must be an object {\"bandwidth\", \"latency_s\"}");
  const json& l = network.at(key);
  DISTCA_RETURN_IF_ERROR(OnlyKeys(l, where, {"bandwidth", "latency_s"}));
  DISTCA_RETURN_IF_ERROR(Number(l, where, "bandwidth", &link->bandwidth, 1e3, 1e15));
  return Number(l, where, "latency_s", &link->latency_s, 1e-12, 10);
}

Status Curve(const json& j, std::vector<std::pair<double, double>>* curve) {
  const char* where = "hardware profile: \"attention_efficiency\"";
  if (!j.contains("attention_efficiency") || !j.at("attention_efficiency").is_array() ||
      j.at("attention_efficiency").empty())
    return Status::InvalidArgument(fmt::format("{} must be a non-empty array of [q_len, fraction]", where));
  curve->clear();
  for (const json& point : j.at("attention_efficiency")) {
    const size_t i = curve->size();
    if (!point.is_array() || point.size() != 2 || !point[0].is_number() || !point[1].is_number())
      return Status::InvalidArgument(fmt::format("{}[{}] must be [q_len, fraction]", where, i));
    const double q = point[0].get<double>(), f = point[1].get<double>();
    if (!(q >= 1) || !std::isfinite(q))
      return Status::InvalidArgument(fmt::format("{}[{}]: q_len must be >= 1, got {}", where, i, point[0].dump()));
    if (!(f >= 1e-6 && f <= 1))
      return Status::InvalidArgument(
          fmt::format("{}[{}]: fraction must be in [1e-06, 1], got {}", where, i, point[1].dump()));
    if (i > 0 && q <= curve->back().first)
      return Status::InvalidArgument(
          fmt::format("{}[{}]: q_len {} is not above the previous {}", where, i, q, curve->back().first));
    curve->emplace_back(q, f);
  }
  return Status::Ok();
}

Status Tables(const json& j, std::vector<AttentionTable>* out) {
  out->clear();
  if (!j.contains("attention_tables")) return Status::Ok();
  const json& list = j.at("attention_tables");
  if (!list.is_array())
    return Status::InvalidArgument("hardware profile: \"attention_tables\" must be an array of tables");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("hardware profile: attention_tables[{}]", i);
    const json& t = list[i];
    if (!t.is_object() || !t.contains("file") || !t.at("file").is_string() || t.at("file").get<std::string>().empty())
      return Status::InvalidArgument(where + " must be an object with a \"file\" name, q_heads, kv_heads, head_dim");
    DISTCA_RETURN_IF_ERROR(OnlyKeys(t, where, {"file", "forward_file", "q_heads", "kv_heads", "head_dim", "scale"}));
    AttentionTable table;
    table.file = t.at("file").get<std::string>();
    DISTCA_RETURN_IF_ERROR(Integer(t, where, "q_heads", &table.q_heads));
    DISTCA_RETURN_IF_ERROR(Integer(t, where, "kv_heads", &table.kv_heads));
    DISTCA_RETURN_IF_ERROR(Integer(t, where, "head_dim", &table.head_dim));
    if (table.q_heads % table.kv_heads != 0)
      return Status::InvalidArgument(
          fmt::format("{}: q_heads ({}) must be a multiple of kv_heads ({})", where, table.q_heads, table.kv_heads));
    if (t.contains("scale")) DISTCA_RETURN_IF_ERROR(Number(t, where, "scale", &table.scale, 1e-6, 1e6));
    if (t.contains("forward_file")) {
      const json& f = t.at("forward_file");
      if (!f.is_string() || f.get<std::string>().empty())
        return Status::InvalidArgument(where + ": \"forward_file\" must be a non-empty file name");
      table.forward_file = f.get<std::string>();
    }
    for (size_t k = 0; k < out->size(); ++k) {
      const AttentionTable& other = (*out)[k];
      if (other.q_heads == table.q_heads && other.kv_heads == table.kv_heads && other.head_dim == table.head_dim)
        return Status::InvalidArgument(
            fmt::format("{}: {} x {} heads of head_dim {} are already measured by "
                        "attention_tables[{}]",
                        where, table.q_heads, table.kv_heads, table.head_dim, k));
    }
    out->push_back(std::move(table));
  }
  return Status::Ok();
}

// The profile in `j`, validated field by field.
Status ProfileFromJson(const json& j, HardwareProfile* profile) {
  if (!j.is_object()) return Status::InvalidArgument("hardware profile must be a JSON object");
  const std::string where = "hardware profile";
  DISTCA_RETURN_IF_ERROR(
      OnlyKeys(j, where,
               {"name", "source", "gpus_per_node", "peak_flops", "linear_mfu", "tp_collectives", "attention_efficiency",
                "attention_backward_factor", "attention_tables", "dtype_bytes", "memory_bytes", "network"}));
  HardwareProfile p;
  DISTCA_RETURN_IF_ERROR(Text(j, "name", &p.name));
  if (p.name.empty())
    return Status::InvalidArgument("hardware profile: \"name\" must not be empty (the tools print it)");
  DISTCA_RETURN_IF_ERROR(Text(j, "source", &p.source));
  DISTCA_RETURN_IF_ERROR(Integer(j, where, "gpus_per_node", &p.gpus_per_node));
  DISTCA_RETURN_IF_ERROR(Number(j, where, "peak_flops", &p.peak_flops, 1e6, 1e18));
  DISTCA_RETURN_IF_ERROR(Number(j, where, "linear_mfu", &p.linear_mfu, 1e-6, 1));
  if (j.contains("tp_collectives")) {
    if (!j.at("tp_collectives").is_boolean())
      return Status::InvalidArgument(where + ": \"tp_collectives\" must be true or false");
    p.tp_collectives = j.at("tp_collectives").get<bool>();
  }
  DISTCA_RETURN_IF_ERROR(Curve(j, &p.attention_efficiency));
  if (j.contains("attention_backward_factor")) {
    DISTCA_RETURN_IF_ERROR(Number(j, where, "attention_backward_factor", &p.attention_backward_factor, 1, 100));
  }
  DISTCA_RETURN_IF_ERROR(Tables(j, &p.attention_tables));
  DISTCA_RETURN_IF_ERROR(Integer(j, where, "dtype_bytes", &p.dtype_bytes));
  if (p.dtype_bytes > 8)
    return Status::InvalidArgument(fmt::format("{}: \"dtype_bytes\" must be at most 8, got {}", where, p.dtype_bytes));
  DISTCA_RETURN_IF_ERROR(Number(j, where, "memory_bytes", &p.memory_bytes, 1e6, double(kMaxDeviceMemoryBytes)));
  if (!j.contains("network") || !j.at("network").is_object())
    return Status::InvalidArgument(where + ": \"network\" must be an object with intra_node and inter_node");
  DISTCA_RETURN_IF_ERROR(OnlyKeys(j.at("network"), where + ": network", {"intra_node", "inter_node", "all_to_all"}));
  DISTCA_RETURN_IF_ERROR(Link(j.at("network"), "intra_node", &p.intra_node));
  DISTCA_RETURN_IF_ERROR(Link(j.at("network"), "inter_node", &p.inter_node));
  if (j.at("network").contains("all_to_all")) {
    p.all_to_all.emplace();
    DISTCA_RETURN_IF_ERROR(Link(j.at("network"), "all_to_all", &*p.all_to_all));
  }
  *profile = std::move(p);
  return Status::Ok();
}

// `text` for a message: at most kShown characters of it (an override's
// value may be a whole profile's worth of JSON).
std::string Shortened(const std::string& text) {
  constexpr size_t kShown = 160;
  if (text.size() <= kShown) return text;
  return fmt::format("{}... ({} characters)", text.substr(0, kShown), text.size());
}

// Sets the field that `spec` ("a.b.c=VALUE") names in `root` to VALUE's JSON.
// A missing last key is added (the profile's own checks refuse a key it does
// not know); everything before it must exist.
Status ApplyOverride(const std::string& spec, json* root) {
  const std::string what = fmt::format("hardware override '{}'", Shortened(spec));
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::InvalidArgument(what + ": expected FIELD=VALUE, e.g. network.inter_node.bandwidth=25e9");
  const std::string path = spec.substr(0, eq);
  json value;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(std::string_view(spec).substr(eq + 1), what + ": the value", &value));
  json* node = root;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const std::string so_far = path.substr(0, dot);
    if (key.empty()) return Status::InvalidArgument(what + ": an empty field name in the path");
    if (node->is_object()) {
      if (dot != std::string::npos && !node->contains(key))
        return Status::InvalidArgument(fmt::format("{}: the profile has no \"{}\"", what, so_far));
      node = &(*node)[key];
    } else if (node->is_array()) {
      // Plain decimal, as every number on the command line: no sign, no leading zero.
      const bool digits = key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos &&
                          (key.size() == 1 || key[0] != '0');
      const size_t index = digits ? std::stoul(key) : node->size();
      if (index >= node->size())
        return Status::InvalidArgument(
            fmt::format("{}: \"{}\" must be an index below {} (the array's length)", what, so_far, node->size()));
      node = &(*node)[index];
    } else {
      std::string shown = node->dump();  // a long one by its kind and size
      if (shown.size() > 80) {
        const std::string kind = node->type_name();  // "string", "array", "object"
        shown = fmt::format("{} {} of {} bytes", kind[0] == 'a' || kind[0] == 'o' ? "an" : "a", kind, shown.size());
      }
      return Status::InvalidArgument(
          fmt::format("{}: \"{}\" is {}, which has no fields", what, path.substr(0, start - 1), shown));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *node = std::move(value);
  return Status::Ok();
}

}  // namespace

Status ParseHardwareProfile(std::string_view text, HardwareProfile* profile) {
  if (profile == nullptr) return Status::InvalidArgument("profile is null");
  json j;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, "hardware profile", &j));
  return ProfileFromJson(j, profile);
}

double HardwareProfile::AttentionEfficiency(double q_len) const {
  const auto& c = attention_efficiency;
  if (c.empty()) return 1.0;
  if (q_len <= c.front().first) return c.front().second;
  if (q_len >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < q_len) ++i;
  const double x0 = std::log2(c[i - 1].first), x1 = std::log2(c[i].first);
  const double t = (std::log2(q_len) - x0) / (x1 - x0);
  return c[i - 1].second + t * (c[i].second - c[i - 1].second);
}

std::string HardwareProfileJson(const HardwareProfile& p) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["source"] = p.source;
  j["gpus_per_node"] = p.gpus_per_node;
  j["peak_flops"] = p.peak_flops;
  j["linear_mfu"] = p.linear_mfu;
  if (p.tp_collectives) j["tp_collectives"] = true;
  j["attention_efficiency"] = nlohmann::ordered_json::array();
  for (const auto& [q, f] : p.attention_efficiency) j["attention_efficiency"].push_back({q, f});
  j["attention_backward_factor"] = p.attention_backward_factor;
  if (!p.attention_tables.empty()) {
    j["attention_tables"] = nlohmann::ordered_json::array();
    for (const AttentionTable& t : p.attention_tables) {
      nlohmann::ordered_json e{
          {"file", t.file}, {"q_heads", t.q_heads}, {"kv_heads", t.kv_heads}, {"head_dim", t.head_dim}};
      if (!t.forward_file.empty()) e["forward_file"] = t.forward_file;
      e["scale"] = t.scale;
      j["attention_tables"].push_back(std::move(e));
    }
  }
  j["dtype_bytes"] = p.dtype_bytes;
  j["memory_bytes"] = p.memory_bytes;
  auto link = [](const LinkProfile& l) {
    return nlohmann::ordered_json{{"bandwidth", l.bandwidth}, {"latency_s", l.latency_s}};
  };
  j["network"]["intra_node"] = link(p.intra_node);
  j["network"]["inter_node"] = link(p.inter_node);
  if (p.all_to_all) j["network"]["all_to_all"] = link(*p.all_to_all);
  // One line per field, as the shipped profiles are written. Invalid UTF-8
  // in a name or file (a name can be a file's stem) is replaced, not thrown.
  const auto dump = [](const auto& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  std::string out = "{\n";
  for (auto it = j.begin(); it != j.end(); ++it)
    out += fmt::format("  {}: {}{}\n", dump(nlohmann::json(it.key())), dump(it.value()),
                       std::next(it) == j.end() ? "" : ",");
  return out + "}\n";
}

namespace {

// The table's grid cell that needs the largest scale to stay no faster than
// peak_flops (its task's forward FLOPs at peak over its unscaled seconds).
struct BindingCell {
  double scale = 0;  // the smallest scale the cell allows
  double q = 0, kv = 0, seconds = 0, flops = 0;
  bool forward = false;  // a cell of the forward table
};

Status FindBindingCell(const AttentionTable& t, double peak_flops, BindingCell* out) {
  CostModel total;
  std::optional<CostModel> forward;
  DISTCA_RETURN_IF_ERROR(sim::ParseAttentionTable(t, &total, &forward));
  *out = BindingCell{};
  if (!(peak_flops > 0)) return Status::Ok();
  // Either table's task does at least the forward pass's work: the
  // planner's FLOP cost of one causal pair, times the task's pairs.
  const double flops_per_pair = CostModel::Flops({t.q_heads, t.kv_heads, t.head_dim, 2}).TaskCost(0, 1);
  for (const CostModel* m : {&total, forward ? &*forward : nullptr}) {
    if (m == nullptr) continue;
    const size_t nk = m->kv_grid().size();
    for (size_t i = 0; i < m->grid_seconds().size(); ++i) {
      const double q = m->q_grid()[i / nk], kv = m->kv_grid()[i % nk];
      // Cells with kv < q hold the (kv, kv) point.
      const double flops = flops_per_pair * CausalPairsReal(std::min(q, kv), kv);
      const double needed = flops / (peak_flops * m->grid_seconds()[i]);
      if (needed > out->scale) *out = {needed, q, kv, m->grid_seconds()[i], flops, m != &total};
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateAttentionTable(const AttentionTable& t, double peak_flops) {
  BindingCell cell;
  DISTCA_RETURN_IF_ERROR(FindBindingCell(t, peak_flops, &cell));
  if (t.scale * cell.seconds * peak_flops < cell.flops)
    return Status::InvalidArgument(fmt::format(
        "{}table '{}': at q_len {:g}, kv_len {:g}, {:g} s (scale {:g} included) is faster than the device can "
        "be: its forward pass alone takes {:g} s at peak_flops {:g}",
        cell.forward ? "forward " : "", cell.forward ? t.forward_file : t.file, cell.q, cell.kv, t.scale * cell.seconds,
        t.scale, cell.flops / peak_flops, peak_flops));
  return Status::Ok();
}

Status MinimumTableScale(const AttentionTable& t, double peak_flops, double* scale) {
  if (scale == nullptr) return Status::InvalidArgument("scale is null");
  BindingCell cell;
  DISTCA_RETURN_IF_ERROR(FindBindingCell(t, peak_flops, &cell));
  *scale = cell.scale;
  return Status::Ok();
}

namespace sim {

Status ParseAttentionTable(const AttentionTable& t, CostModel* total_out, std::optional<CostModel>* forward_out) {
  forward_out->reset();
  if (t.csv.empty())
    return Status::InvalidArgument(
        fmt::format("the attention table '{}' was not read (load the profile with LoadHardwareProfile)", t.file));
  CostModel total, forward;
  DISTCA_RETURN_IF_ERROR(CostModel::FromTableCsv(t.csv, &total).WithContext("attention table '" + t.file + "'"));
  if (t.forward_file.empty()) {
    if (!t.forward_csv.empty())
      return Status::InvalidArgument(
          fmt::format("attention table '{}' has a forward table's text but no forward_file to name it", t.file));
    *total_out = std::move(total);
    return Status::Ok();
  }
  const std::string where = "forward table '" + t.forward_file + "' of '" + t.file + "'";
  if (t.forward_csv.empty())
    return Status::InvalidArgument(where + " was not read (load the profile with LoadHardwareProfile)");
  DISTCA_RETURN_IF_ERROR(CostModel::FromTableCsv(t.forward_csv, &forward).WithContext(where));
  // The backward pass costs the difference. Both tables interpolate with
  // the same weights on one grid (and scale by the same causal-pair ratio
  // outside it), so a difference positive at every grid cell is positive
  // for every task.
  for (const auto& [name, mine, theirs] : {std::tuple{"q_len", &forward.q_grid(), &total.q_grid()},
                                           std::tuple{"kv_len", &forward.kv_grid(), &total.kv_grid()}}) {
    if (*mine == *theirs) continue;
    size_t i = 0;
    while (i < mine->size() && i < theirs->size() && (*mine)[i] == (*theirs)[i]) ++i;
    return Status::InvalidArgument(i < mine->size() && i < theirs->size()
                                       ? fmt::format("{}: not on the same grid ({} value {}: {:g} against {:g})", where,
                                                     name, i, (*mine)[i], (*theirs)[i])
                                       : fmt::format("{}: not on the same grid ({} {} values against {})", where,
                                                     mine->size(), name, theirs->size()));
  }
  const size_t nk = total.kv_grid().size();
  for (size_t i = 0; i < total.grid_seconds().size(); ++i) {
    const double f = forward.grid_seconds()[i], fb = total.grid_seconds()[i];
    if (!(f < fb))
      return Status::InvalidArgument(fmt::format(
          "{}: at q_len {:g}, kv_len {:g} the forward seconds ({:g}) are not below the forward + backward seconds "
          "({:g})",
          where, total.q_grid()[i / nk], total.kv_grid()[i % nk], f, fb));
  }
  *total_out = std::move(total);
  *forward_out = std::move(forward);
  return Status::Ok();
}

}  // namespace sim

Status LoadHardwareProfile(const std::string& path, HardwareProfile* profile,
                           const std::vector<std::string>& overrides) {
  if (profile == nullptr) return Status::InvalidArgument("profile is null");
  std::string text;
  DISTCA_RETURN_IF_ERROR(ReadTextFile(path, &text));
  json j;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, "hardware profile", &j).WithContext(path));
  if (!overrides.empty() && !j.is_object())
    return Status::InvalidArgument("hardware profile must be a JSON object").WithContext(path);
  for (const std::string& spec : overrides) DISTCA_RETURN_IF_ERROR(ApplyOverride(spec, &j).WithContext(path));
  const std::string changed = fmt::format("{}", fmt::join(overrides, ", "));
  HardwareProfile p;
  DISTCA_RETURN_IF_ERROR(ProfileFromJson(j, &p).WithContext(
      overrides.empty() ? path : fmt::format("{} with {}", path, Shortened(changed))));
  if (!overrides.empty()) p.name += fmt::format(" ({})", changed);
  // The name labels CSV rows and chart titles: one line, control characters
  // (a newline in a file's name or an override's value) as spaces.
  for (char& c : p.name)
    if (IsControlByte(c)) c = ' ';
  for (size_t i = 0; i < p.attention_tables.size(); ++i) {
    AttentionTable& t = p.attention_tables[i];
    const std::string where = fmt::format("{}: attention_tables[{}]", path, i);
    const auto read = [&](const std::string& name, std::string* csv) {
      const std::filesystem::path file = std::filesystem::path(path).parent_path() / name;
      DISTCA_RETURN_IF_ERROR(ReadTextFile(file.string(), csv).WithContext(where));
      if (csv->empty())
        return Status::InvalidArgument(fmt::format("{}: '{}' is empty or not a file", where, file.string()));
      return Status::Ok();
    };
    DISTCA_RETURN_IF_ERROR(read(t.file, &t.csv));
    if (!t.forward_file.empty()) DISTCA_RETURN_IF_ERROR(read(t.forward_file, &t.forward_csv));
    DISTCA_RETURN_IF_ERROR(ValidateAttentionTable(t, p.peak_flops).WithContext(where));
  }
  *profile = std::move(p);
  return Status::Ok();
}

}  // namespace distca
