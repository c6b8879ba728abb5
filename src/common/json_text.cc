#include "common/json_text.h"

#include <set>
#include <vector>

namespace distca {
namespace {

// Thrown from the parser's callback to stop it at the first problem.
struct Refused {
  std::string why;
};

}  // namespace

Status ParseJsonText(std::string_view text, const std::string& what, nlohmann::json* out) {
  const auto invalid = [&](const std::string& why) {
    return Status::InvalidArgument(what + " is not valid JSON: " + why);
  };
  DISTCA_RETURN_IF_ERROR(RefuseNulByte(text, what));
  std::vector<std::set<std::string>> keys;  // per open object, its keys so far
  using Event = nlohmann::json::parse_event_t;
  const nlohmann::json::parser_callback_t check = [&](int depth, Event event, nlohmann::json& parsed) {
    // Depth counts the levels around a value: an object or array opening at
    // depth d is level d + 1.
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw Refused{"nested more than " + std::to_string(kMaxJsonDepth) + " levels deep"};
    if (event == Event::object_start) {
      keys.emplace_back();
    } else if (event == Event::object_end) {
      keys.pop_back();
    } else if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second) {
      throw Refused{"key \"" + Excerpt(parsed.get<std::string>()) + "\" appears twice in one object"};
    }
    return true;
  };
  try {
    *out = nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const Refused& r) {
    return invalid(r.why);
  } catch (const nlohmann::json::exception& e) {
    return invalid(JsonExceptionWhy(e));
  }
  return Status::Ok();
}

Status RefuseNulByte(std::string_view text, const std::string& what) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return Status::InvalidArgument(what + " is not valid JSON: a NUL byte at offset " + std::to_string(nul));
  return Status::Ok();
}

std::string JsonExceptionWhy(const nlohmann::json::exception& e) {
  // "[json.exception.parse_error.101] parse error at line 1, column 7: ...": keep what follows the tag.
  std::string why = e.what();
  if (const size_t tag_end = why.find("] "); why.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos)
    why = why.substr(tag_end + 2);
  return Excerpt(why, 300);
}

}  // namespace distca
