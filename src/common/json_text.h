// Strict parsing of JSON input files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/excerpt.h"
#include "distca/status.h"

namespace distca {

// Objects and arrays nest at most this deep in an input file (the project's
// formats nest 4 levels; deeper text is refused before it is built).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON value, strictly: the whole text (a NUL byte is
// refused, where nlohmann's parser would stop and accept what came before),
// no object key twice (the parser would keep the last), at most
// kMaxJsonDepth levels. InvalidArgument "WHAT is not valid JSON: WHY", WHY
// naming the line and column of a syntax error.
Status ParseJsonText(std::string_view text, const std::string& what, nlohmann::json* out);

// InvalidArgument "WHAT is not valid JSON: a NUL byte at offset N" if the
// text holds one (nlohmann's parsers would stop there and accept what came
// before); for readers that parse the text themselves.
Status RefuseNulByte(std::string_view text, const std::string& what);

// The parser's message without its "[json.exception.parse_error.101] " tag:
// "parse error at line 1, column 7: ...", cut by Excerpt (the parser quotes
// the offending token whole, which can be megabytes).
std::string JsonExceptionWhy(const nlohmann::json::exception& e);

}  // namespace distca
