// Quoting input in error messages.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace distca {

// `text` for quoting in a message: its first `max` bytes, followed by
// "... (N bytes)" when it is longer, control characters written as \xNN (a
// NUL would end the message where it is printed), and a quote or backslash
// behind a backslash (the message quotes it).
inline std::string Excerpt(std::string_view text, size_t max = 80) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace distca
