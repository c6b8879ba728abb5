// Status: how every distca library call reports failure.
//
// Library code never prints or exits. A call that can fail returns a Status;
// on failure, message() says which argument or resource was wrong and why.
// Only tools/ turn a Status into a message and an exit code.
#pragma once

#include <string>
#include <utility>

namespace distca {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed or inconsistent
  kOutOfRange,          // a value is well-formed but beyond a supported limit
  kFailedPrecondition,  // the system is not in a state where the call can run
  kUnavailable,         // a resource (CPU feature, device, peer) is missing
  kIoError,             // reading or writing a file failed
  kInternal,            // a distca bug: an invariant did not hold
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK", or "<code name>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (no-op when OK).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace distca

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define DISTCA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::distca::Status distca_status_ = (expr);        \
    if (!distca_status_.ok()) return distca_status_; \
  } while (0)
