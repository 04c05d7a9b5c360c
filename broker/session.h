// Session: one connected client - its socket, identity, ledger and the replies
// waiting to be sent. Owned by the Broker; freed in the uv_close callback.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "accounting.h"
#include "ledger.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"

namespace membroker::broker {

// Why a connection ended, as the code that ends it sees it.
enum class CloseReason { kPeerClosed, kProtocolViolation, kSlowReader, kKicked, kNotAdmitted,
                         kBrokerStopping, kIoError, kHandshakeTimeout, kRefused };

// Where a session holds a reference: its ledger (created, imported, looked
// up) or its engine's holdings (EngineImport of a peer's region).
enum class Holding { kLedger, kEngine };

struct OutFrame {
  std::vector<uint8_t> bytes;
  std::vector<ipc::UniqueFd> fds;  // sent with the frame, then closed here
};

struct Session {
  uint64_t id = 0;
  ipc::UniqueFd fd;
  uv_poll_t poll{};
  ipc::PeerCred cred;
  ipc::UniqueFd pidfd;        // the process that connected (pids can be recycled)
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
  // The holdings component's part (holdings.cc, accounting.h).
  Ledger ledger;
  Usage usage;                            // charged to this client
  std::map<uint64_t, uint64_t> host_regs;  // HostRegister: address -> size
  // The transfer-engine component's part (engines.cc).
  struct EnginePart {
    std::string name;                            // this client's engine; empty: none
    std::map<std::string, uint32_t> connected;   // engines it is connected to -> slot
    // Regions of theirs it imported, held apart from the ledger so both can
    // hold one allocation.
    Ledger holdings;
  } engine;
  // The names component's part (names.cc): prefixes subscribed to, and the
  // events waiting for this client.
  struct EventsPart {
    std::vector<std::string> subscriptions;
    std::deque<ipc::NameEvent> queue;
    uint64_t dropped = 0;
  } events;
  // The sessions component's outbound queue (sessions.cc).
  std::deque<OutFrame> outbound;
  uint64_t outbound_bytes = 0;  // bytes of the frames in `outbound`
};

}  // namespace membroker::broker
