// Transfer engines as the broker sees them: a name, the regions an engine
// registered, the peers connected to it and the notifies waiting for it. The
// broker is the place engines find each other; payload bytes never pass
// through it (peers map broker-backed regions themselves, or use cross-memory
// attach for an engine's own registered memory).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "membroker/ipc/engine_control.h"
#include "membroker/ipc/protocol.h"

namespace membroker::broker {

// Peers per engine: each connected peer owns one slot of the engine's control
// block (membroker/ipc/engine_control.h).
using ipc::kEngineSlots;
static_assert(kEngineSlots == ipc::kMaxEnginePeers);
inline constexpr size_t kMaxQueuedNotifies = 256;

struct Engine {
  std::string name;
  uint64_t session_id = 0;
  uint64_t control_allocation = 0;
  std::map<uint64_t, ipc::EngineRegion> regions;  // by address
  std::map<uint64_t, uint32_t> peers;             // connected session id -> slot
  std::deque<ipc::EngineNotify> notifies;
  uint64_t notifies_dropped = 0;
  // Reattaching: registered again range by range, so hidden from Connect
  // until its owner says it is whole (a second EngineInitRequest).
  bool restoring = false;
  // What its client last said of its network side (engines on other hosts).
  ipc::EngineNetworkRequest network;
};


}  // namespace membroker::broker
