// membrokerctl top: a live view of a broker - clients, memory by client and
// by kind, request rates - redrawn every interval from the admin socket's
// JSON (`stats`, `list clients`); q, Ctrl-C or the end of stdin quits.
#pragma once

#include <string>

namespace membroker::ctl {

// Redraws until told to quit; with once, prints one frame (no screen
// control) and returns 1 if the broker could not be reached.
int RunTop(const std::string& admin, int interval_ms, bool once);

}  // namespace membroker::ctl
