// The client side of the broker's admin socket: one command line in, the whole
// answer out (the broker closes the connection after it). Shared by
// membrokerctl, the tests and the benchmarks.
#pragma once

#include <chrono>
#include <string>

#include "membroker/status.h"

namespace membroker::ipc {

// Sends `command` (without the newline) to the admin socket at admin_path and
// returns the broker's answer; an error if it cannot connect or write, if the
// broker closes the connection without answering (PROTOCOL_ERROR), or if the
// whole exchange takes longer than `timeout` (TIMEOUT). Never raises SIGPIPE.
Result<std::string> AskAdmin(const std::string& admin_path, const std::string& command,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace membroker::ipc
