#include "membroker/status.h"

namespace membroker {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "OK";
    case ErrorCode::kParamInvalid: return "PARAM_INVALID";
    case ErrorCode::kInvalidHandle: return "INVALID_HANDLE";
    case ErrorCode::kNotFound: return "NOT_FOUND";
    case ErrorCode::kPermissionDenied: return "PERMISSION_DENIED";
    case ErrorCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case ErrorCode::kProtocolError: return "PROTOCOL_ERROR";
    case ErrorCode::kVersionMismatch: return "VERSION_MISMATCH";
    case ErrorCode::kAlreadyExists: return "ALREADY_EXISTS";
    case ErrorCode::kTimeout: return "TIMEOUT";
    case ErrorCode::kNotConnected: return "NOT_CONNECTED";
    case ErrorCode::kAlreadyConnected: return "ALREADY_CONNECTED";
    case ErrorCode::kUnsupported: return "UNSUPPORTED";
    case ErrorCode::kInternal: return "INTERNAL";
    case ErrorCode::kBusy: return "BUSY";
    case ErrorCode::kNotMapped: return "NOT_MAPPED";
    case ErrorCode::kOverlap: return "OVERLAP";
    case ErrorCode::kOutOfRange: return "OUT_OF_RANGE";
    case ErrorCode::kQuotaExceeded: return "QUOTA_EXCEEDED";
    case ErrorCode::kAddressInUse: return "ADDRESS_IN_USE";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  std::string s(ErrorCodeName(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

}  // namespace membroker
