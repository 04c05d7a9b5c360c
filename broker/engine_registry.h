// EngineRegistry: transfer engines as the broker sees them - a name, the
// regions an engine registered, the peers connected to it (each owning one
// slot of the engine's control block, membroker/ipc/engine_control.h) and the
// notifies waiting for it. The broker is where engines find each other;
// payload bytes never pass through it. A connection is kept once, as the
// engine's peer -> slot entry; what a session is connected to is read from there.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cluster/host_record.h"
#include "membroker/ipc/engine_control.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"

namespace membroker::broker {

using ipc::kEngineSlots;
static_assert(kEngineSlots == ipc::kMaxEnginePeers);
inline constexpr size_t kMaxQueuedNotifies = 256;

struct Engine {
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

class EngineRegistry {
 public:
  using Engines = std::map<std::string, Engine>;

  Engine* Find(const std::string& name);
  const Engine* Find(const std::string& name) const;
  // The engine session_id runs, and its name; nullptr/"" if none.
  Engine* OwnedBy(uint64_t session_id);
  const std::string& NameOf(uint64_t session_id) const;
  // A new engine for session_id (which runs none; the name is free).
  Engine& Add(const std::string& name, uint64_t session_id, uint64_t control_allocation, bool restoring);
  // Removes session_id's engine (its regions and inbound peers); the peers'
  // next transfer learns it (NOT_CONNECTED) when it refreshes its regions.
  void RemoveOwnedBy(uint64_t session_id);

  // Gives peer a free slot of e (ALREADY_CONNECTED, RESOURCE_EXHAUSTED).
  Result<uint32_t> Connect(uint64_t peer_id, const std::string& name);
  // The slot peer holds in the named engine, if it is connected to it.
  std::optional<uint32_t> SlotOf(uint64_t peer_id, const std::string& name) const;
  bool Disconnect(uint64_t peer_id, const std::string& name);

  // A new region of e; its id.
  uint64_t AddRegion(Engine& e, const ipc::EngineRegion& r);
  // RESOURCE_EXHAUSTED when e's queue is full (counted as dropped).
  Status QueueNotify(Engine& e, const std::string& remote, ipc::EngineNotify n);

  // At a session's end: its engine goes and its connections to others free their slots.
  void OnSessionEnd(uint64_t session_id);

  const Engines& all() const { return engines_; }
  // The engines that listen for other hosts, as this host's cluster record lists them.
  std::vector<HostEngine> Listening() const;
  size_t size() const { return engines_.size(); }
  bool empty() const { return engines_.empty(); }
  // Owners and peers are live sessions; each slot is one peer's; the owner index agrees.
  Status Check(const std::function<bool(uint64_t)>& session_alive) const;

 private:
  Engines engines_;                             // by name
  std::map<uint64_t, std::string> by_owner_;    // session id -> the engine it runs
  uint64_t next_region_id_ = 1;
};

}  // namespace membroker::broker
