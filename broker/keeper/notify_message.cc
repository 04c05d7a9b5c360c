#include "keeper/notify_message.h"

namespace membroker::broker::keeper {

bool IsValidFdName(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (const char c : name)
    if (c < 0x21 || c > 0x7e || c == ':') return false;
  return true;
}

std::optional<NotifyMessage> ParseNotifyMessage(std::string_view text, std::string* error) {
  NotifyMessage m;
  if (text.size() > kMaxNotifyBytes) {
    *error = "longer than " + std::to_string(kMaxNotifyBytes) + " bytes";
    return std::nullopt;
  }
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      *error = "a line is not KEY=VALUE";
      return std::nullopt;
    }
    const std::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    auto flag = [&](bool* out) {
      if (value != "1") {
        *error = std::string(key) + " must be 1";
        return false;
      }
      *out = true;
      return true;
    };
    if (key == "READY") {
      if (!flag(&m.ready)) return std::nullopt;
    } else if (key == "STOPPING") {
      if (!flag(&m.stopping)) return std::nullopt;
    } else if (key == "FDSTORE") {
      if (!flag(&m.fd_store)) return std::nullopt;
    } else if (key == "FDSTOREREMOVE") {
      if (!flag(&m.fd_store_remove)) return std::nullopt;
    } else if (key == "FDNAME") {
      if (!IsValidFdName(value)) {
        *error = "FDNAME is not 1-255 printable bytes without ':'";
        return std::nullopt;
      }
      m.fd_name = std::string(value);
    } else if (key == "STATUS") {
      m.status = std::string(value);
    }
    // Others (WATCHDOG=1, MAINPID=, ERRNO=, ...) mean nothing to the keeper.
  }
  if (m.fd_store && m.fd_store_remove) {
    *error = "FDSTORE=1 and FDSTOREREMOVE=1 in one message";
    return std::nullopt;
  }
  return m;
}

}  // namespace membroker::broker::keeper
