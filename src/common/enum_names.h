// Name <-> value of a small enum, from one table of {value, name} pairs, so
// that an enum's Name and Parse functions cannot disagree.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "common/excerpt.h"
#include "distca/status.h"

namespace distca {

template <class E, size_t N>
const char* EnumName(const std::pair<E, const char*> (&table)[N], E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "unknown";
}

// Sets *out to the value named `name`, or fails with
// "unknown <what> '<name>' (expected a, b or c)".
template <class E, size_t N>
Status ParseEnumName(const std::pair<E, const char*> (&table)[N], std::string_view name, std::string_view what,
                     E* out) {
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    if (name == table[i].second) {
      *out = table[i].first;
      return Status::Ok();
    }
    expected += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(table[i].second);
  }
  return Status::InvalidArgument(fmt::format("unknown {} '{}' (expected {})", what, Excerpt(name), expected));
}

}  // namespace distca
