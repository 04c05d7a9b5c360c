// The client side of the broker's admin socket: one command line in, the whole
// answer out (the broker closes the connection after it). Shared by
// membrokerctl, the tests and the benchmarks.
#pragma once

#include <string>

#include "membroker/status.h"

namespace membroker::ipc {

// Sends `command` (without the newline) to the admin socket at admin_path and
// returns the broker's answer; an error if it cannot connect or write, or if
// the broker closes the connection without answering (PROTOCOL_ERROR).
Result<std::string> AskAdmin(const std::string& admin_path, const std::string& command);

}  // namespace membroker::ipc
