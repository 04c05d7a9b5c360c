#include "membroker/ipc/escape.h"

#include <cstdio>

namespace membroker::ipc {

namespace {
bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }
void AppendHex(std::string& out, unsigned char c) {
  char buf[5];
  std::snprintf(buf, sizeof(buf), "\\x%02x", c);
  out += buf;
}
}  // namespace

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string EscapeControlBytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (IsControl(c))
      AppendHex(out, c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

std::string EscapeText(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x80 && !IsControl(c))
          out += static_cast<char>(c);
        else
          AppendHex(out, c);
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // shortest form per length
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t more;  // continuation bytes
    if (c < 0x80) more = 0;
    else if ((c >> 5) == 0x6) more = 1;
    else if ((c >> 4) == 0xe) more = 2;
    else if ((c >> 3) == 0x1e) more = 3;
    else return false;
    if (more > s.size() - i - 1) return false;
    uint32_t cp = more == 0 ? c : c & (0x3f >> more);
    for (size_t k = 1; k <= more; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < kMin[more] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += more + 1;
  }
  return true;
}

Status CheckName(std::string_view name, size_t max_bytes, std::string_view what) {
  const std::string w(what);
  if (name.empty() || name.size() > max_bytes)
    return Status(ErrorCode::kParamInvalid, w + " must be 1 to " + std::to_string(max_bytes) + " bytes");
  for (unsigned char c : name)
    if (IsControl(c))
      return Status(ErrorCode::kParamInvalid, w + " must not contain control characters");
  if (!IsValidUtf8(name)) return Status(ErrorCode::kParamInvalid, w + " must be valid UTF-8");
  return Status::Ok();
}

}  // namespace membroker::ipc
