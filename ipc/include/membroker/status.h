// Status and Result<T>: the one error model of membroker, in the broker and in
// the client library. Codes are the wire codes (schemas/membroker.fbs), so an
// error travels from the broker to the user unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

// libmembroker.so is built with hidden visibility: only what is marked
// MEMBROKER_API (the public API) is exported.
#define MEMBROKER_API [[gnu::visibility("default")]]

namespace membroker {

// The one list of error codes: X(value, enumerator, wire name, Python class).
// It makes the enum and ErrorCodeName here, a per-code check against the
// schema (ipc/protocol.cc) and against the C header's mb_error (c_api.cc),
// and Python's error classes (membroker._errors, through _membroker). Codes
// are never renumbered; new ones are appended here and in schemas/membroker.fbs.
#define MEMBROKER_ERROR_CODES(X)                                    \
  X(0, kOk, OK, Ok)                                                 \
  X(1, kParamInvalid, PARAM_INVALID, ParamInvalid)                  \
  X(2, kInvalidHandle, INVALID_HANDLE, InvalidHandle)               \
  X(3, kNotFound, NOT_FOUND, NotFound)                              \
  X(4, kPermissionDenied, PERMISSION_DENIED, PermissionDenied)      \
  X(5, kResourceExhausted, RESOURCE_EXHAUSTED, ResourceExhausted)   \
  X(6, kProtocolError, PROTOCOL_ERROR, ProtocolError)               \
  X(7, kVersionMismatch, VERSION_MISMATCH, VersionMismatch)         \
  X(8, kAlreadyExists, ALREADY_EXISTS, AlreadyExists)               \
  X(9, kTimeout, TIMEOUT, Timeout)                                  \
  X(10, kNotConnected, NOT_CONNECTED, NotConnected)                 \
  X(11, kAlreadyConnected, ALREADY_CONNECTED, AlreadyConnected)     \
  X(12, kUnsupported, UNSUPPORTED, Unsupported)                     \
  X(13, kInternal, INTERNAL, Internal)                              \
  X(14, kBusy, BUSY, Busy)                                          \
  X(15, kNotMapped, NOT_MAPPED, NotMapped)                          \
  X(16, kOverlap, OVERLAP, Overlap)                                 \
  X(17, kOutOfRange, OUT_OF_RANGE, OutOfRange)                      \
  X(18, kQuotaExceeded, QUOTA_EXCEEDED, QuotaExceeded)              \
  X(19, kAddressInUse, ADDRESS_IN_USE, AddressInUse)             \
  X(20, kStale, STALE, Stale)                                       \
  X(21, kDataLoss, DATA_LOSS, DataLoss)

enum class ErrorCode : int32_t {
#define MEMBROKER_ERROR_ENUM(value, enumerator, wire, py) enumerator = value,
  MEMBROKER_ERROR_CODES(MEMBROKER_ERROR_ENUM)
#undef MEMBROKER_ERROR_ENUM
};

// "PARAM_INVALID" etc.; "UNKNOWN" for codes this build does not know.
MEMBROKER_API std::string_view ErrorCodeName(ErrorCode code);

class [[nodiscard]] MEMBROKER_API Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "PARAM_INVALID: size must be a multiple of 4096"
  std::string ToString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status. Accessing value() of an error is a bug:
// std::get throws std::bad_variant_access (check ok() first; the library
// itself never does it).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {}  // NOLINT
  Result(ErrorCode code, std::string message)
      : v_(std::in_place_index<1>, Status(code, std::move(message))) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  Status status() const { return ok() ? Status::Ok() : std::get<1>(v_); }
  ErrorCode code() const { return ok() ? ErrorCode::kOk : std::get<1>(v_).code(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace membroker

// Propagate a non-OK Status from an expression that yields a Status.
#define MB_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::membroker::Status mb_status_ = (expr); \
    if (!mb_status_.ok()) return mb_status_; \
  } while (0)

#define MB_CONCAT_INNER(a, b) a##b
#define MB_CONCAT(a, b) MB_CONCAT_INNER(a, b)
// MB_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error Status on failure.
#define MB_ASSIGN_OR_RETURN(lhs, expr) \
  MB_ASSIGN_OR_RETURN_IMPL(MB_CONCAT(mb_result_, __LINE__), lhs, expr)
#define MB_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
