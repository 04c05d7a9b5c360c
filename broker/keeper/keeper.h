// membrokerd --supervise: the keeper. A parent process that starts the broker,
// holds what systemd's file descriptor store would hold, and starts the broker
// again with it when it dies - wherever the broker runs (a container, a CI job,
// a shell). It speaks systemd's side of the same protocols, so the broker's
// code path is the one it takes under systemd: the broker sends sd_notify(3)
// datagrams (READY=1, FDSTORE=1 with its memfds, FDSTOREREMOVE=1) to the
// keeper's NOTIFY_SOCKET, and a restarted broker gets the stored fds as
// socket activation passes them (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID).
//
// It handles no request and allocates nothing of its own beyond the fds: a
// datagram is accepted only from the broker it started (the kernel's
// SCM_CREDENTIALS), SIGTERM and SIGINT are forwarded, a crash is followed by a
// restart after a back-off that grows in a crash loop, a clean exit of the
// broker ends the keeper with it, and as PID 1 of a container it reaps every
// child. docs/RESTART.md says what survives what.
#pragma once

#include <string>
#include <vector>

namespace membroker::broker::keeper {

struct KeeperOptions {
  std::string broker_path;               // the membrokerd binary to start
  std::vector<std::string> broker_args;  // its arguments, without --supervise and --ready-fd
  int ready_fd = -1;                     // "READY <pid>\n" here each time a broker becomes ready
  size_t fd_store_max = 65536;           // as FileDescriptorStoreMax= in the shipped unit
};

// Runs until the broker exits cleanly or the keeper is told to stop; returns
// the process's exit code.
int RunKeeper(const KeeperOptions& options);

// Splits membrokerd's argv for --supervise: *keeper gets the keeper's options
// (--supervise and --ready-fd N are taken out; every other argument is the
// broker's). False with *error when --ready-fd has no valid number.
bool SplitSuperviseArgs(int argc, char** argv, KeeperOptions* keeper, std::string* error);

}  // namespace membroker::broker::keeper
