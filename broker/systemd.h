// The broker as a systemd service: socket activation (the client socket
// handed over in LISTEN_FDS), readiness and status (sd_notify READY=1,
// STATUS=, STOPPING=1) and the watchdog. Built with libsystemd where it is
// installed; without it, or when not started by systemd (no LISTEN_FDS, no
// NOTIFY_SOCKET), every function here does nothing.
#pragma once

#include <cstdint>
#include <string>

namespace membroker::broker::systemd {

// The SOCK_SEQPACKET listening socket systemd passed (LISTEN_FDS), or -1.
int ActivatedClientSocket();

// sd_notify(3) with `state` ("READY=1\nSTATUS=..."); false when nobody listens.
bool Notify(const std::string& state);

// The watchdog interval systemd asked for (WATCHDOG_USEC), in ms; 0 if none.
uint64_t WatchdogIntervalMs();

// Whether this build has libsystemd (for the docs and the tests).
bool Available();

}  // namespace membroker::broker::systemd
