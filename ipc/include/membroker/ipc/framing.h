// Framing on SOCK_SEQPACKET: one message is one datagram, with up to
// kMaxFdsPerFrame file descriptors passed by SCM_RIGHTS. A truncated datagram or
// truncated control data is a protocol error; fds that arrived with it are closed.
#pragma once

#include <sys/socket.h>

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::ipc {

inline constexpr size_t kMaxFrameBytes = 64 * 1024;
inline constexpr size_t kMaxFdsPerFrame = 64;  // kMaxReattachHandles

struct Frame {
  std::vector<uint8_t> bytes;
  std::vector<UniqueFd> fds;
};

// Sends one datagram. *would_block (if given) is set when a non-blocking socket
// is full; then nothing was sent and the Status is RESOURCE_EXHAUSTED.
Status SendFrame(int sock, std::span<const uint8_t> bytes, std::span<const int> fds,
                 bool* would_block = nullptr);

// Receives one datagram into *out (received fds are close-on-exec).
// Peer closed: NOT_CONNECTED. Non-blocking socket with nothing to read:
// *would_block is set and the Status is RESOURCE_EXHAUSTED.
Status RecvFrame(int sock, Frame* out, bool* would_block = nullptr);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The connected peer's identity as the kernel recorded it at connect time.
Result<PeerCred> GetPeerCred(int sock);

// The peer's supplementary groups at connect time (SO_PEERGROUPS).
Result<std::vector<gid_t>> GetPeerGroups(int sock);

// Creates a Unix socket of `type` (SOCK_SEQPACKET, SOCK_STREAM) connected to
// path (blocking, close-on-exec).
Result<UniqueFd> ConnectUnix(const std::string& path, int type);
inline Result<UniqueFd> ConnectSeqpacket(const std::string& path) { return ConnectUnix(path, SOCK_SEQPACKET); }

}  // namespace membroker::ipc
