#include "membroker/status.h"

namespace membroker {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
#define MEMBROKER_ERROR_NAME(value, enumerator, wire, py) \
  case ErrorCode::enumerator:                             \
    return #wire;
    MEMBROKER_ERROR_CODES(MEMBROKER_ERROR_NAME)
#undef MEMBROKER_ERROR_NAME
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
