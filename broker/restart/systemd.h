// The broker as a systemd service: socket activation and the file descriptor
// store (the fds systemd passed, LISTEN_FDS / LISTEN_FDNAMES; FDSTORE=1),
// readiness and status (sd_notify READY=1, STATUS=, STOPPING=1) and the
// watchdog. Built with libsystemd where it is installed; without it, or when
// not started by systemd (no LISTEN_FDS, no NOTIFY_SOCKET), every function
// here does nothing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "membroker/ipc/unique_fd.h"

namespace membroker::broker::systemd {

// What systemd passed at start, taken once (the environment is cleared).
struct PassedFds {
  ipc::UniqueFd client_socket;  // the SOCK_SEQPACKET listening socket, if one came
  std::vector<std::pair<std::string, ipc::UniqueFd>> stored;  // the rest, by FDNAME
};
PassedFds TakePassedFds();

// sd_notify(3) with `state` ("READY=1\nSTATUS=..."); false when nobody listens.
bool Notify(const std::string& state);
// FDSTORE=1 with FDNAME=name: systemd keeps a duplicate of fd for the next
// start of this service. False when nobody listens.
bool StoreFd(const std::string& name, int fd);
// FDSTOREREMOVE=1: systemd closes every stored fd of that name.
bool RemoveStoredFds(const std::string& name);
// Whether this service has a file descriptor store: $FDSTORE (set by
// systemd 254 and later to FileDescriptorStoreMax=) is a positive number.
bool StoreAnnounced();

// The watchdog interval systemd asked for (WATCHDOG_USEC), in ms; 0 if none.
uint64_t WatchdogIntervalMs();

// Whether this build has libsystemd (for the docs and the tests).
bool Available();

}  // namespace membroker::broker::systemd
