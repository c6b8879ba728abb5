// The plan file (docs/plan_format.md): JSON out and in.
#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "distca/plan.h"
#include "plan/planner_internal.h"

namespace distca {

std::string PlanToJson(const Plan& plan) {
  nlohmann::json j;
  j["format"] = "distca-plan";
  j["version"] = 1;
  j["ranks"] = plan.ranks;
  j["dedicated_servers"] = plan.dedicated_servers;
  j["block"] = plan.block;
  j["policy"] = PlanPolicyName(plan.policy);
  j["tolerance_used"] = plan.tolerance_used;
  j["bound_met"] = plan.bound_met;
  j["model"] = {{"q_heads", plan.model.q_heads},
                {"kv_heads", plan.model.kv_heads},
                {"head_dim", plan.model.head_dim},
                {"dtype_bytes", plan.model.dtype_bytes},
                {"wire", PlanWireName(plan.model.wire)}};
  nlohmann::json docs = nlohmann::json::array();
  for (size_t d = 0; d < plan.documents.size(); ++d) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const PlanPiece& p : plan.documents[d].pieces)
      pieces.push_back({{"rank", p.rank}, {"begin", p.begin}, {"end", p.end}});
    docs.push_back({{"id", d}, {"length", plan.documents[d].length}, {"pieces", std::move(pieces)}});
  }
  j["documents"] = std::move(docs);
  nlohmann::json tasks = nlohmann::json::array();
  for (const PlanTask& t : plan.tasks)
    tasks.push_back({{"doc", t.doc}, {"q_begin", t.q_begin}, {"q_end", t.q_end}, {"server", t.server}});
  j["tasks"] = std::move(tasks);
  return j.dump();
}

namespace {

// Reads an integer field of `obj` into *out, within [lo, hi].
template <class T>
Status ReadInt(const nlohmann::json& obj, const char* key, const std::string& where, T* out,
               int64_t lo = std::numeric_limits<T>::min(), int64_t hi = std::numeric_limits<T>::max()) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::InvalidArgument(fmt::format("{}: missing \"{}\"", where, key));
  if (!it->is_number_integer())
    return Status::InvalidArgument(fmt::format("{}: \"{}\" must be an integer", where, key));
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return Status::InvalidArgument(fmt::format("{}: \"{}\" = {} is outside [{}, {}]", where, key, v, lo, hi));
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status ReadArray(const nlohmann::json& obj, const char* key, const std::string& where, const nlohmann::json** out) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array())
    return Status::InvalidArgument(fmt::format("{}: \"{}\" must be an array", where, key));
  *out = &*it;
  return Status::Ok();
}

}  // namespace

Status PlanFromJson(std::string_view text, Plan* plan) {
  if (plan == nullptr) return Status::InvalidArgument("plan is null");
  nlohmann::json j;
  DISTCA_RETURN_IF_ERROR(ParseJsonText(text, "plan file", &j));
  if (!j.is_object()) return Status::InvalidArgument("plan file must hold a JSON object");
  Plan p;
  DISTCA_RETURN_IF_ERROR(ReadInt(j, "ranks", "plan", &p.ranks, 1, 1 << 24));
  if (j.contains("dedicated_servers"))
    DISTCA_RETURN_IF_ERROR(ReadInt(j, "dedicated_servers", "plan", &p.dedicated_servers, 0, 1 << 24));
  if (j.contains("block")) DISTCA_RETURN_IF_ERROR(ReadInt(j, "block", "plan", &p.block, 1));
  if (j.contains("policy")) {
    if (!j["policy"].is_string()) return Status::InvalidArgument("plan: \"policy\" must be a string");
    DISTCA_RETURN_IF_ERROR(ParsePlanPolicy(j["policy"].get<std::string>(), &p.policy));
  }
  if (j.contains("tolerance_used")) {
    if (!j["tolerance_used"].is_number()) return Status::InvalidArgument("plan: \"tolerance_used\" must be a number");
    p.tolerance_used = j["tolerance_used"].get<double>();
  }
  if (j.contains("bound_met")) {
    if (!j["bound_met"].is_boolean()) return Status::InvalidArgument("plan: \"bound_met\" must be true or false");
    p.bound_met = j["bound_met"].get<bool>();
  }
  if (j.contains("model")) {
    const nlohmann::json& m = j["model"];
    if (!m.is_object()) return Status::InvalidArgument("plan: \"model\" must be an object");
    // Bounded so that byte counts cannot overflow.
    DISTCA_RETURN_IF_ERROR(ReadInt(m, "q_heads", "plan.model", &p.model.q_heads, 1, 1 << 12));
    DISTCA_RETURN_IF_ERROR(ReadInt(m, "kv_heads", "plan.model", &p.model.kv_heads, 1, 1 << 12));
    DISTCA_RETURN_IF_ERROR(ReadInt(m, "head_dim", "plan.model", &p.model.head_dim, 1, 1 << 12));
    DISTCA_RETURN_IF_ERROR(ReadInt(m, "dtype_bytes", "plan.model", &p.model.dtype_bytes, 1, 16));
    if (m.contains("wire")) {
      if (!m["wire"].is_string()) return Status::InvalidArgument("plan.model: \"wire\" must be a string");
      DISTCA_RETURN_IF_ERROR(ParsePlanWire(m["wire"].get<std::string>(), &p.model.wire));
    }
  }
  DISTCA_RETURN_IF_ERROR(plan::CheckPlanShape(p.ranks, p.dedicated_servers, p.model).WithContext("plan"));
  const nlohmann::json* docs = nullptr;
  DISTCA_RETURN_IF_ERROR(ReadArray(j, "documents", "plan", &docs));
  for (size_t d = 0; d < docs->size(); ++d) {
    const nlohmann::json& jd = (*docs)[d];
    const std::string where = fmt::format("documents[{}]", d);
    if (!jd.is_object()) return Status::InvalidArgument(where + " must be an object");
    int64_t id = 0;
    PlanDocument doc;
    DISTCA_RETURN_IF_ERROR(ReadInt(jd, "id", where, &id));
    if (id != static_cast<int64_t>(d))
      return Status::InvalidArgument(fmt::format("{}: \"id\" is {}; ids must be 0, 1, 2, ... in order", where, id));
    DISTCA_RETURN_IF_ERROR(ReadInt(jd, "length", where, &doc.length, 1, kMaxDocumentLength));
    const nlohmann::json* pieces = nullptr;
    DISTCA_RETURN_IF_ERROR(ReadArray(jd, "pieces", where, &pieces));
    for (size_t i = 0; i < pieces->size(); ++i) {
      const nlohmann::json& jp = (*pieces)[i];
      const std::string pwhere = fmt::format("{}.pieces[{}]", where, i);
      if (!jp.is_object()) return Status::InvalidArgument(pwhere + " must be an object");
      PlanPiece piece;
      DISTCA_RETURN_IF_ERROR(ReadInt(jp, "rank", pwhere, &piece.rank, 0));
      DISTCA_RETURN_IF_ERROR(ReadInt(jp, "begin", pwhere, &piece.begin, 0, kMaxDocumentLength));
      DISTCA_RETURN_IF_ERROR(ReadInt(jp, "end", pwhere, &piece.end, 0, kMaxDocumentLength));
      doc.pieces.push_back(piece);
    }
    p.documents.push_back(std::move(doc));
  }
  const nlohmann::json* tasks = nullptr;
  DISTCA_RETURN_IF_ERROR(ReadArray(j, "tasks", "plan", &tasks));
  for (size_t i = 0; i < tasks->size(); ++i) {
    const nlohmann::json& jt = (*tasks)[i];
    const std::string where = fmt::format("tasks[{}]", i);
    if (!jt.is_object()) return Status::InvalidArgument(where + " must be an object");
    PlanTask t;
    DISTCA_RETURN_IF_ERROR(ReadInt(jt, "doc", where, &t.doc, 0));
    DISTCA_RETURN_IF_ERROR(ReadInt(jt, "q_begin", where, &t.q_begin, 0, kMaxDocumentLength));
    DISTCA_RETURN_IF_ERROR(ReadInt(jt, "q_end", where, &t.q_end, 0, kMaxDocumentLength));
    DISTCA_RETURN_IF_ERROR(ReadInt(jt, "server", where, &t.server, 0));
    p.tasks.push_back(t);
  }
  *plan = std::move(p);
  return Status::Ok();
}

}  // namespace distca
