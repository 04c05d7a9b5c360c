// Unix socket files: the broker's sockets are created here, and a stale file
// left by a dead broker is told from a live broker's before it is replaced.
#pragma once

#include <sys/types.h>

#include <string>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

// A group name or number (not 4294967295, which chown reads as "no change").
Result<gid_t> ResolveGroup(const std::string& name);
// Prepares a Unix socket path for bind: a stale socket file (nobody accepting)
// is removed; a live broker or a non-socket file there is an error.
Status PrepareSocketPath(const std::string& path);
// PrepareSocketPath, then a non-blocking SOCK_SEQPACKET socket bound at path
// under umask_bits (0117: mode 0660). *bound turns true once the file exists
// (the caller removes it); the caller listens.
Status BindSeqpacket(const std::string& path, mode_t umask_bits, ipc::UniqueFd* out, bool* bound);

}  // namespace membroker::broker
