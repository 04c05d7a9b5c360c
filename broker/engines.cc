// Transfer-engine requests: names, registered regions, connections, the fds
// of broker-backed regions for connected peers, and notifies between engines.
#include <algorithm>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/memfd.h"
#include "membroker/ipc/ranges.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kRegionAlign = 4096;

Status NoEngine() {
  return Status(ErrorCode::kParamInvalid, "this client has no engine (call Initialize first)");
}
Status NotConnectedTo(const std::string& remote) {
  return Status(ErrorCode::kNotConnected, "not connected to engine \"" + remote + "\"");
}
}  // namespace

ipc::EngineInfoReply Broker::EngineInfo(const Engine& e, uint32_t slot) const {
  ipc::EngineInfoReply r;
  if (const Session* owner = const_cast<Broker*>(this)->FindSession(e.session_id))
    r.pid = owner->cred.pid;
  r.slot = slot;
  r.control_allocation = e.control_allocation;
  for (const auto& [addr, region] : e.regions) r.regions.push_back(region);
  return r;
}

Engine* Broker::OwnEngine(const Session& s) {
  if (s.engine.name.empty()) return nullptr;
  auto it = engines_.find(s.engine.name);
  return it == engines_.end() ? nullptr : &it->second;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineInitRequest& m) {
  if (Engine* own = OwnEngine(s); own != nullptr && own->restoring && m.name == s.engine.name && !m.restoring) {
    // A reattached engine with its ranges back: peers may connect now.
    Engine& e = *own;
    e.restoring = false;
    AnswerWaiters(Waiter::Kind::kConnect, m.name,
                  [&](Session& peer, uint64_t rid) { return ConnectPeer(peer, rid, e); });
    return Status::Ok();
  }
  if (!s.engine.name.empty())
    return Status(ErrorCode::kAlreadyExists, "this client already runs engine \"" + s.engine.name + "\"");
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxEngineNameBytes, "an engine name"));
  if (auto it = engines_.find(m.name); it != engines_.end() && !ReapIfExited(it->second.session_id))
    return Status(ErrorCode::kAlreadyExists,
                  "engine name \"" + m.name + "\" is in use by client " +
                      std::to_string(it->second.session_id));
  const Allocation* control = table_.Find(m.control_allocation);
  if (!s.ledger.Holds(m.control_allocation) || control == nullptr || control->size < 4096)
    return Status(ErrorCode::kParamInvalid,
                  "the control allocation must be one of this client's allocations (>= 4 KiB)");
  Engine& e = engines_[m.name];
  e.name = m.name;
  e.session_id = s.id;
  e.control_allocation = m.control_allocation;
  e.restoring = m.restoring;
  s.engine.name = m.name;
  MB_INFO("engine_up", "client=%llu engine=\"%s\"%s", static_cast<unsigned long long>(s.id),
          LogText(m.name).c_str(), m.restoring ? " restoring=1" : "");
  if (e.restoring) return Status::Ok();  // peers connect once it is whole
  // Peers that were waiting for this name connect now.
  AnswerWaiters(Waiter::Kind::kConnect, m.name,
                [&](Session& peer, uint64_t rid) { return ConnectPeer(peer, rid, e); });
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineFinalizeRequest&) {
  if (s.engine.name.empty()) return NoEngine();
  EndEngineSession(s);
  return Status::Ok();
}

void Broker::EndEngineSession(Session& s) {
  // Our connections to other engines free their slots.
  for (const auto& [remote, slot] : s.engine.connected)
    if (auto it = engines_.find(remote); it != engines_.end()) it->second.peers.erase(s.id);
  s.engine.connected.clear();
  if (auto it = engines_.find(s.engine.name); !s.engine.name.empty() && it != engines_.end()) {
    // Peers connected to our engine are disconnected; their next transfer
    // learns it (NOT_CONNECTED) when it refreshes the region list.
    for (const auto& [peer_id, slot] : it->second.peers)
      if (Session* peer = FindSession(peer_id)) peer->engine.connected.erase(s.engine.name);
    MB_INFO("engine_down", "client=%llu engine=\"%s\" regions=%zu peers=%zu",
            static_cast<unsigned long long>(s.id), LogText(s.engine.name).c_str(), it->second.regions.size(),
            it->second.peers.size());
    engines_.erase(it);
  }
  s.engine.name.clear();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineRegisterRequest& m) {
  Engine* own = OwnEngine(s);
  if (own == nullptr) return NoEngine();
  Engine& e = *own;
  if (m.length == 0 || m.address == 0 || m.address % kRegionAlign || m.length % kRegionAlign)
    return Status(ErrorCode::kParamInvalid,
                  "a registered range needs a non-zero address and length, both multiples of 4096");
  if (m.address + m.length < m.address) return Status(ErrorCode::kParamInvalid, "range overflows");
  if (e.regions.size() >= ipc::kMaxEngineRegions)
    return Status(ErrorCode::kResourceExhausted,
                  "an engine registers at most " + std::to_string(ipc::kMaxEngineRegions) + " ranges");
  if (ipc::Overlaps(e.regions, m.address, m.length, [](const ipc::EngineRegion& r) { return r.length; }))
    return Status(ErrorCode::kParamInvalid, "range overlaps memory this engine already registered");
  bool read_only = false;
  if (m.allocation != 0) {
    const Allocation* a = table_.Find(m.allocation);
    if (!s.ledger.Holds(m.allocation) || a == nullptr)
      return Status(ErrorCode::kParamInvalid,
                    "allocation " + std::to_string(m.allocation) + " is not held by this client");
    if (m.offset % kRegionAlign || m.offset > a->size || m.length > a->size - m.offset)
      return Status(ErrorCode::kParamInvalid, "offset and length fall outside the allocation");
    read_only = s.ledger.ReadOnly(m.allocation);
  } else {
    if (ipc::Containing(s.host_regs, m.address, m.length, [](uint64_t n) { return n; }) == s.host_regs.end())
      return Status(ErrorCode::kParamInvalid,
                    "the range is neither broker memory nor inside one HostRegister range");
  }
  const uint64_t id = next_region_id_++;
  e.regions[m.address] =
      ipc::EngineRegion{id, m.address, m.length, m.allocation, m.offset, read_only};
  return ipc::EngineRegisterReply{id};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineDeregisterRequest& m) {
  Engine* own = OwnEngine(s);
  if (own == nullptr) return NoEngine();
  auto& regions = own->regions;
  auto r = std::find_if(regions.begin(), regions.end(),
                        [&](const auto& kv) { return kv.second.id == m.region; });
  if (r == regions.end())
    return Status(ErrorCode::kParamInvalid,
                  "region " + std::to_string(m.region) + " is not registered by this engine");
  regions.erase(r);
  return Status::Ok();
}

Status Broker::ConnectPeer(Session& peer, uint64_t rid, Engine& e) {
  if (peer.engine.connected.count(e.name))
    return Status(ErrorCode::kAlreadyConnected, "already connected to engine \"" + e.name + "\"");
  Session* owner = FindSession(e.session_id);
  if (owner == nullptr) return NotConnectedTo(e.name);
  if (owner->cred.uid != peer.cred.uid)
    return Status(ErrorCode::kPermissionDenied,
                  "engine \"" + e.name + "\" belongs to another user (uid " +
                      std::to_string(owner->cred.uid) + ")");
  std::vector<bool> used(kEngineSlots, false);
  for (const auto& [id, slot] : e.peers) used[slot] = true;
  auto free_slot = std::find(used.begin(), used.end(), false);
  if (free_slot == used.end())
    return Status(ErrorCode::kResourceExhausted,
                  "engine \"" + e.name + "\" has " + std::to_string(kEngineSlots) + " peers already");
  const uint32_t slot = static_cast<uint32_t>(free_slot - used.begin());
  e.peers[peer.id] = slot;
  peer.engine.connected[e.name] = slot;
  Send(peer, rid, EngineInfo(e, slot));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::EngineConnectRequest& m) {
  if (s.engine.name.empty()) return NoEngine();
  if (m.remote.empty()) return Status(ErrorCode::kParamInvalid, "remote engine name is empty");
  // An engine whose process has exited (its socket's end not read yet) is
  // absent: the connect waits for the name's next owner.
  if (auto it = engines_.find(m.remote);
      it != engines_.end() && !it->second.restoring && !ReapIfExited(it->second.session_id))
    return SentOnSuccess(ConnectPeer(s, rid, it->second));
  if (m.timeout_ms == 0)
    return Status(ErrorCode::kNotFound, "no engine named \"" + m.remote + "\"");
  return SentOnSuccess(AddWaiter(s, rid, Waiter::Kind::kConnect, m.remote, m.timeout_ms));
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineRegionsRequest& m) {
  auto c = s.engine.connected.find(m.remote);
  auto it = engines_.find(m.remote);
  if (c == s.engine.connected.end() || it == engines_.end()) return NotConnectedTo(m.remote);
  return EngineInfo(it->second, c->second);
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::EngineImportRequest& m) {
  auto it = engines_.find(m.remote);
  if (!s.engine.connected.count(m.remote) || it == engines_.end()) return NotConnectedTo(m.remote);
  const Engine& e = it->second;
  bool registered = m.allocation == e.control_allocation;
  for (const auto& [addr, r] : e.regions) registered |= (r.allocation == m.allocation);
  const Allocation* a = table_.Find(m.allocation);
  if (!registered || a == nullptr || m.allocation == 0)
    return Status(ErrorCode::kNotFound, "allocation " + std::to_string(m.allocation) +
                                            " is not registered by engine \"" + m.remote + "\"");
  Session* owner = FindSession(e.session_id);
  // What the owner may only read, its peers may only read too.
  const bool read_only = m.allocation != e.control_allocation && owner != nullptr &&
                         owner->ledger.ReadOnly(m.allocation);
  ipc::UniqueFd ro;
  if (read_only) {
    MB_ASSIGN_OR_RETURN(ro, backend_.ReadOnlyFd(a->memory));
  }
  return SentOnSuccess(
      GrantImport(s, rid, *a, read_only ? ro.get() : a->memory.fd.get(), read_only, s.engine.holdings));
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineReleaseRequest& m) {
  if (!Release(s, m.allocation, Holding::kEngine))
    return Status(ErrorCode::kInvalidHandle, "this client's engine does not hold allocation " +
                                                 std::to_string(m.allocation));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineDisconnectRequest& m) {
  if (s.engine.connected.erase(m.remote) == 0) return NotConnectedTo(m.remote);
  if (auto it = engines_.find(m.remote); it != engines_.end()) it->second.peers.erase(s.id);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineNotifyRequest& m) {
  auto it = engines_.find(m.remote);
  if (s.engine.name.empty()) return NoEngine();
  if (!s.engine.connected.count(m.remote) || it == engines_.end()) return NotConnectedTo(m.remote);
  Engine& e = it->second;
  if (e.notifies.size() >= kMaxQueuedNotifies) {
    ++e.notifies_dropped;
    return Status(ErrorCode::kResourceExhausted,
                  "engine \"" + m.remote + "\" has " + std::to_string(kMaxQueuedNotifies) +
                      " notifies unread (its queue is full)");
  }
  e.notifies.push_back(ipc::EngineNotify{s.engine.name, m.name, m.message});
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineNetworkRequest& m) {
  Engine* own = OwnEngine(s);
  if (own == nullptr) return NoEngine();
  own->network = m;
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineGetNotifiesRequest&) {
  Engine* own = OwnEngine(s);
  if (own == nullptr) return NoEngine();
  Engine& e = *own;
  ipc::EngineNotifiesReply r;
  r.dropped = e.notifies_dropped;
  while (!e.notifies.empty() && r.notifies.size() < ipc::kMaxNotifiesPerReply) {
    r.notifies.push_back(std::move(e.notifies.front()));
    e.notifies.pop_front();
  }
  return r;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EnginePeersRequest&) {
  Engine* own = OwnEngine(s);
  if (own == nullptr) return NoEngine();
  ipc::EnginePeersReply r;
  for (const auto& [peer_id, slot] : own->peers)
    if (const Session* peer = FindSession(peer_id)) r.peers.push_back({slot, peer->cred.pid});
  return r;
}

}  // namespace membroker::broker
