// pidfds: a handle on one process instance. Unlike a pid, a pidfd never comes
// to mean another process after the first one exits, so the broker uses them
// to keep allow-list entries and connections tied to the process they named.
#pragma once

#include <sys/types.h>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::ipc {

// pidfd_open(2). NOT_FOUND if no such process exists; UNSUPPORTED where the
// kernel (or valgrind) has no pidfd_open.
Result<UniqueFd> PidfdOpen(pid_t pid);

// Whether the process behind the pidfd is still running (not exited). An
// invalid fd (no pidfd support) counts as running: then only pids are checked.
bool PidfdAlive(int pidfd);

// PidfdOpen, except that a kernel without pidfds gives an invalid UniqueFd
// instead of an error (the caller then has the weaker, pid-only guarantee).
Result<UniqueFd> PidfdOpenIfSupported(pid_t pid);

}  // namespace membroker::ipc
