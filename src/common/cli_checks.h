// CLI11 validators with plain messages, shared by the tools and benchmarks.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <new>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "common/excerpt.h"
#include "common/file_util.h"

namespace distca::cli {

// The validators' reading of a number: "" with *v set, or why it is not
// one. A magnitude past the largest double ("1e400") is out of range, not
// "not a number"; one below the smallest reads as 0 or a subnormal.
inline std::string ReadNumber(const std::string& s, const std::string& not_a_number, double* v) {
  const char* begin = s.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(begin, &end);
  // What follows the number is StrictNumbers' to refuse, with its message.
  if (end == begin) return not_a_number + ", got '" + s + "'";
  if (errno == ERANGE && std::isinf(x)) return "is out of range for a double, got " + s;
  *v = x;
  return "";
}

// A validator accepting the numbers for which `ok` holds, else "<why>, got S";
// a string that is no number gets "<not_a_number>, got 'S'".
template <class Pred>
CLI::Validator NumberValidator(Pred ok, std::string why, std::string not_a_number, std::string name) {
  return CLI::Validator(
      [ok, why, not_a_number](std::string& s) -> std::string {
        double v = 0;
        if (std::string e = ReadNumber(s, not_a_number, &v); !e.empty()) return e;
        return ok(v) ? "" : why + ", got " + s;
      },
      std::move(name));
}

// Accepts numbers > 0 ("must be positive, got 0").
inline const CLI::Validator kPositive =
    NumberValidator([](double v) { return v > 0; }, "must be positive", "must be a number", "POSITIVE");

// Accepts numbers a float holds (|x| <= FLT_MAX): options stored as float
// would otherwise turn 1e308 into infinity.
inline const CLI::Validator kFitsFloat = NumberValidator([](double v) { return std::abs(v) <= 3.4028234663852886e38; },
                                                         "is beyond the range of a float", "must be a number", "FLOAT");

// Accepts positive numbers a float holds as positive (>= FLT_TRUE_MIN,
// 1.4e-45: smaller ones round to 0, which a positive option would then take).
inline const CLI::Validator kPositiveFloat =
    NumberValidator([](double v) { return v >= 1.401298464324817e-45 && v <= 3.4028234663852886e38; },
                    "must be a positive number a float holds (1.4e-45 to 3.4e38)", "must be a number", "POSITIVE");

// Accepts numbers >= 0.
inline const CLI::Validator kNonNegative =
    NumberValidator([](double v) { return v >= 0; }, "must be >= 0", "must be a number", "NON-NEGATIVE");

// Accepts a share: numbers in (0, 1].
inline const CLI::Validator kShare = NumberValidator([](double v) { return v > 0 && v <= 1; }, "must be in (0, 1]",
                                                     "must be a number in (0, 1]", "SHARE");

// Accepts a non-empty path: an empty one ("$UNSET_VAR") would otherwise turn
// an option off silently (--load "" starting from scratch).
inline const CLI::Validator kPath([](std::string& s) -> std::string { return s.empty() ? "the path is empty" : ""; },
                                  "PATH");

// Numbers as a person writes them in decimal: CLI11 would otherwise read
// "010" as octal 8, "0x10" as hex, saturate an integer past its type's range,
// and let "inf" or "nan" through. Integer options take optional '-' and
// digits without leading zeros, within int64 (uint64 for unsigned ones, which
// take no sign); floating-point options take a finite decimal, with an
// optional exponent.
inline std::string CheckDecimal(const std::string& s, const std::string& type) {
  static const std::regex kInteger(R"(-?(0|[1-9][0-9]*))"), kUnsigned(R"(0|[1-9][0-9]*)"),
      kFloat(R"([+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)");
  if (type == "INT" || type == "UINT") {
    if (!std::regex_match(s, type == "INT" ? kInteger : kUnsigned))
      return "must be a " + std::string(type == "INT" ? "" : "non-negative ") +
             "whole number in decimal digits (no leading zeros), got '" + s + "'";
    errno = 0;
    if (type == "INT") {
      (void)std::strtoll(s.c_str(), nullptr, 10);
    } else {
      (void)std::strtoull(s.c_str(), nullptr, 10);
    }
    if (errno == ERANGE) return "is out of range for a 64-bit integer, got " + s;
    return "";
  }
  if (!std::regex_match(s, kFloat)) return "must be a decimal number, got '" + s + "'";
  if (!std::isfinite(std::strtod(s.c_str(), nullptr))) return "must be finite, got " + s;
  return "";
}

// Adds CheckDecimal to every numeric option of `app` and of its
// subcommands: call it once the options are declared.
inline void StrictNumbers(CLI::App* app) {
  for (CLI::Option* o : app->get_options()) {
    // The type name, before any validators' names CLI11 appends ("INT:POSITIVE").
    std::string type = o->get_type_name();
    type = type.substr(0, type.find(':'));
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    o->check(CLI::Validator([type](std::string& s) { return CheckDecimal(s, type); }, "DECIMAL"));
  }
  for (CLI::App* sub : app->get_subcommands({})) StrictNumbers(sub);
}

// CLI11's messages said plainly. "Could not convert: --gpus = 4294967296":
// a whole number reaches the conversion only once CheckDecimal has found it
// within 64 bits, so what fails there is an option of 32-bit int: say its
// range. "json was given a disallowed flag override": a flag given a value.
inline std::string Reworded(const std::string& what) {
  static const std::regex kCouldNot(R"(Could not convert: (\S+) = (-?[0-9]+))");
  static const std::regex kFlagValue(R"(-*(\S+) was given a disallowed flag override)");
  std::smatch m;
  if (std::regex_match(what, m, kCouldNot))
    return m[1].str() + ": is out of range for this option (-2147483648 to 2147483647), got " + m[2].str();
  if (std::regex_match(what, m, kFlagValue))
    return "--" + m[1].str() + " is a flag and takes no value: give it or leave it out";
  return what;
}

// Parses the command line with StrictNumbers in force. Returns true to go
// on; otherwise CLI11 has printed the help (*exit_code 0) or the error
// (*exit_code 2, the status every tool gives bad input).
inline bool Parse(CLI::App& app, int argc, char** argv, int* exit_code) {
  StrictNumbers(&app);
  // A flag takes no value: "--json=false" would set it false, and a tool
  // that asks whether it was given would still see it. (CLI11 still lets
  // "--json=true" through, which means what "--json" does.)
  const std::function<void(CLI::App*)> no_flag_values = [&](CLI::App* a) {
    for (CLI::Option* o : a->get_options())
      if (o->get_expected_max() == 0) o->disable_flag_override();
    for (CLI::App* sub : a->get_subcommands({})) no_flag_values(sub);
  };
  no_flag_values(&app);
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // help, version
      *exit_code = app.exit(e);
      return false;
    }
    // A quoted value of any length is shortened (ShortenLongWords).
    (void)app.exit(CLI::ParseError(ShortenLongWords(Reworded(e.what())), e.get_exit_code()));
    *exit_code = 2;
    return false;
  }
}

// A file a tool writes or reads, and how a message names it: {"--trace",
// path}, {"the --docs-file", path}.
struct NamedPath {
  std::string name, path;
};
// What an output would overwrite (an input, or an output named before it),
// or "" when nothing: a tool that wrote its results over its input had exit
// 0 and left the input gone. Empty paths are not given.
inline std::string OutputOverInput(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && SameFile(out.path, outputs[j].path))
        return outputs[j].name + " and " + out.name + " name one file";
    for (const NamedPath& in : inputs)
      if (!in.path.empty() && SameFile(out.path, in.path))
        return out.name + " " + out.path + " would overwrite " + in.name;
  }
  return "";
}

// A tool's failure: "TOOL: MESSAGE" on stderr, long words shortened; the
// status every tool gives bad input.
inline int Fail(const std::string& tool, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", tool.c_str(), ShortenLongWords(message).c_str());
  return 2;
}

// The first of `flags` given on the command line, or null: for flags that
// another option makes meaningless, which a tool refuses rather than ignores.
inline const char* FirstGiven(const CLI::App& app, std::initializer_list<const char*> flags) {
  for (const char* flag : flags)
    if (app.count(flag) > 0) return flag;
  return nullptr;
}

// The sampling flags that --docs-file, which gives the batches themselves,
// makes meaningless (tools with a --lengths pool to sample from).
inline constexpr std::initializer_list<const char*> kSamplingFlags = {
    "--batches", "--upsample", "--upsample-threshold", "--filter-ratio", "--elongate", "--seed"};
inline std::string SamplingWithDocsFile(const char* flag) {
  return std::string(flag) + " shapes sampled batches; --docs-file gives the batches themselves";
}

// A tool's main: runs `run`, and ends anything thrown past the tool's own
// checks (an allocation that fails, a library's exception) through `fail`
// with its message, not an abort. Output still buffered is written before it
// returns: a full disk or a closed stdout fails the run (exit 0 would claim
// results nobody received).
template <class Run, class Fail>
int GuardedMain(int argc, char** argv, Run&& run, Fail&& fail) {
  const auto unwritten = [&](int err) {
    return fail(std::string("cannot write to standard output") +
                (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  };
  int rc = 0;
  try {
    rc = run(argc, argv);
  } catch (const std::bad_alloc&) {
    return fail(
        "out of memory: the input needs more memory than this machine gives the run (fewer or shorter documents, "
        "fewer batches, or a machine with more memory)");
  } catch (const std::exception& e) {
    // Output larger than stdio's buffer fails in the middle of the run,
    // where the formatting library throws.
    const int err = errno;
    return std::ferror(stdout) ? unwritten(err) : fail(std::string("internal error: ") + e.what());
  }
  errno = 0;
  const bool written = std::fflush(stdout) == 0 && !std::ferror(stdout);
  if (written || rc != 0) return rc;  // a failed run has said why already
  return unwritten(errno);
}

}  // namespace distca::cli
