// One sd_notify(3) datagram as the keeper reads it: newline-separated
// KEY=VALUE lines (READY=1, STOPPING=1, FDSTORE=1, FDSTOREREMOVE=1,
// FDNAME=..., STATUS=..., and others the keeper ignores). Pure parsing, so the
// unit tests and the fuzzer reach it without a socket.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace membroker::broker::keeper {

struct NotifyMessage {
  bool ready = false;              // READY=1
  bool stopping = false;           // STOPPING=1
  bool fd_store = false;           // FDSTORE=1: keep the fds that came with it
  bool fd_store_remove = false;    // FDSTOREREMOVE=1: close every fd of fd_name
  std::string fd_name = "stored";  // FDNAME= (systemd's default name)
  std::string status;              // STATUS=, for the keeper's log
};

// The longest datagram the keeper reads whole (systemd's own limit is larger;
// the broker's messages are a few hundred bytes).
constexpr size_t kMaxNotifyBytes = 4096;
// FDNAME's rules, as systemd's: 1-255 printable ASCII bytes, no ':' (the
// separator of LISTEN_FDNAMES).
bool IsValidFdName(std::string_view name);

// nullopt with *error set when a line is not KEY=VALUE, FDNAME is not valid,
// or a known key has a value other than the one systemd accepts.
std::optional<NotifyMessage> ParseNotifyMessage(std::string_view text, std::string* error);

}  // namespace membroker::broker::keeper
