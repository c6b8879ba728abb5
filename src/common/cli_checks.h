// CLI11 validators with plain messages, shared by the tools and benchmarks.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace distca::cli {

// Accepts numbers > 0 ("must be positive, got 0").
inline const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      try {
        return std::stod(s) > 0 ? "" : "must be positive, got " + s;
      } catch (...) {
        return "must be a number, got '" + s + "'";
      }
    },
    "POSITIVE");

// Accepts numbers >= 0.
inline const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      try {
        return std::stod(s) >= 0 ? "" : "must be >= 0, got " + s;
      } catch (...) {
        return "must be a number, got '" + s + "'";
      }
    },
    "NON-NEGATIVE");

}  // namespace distca::cli
