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

// When the process now running as pid started (clock ticks since boot, field
// 22 of /proc/PID/stat). A pid and its start time name one process instance
// for good - a pid reused later has a later start time - without holding an
// fd. NOT_FOUND if no process has that pid; RESOURCE_EXHAUSTED if no fd is
// left to read it with.
Result<uint64_t> ProcessStartTime(pid_t pid);

}  // namespace membroker::ipc
