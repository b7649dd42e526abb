// Status values that cross library boundaries (no exceptions leave a library).
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace dynaflow {

// kBadInput maps to exit code 2 (usage error, unreadable or malformed input);
// kFailure maps to exit code 1 (the input was fine but the work failed).
enum class StatusCode { kOk = 0, kFailure = 1, kBadInput = 2 };

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status BadInput(std::string message) {
    return Status(StatusCode::kBadInput, std::move(message));
  }
  static Status Failure(std::string message) {
    return Status(StatusCode::kFailure, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  int exit_code() const { return static_cast<int>(code_); }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

#define DF_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::dynaflow::Status _st = (expr);    \
    if (!_st.ok()) return _st;          \
  } while (0)

}  // namespace dynaflow
