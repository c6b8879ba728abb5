// Quoting input in error messages.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

namespace distca {

// An ASCII control character (below 0x20, or DEL): what a message, a CSV
// label or a gnuplot string cannot show as it is.
inline bool IsControlByte(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

// The length of the well-formed UTF-8 sequence at the start of `text`
// (1-4 bytes), or 0 if it does not start with one (a stray continuation
// byte, an overlong form, a surrogate, a code point above U+10FFFF, a
// sequence cut short).
inline size_t Utf8SequenceLength(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = byte(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  return n;
}

// Whether all of `text` is well-formed UTF-8.
inline bool IsWellFormedUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// `text` for quoting in a message: its first `max` bytes, followed by
// "... (N bytes)" when it is longer; control characters, and bytes that are
// not well-formed UTF-8, written as \xNN (a NUL would end the message where
// it is printed, and a stray byte garbles a terminal); a quote or backslash
// behind a backslash (the message quotes it).
inline std::string Excerpt(std::string_view text, size_t max = 80) {
  std::string out;
  const auto escape = [&](unsigned char c) {
    char escaped[5];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
    out += escaped;
  };
  size_t i = 0;
  while (i < text.size() && i < max) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = Utf8SequenceLength(text.substr(i)); IsControlByte(text[i]) || n == 0) {
      escape(c);
      ++i;
    } else if (i + n > max) {
      break;  // a character cut in two by the limit is left out
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// `message` with every word (a run without spaces) longer than `max_word`
// bytes cut to its first and last max_word / 2 bytes around "... (N
// bytes) ...": a tool's last line where a library or CLI11 quoted a 100 KB
// value whole. A long path keeps its file name. No UTF-8 character is cut.
inline std::string ShortenLongWords(std::string_view message, size_t max_word = 1024) {
  const auto continuation = [](char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; };
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const size_t end = std::min(message.find(' ', i), message.size());
    const std::string_view word = message.substr(i, end - i);
    if (word.size() <= max_word) {
      out.append(word);
    } else {
      size_t head = max_word / 2, tail = word.size() - max_word / 2;
      while (head > 0 && continuation(word[head])) --head;
      while (tail < word.size() && continuation(word[tail])) ++tail;
      out.append(word.substr(0, head))
          .append("... (" + std::to_string(word.size()) + " bytes) ...")
          .append(word.substr(tail));
    }
    if (end < message.size()) out += ' ';
    i = end + 1;
  }
  return out;
}

}  // namespace distca
