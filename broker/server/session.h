// Session: one connected client - its socket, identity, holdings and the replies
// waiting to be sent. Filed in Sessions; freed in the uv_close callback.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "memory/accounting.h"
#include "memory/ledger.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"

namespace membroker::broker {

// Why a session ended: one list, for the code that ends it, the logs and the
// counters (stats derive from these). A peer that closed is a crash unless it
// said goodbye (PeerEnded).
#define MEMBROKER_CLOSE_REASONS(X)                \
  X(kClean, "clean")                              \
  X(kCrash, "crash")                              \
  X(kProtocolViolation, "protocol_violation")     \
  X(kSlowReader, "slow_reader")                   \
  X(kKicked, "kicked")                            \
  X(kNotAdmitted, "not_admitted")                 \
  X(kBrokerStopping, "broker_stopping")           \
  X(kIoError, "io_error")                         \
  X(kHandshakeTimeout, "handshake_timeout")       \
  X(kRefused, "refused")

enum class CloseReason {
#define MEMBROKER_CLOSE_ENUM(e, name) e,
  MEMBROKER_CLOSE_REASONS(MEMBROKER_CLOSE_ENUM)
#undef MEMBROKER_CLOSE_ENUM
};
inline constexpr size_t kCloseReasonCount = 0
#define MEMBROKER_CLOSE_COUNT(e, name) +1
    MEMBROKER_CLOSE_REASONS(MEMBROKER_CLOSE_COUNT);
#undef MEMBROKER_CLOSE_COUNT

inline const char* CloseReasonName(CloseReason r) {
  static constexpr const char* kNames[] = {
#define MEMBROKER_CLOSE_NAME(e, name) name,
      MEMBROKER_CLOSE_REASONS(MEMBROKER_CLOSE_NAME)
#undef MEMBROKER_CLOSE_NAME
  };
  return kNames[static_cast<size_t>(r)];
}

// Where a session holds a reference: its ledger (created, imported, looked
// up) or its engine's holdings (EngineImport of a peer's region).
enum class Holding { kLedger, kEngine };

struct OutFrame {
  std::vector<uint8_t> bytes;
  std::vector<ipc::UniqueFd> fds;  // sent with the frame, then closed here
};

// One connected client: its socket, identity, holdings and queued replies.
// Owned by Sessions; what it has in the registries is theirs, by its id.
struct Session {
  uint64_t id = 0;
  ipc::UniqueFd fd;
  uv_poll_t poll{};
  ipc::PeerCred cred;
  ipc::UniqueFd pidfd;        // the process that connected (pids can be recycled)
  ipc::UniqueFd wake;         // its wake socket's sending end, if it gave one (server/wake.cc)
  bool admitted = false;      // passed the uid/gid policy
  std::string name;
  std::chrono::system_clock::time_point connected_since;
  uint64_t accepted_ms = 0;  // uv_now() at accept: the handshake deadline counts from here
  uint64_t start_time = 0;   // its process's, read at its first pid-checked import
  bool hello_done = false;
  bool reattaching = false;     // said hello with the reattach feature (reattach.cc)
  bool said_goodbye = false;    // a clean exit; anything else is counted as a crash
  bool closing = false;         // uv_close has been called
  bool close_after_flush = false;
  CloseReason close_reason = CloseReason::kProtocolViolation;  // once the queue is flushed
  bool polling_writable = false;
  uint32_t inflight = 0;        // requests handed to worker threads
  uint64_t frames_sent = 0;     // replies and events sent (a turn ends with one)
  // Its holdings (memory/holdings.h): references, charges, host registrations.
  Ledger ledger;
  Usage usage;                            // charged to this client
  std::map<uint64_t, uint64_t> host_regs;  // HostRegister: address -> size
  // Regions of other engines its engine imported (EngineImport), held apart
  // from the ledger so both can hold one allocation.
  Ledger engine_holdings;
  // Replies waiting for the socket (Sessions counts them for all sessions).
  std::deque<OutFrame> outbound;
  uint64_t outbound_bytes = 0;  // bytes of the frames in `outbound`
};

// Its wake socket (WakeRequest, server/wake.cc): kept if it is an AF_UNIX
// datagram socket (PARAM_INVALID otherwise); Wake sends it a byte, never blocking.
Status SetWakeSocket(Session& s, ipc::UniqueFd fd);
void Wake(const Session& s);

// How a session whose peer closed ended: clean after a goodbye, a crash otherwise.
inline CloseReason PeerEnded(const Session& s) { return s.said_goodbye ? CloseReason::kClean : CloseReason::kCrash; }

}  // namespace membroker::broker
