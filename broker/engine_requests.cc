// Transfer-engine requests over the EngineRegistry: names, registered regions,
// connections, the fds of broker-backed regions for connected peers, and
// notifies between engines.
#include <algorithm>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"
#include "memory/memfd.h"
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
  if (const Session* owner = sessions_.Find(e.session_id)) r.pid = owner->cred.pid;
  r.slot = slot;
  r.control_allocation = e.control_allocation;
  for (const auto& [addr, region] : e.regions) r.regions.push_back(region);
  return r;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineInitRequest& m) {
  if (Engine* own = engines_.OwnedBy(s.id);
      own != nullptr && own->restoring && m.name == engines_.NameOf(s.id) && !m.restoring) {
    // A reattached engine with its ranges back: peers may connect now.
    own->restoring = false;
    AnswerWaiters(Waiter::Kind::kConnect, m.name,
                  [&](Session& peer, uint64_t rid) { return ConnectPeer(peer, rid, m.name); });
    return Status::Ok();
  }
  if (engines_.OwnedBy(s.id) != nullptr)
    return Status(ErrorCode::kAlreadyExists, "this client already runs engine \"" + engines_.NameOf(s.id) + "\"");
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxEngineNameBytes, "an engine name"));
  if (const Engine* taken = engines_.Find(m.name)) {
    const uint64_t owner = taken->session_id;
    if (!ReapIfExited(owner))
      return Status(ErrorCode::kAlreadyExists,
                    "engine name \"" + m.name + "\" is in use by client " + std::to_string(owner));
  }
  const Allocation* control = holdings_.Find(m.control_allocation);
  if (!s.ledger.Holds(m.control_allocation) || control == nullptr || control->size < 4096)
    return Status(ErrorCode::kParamInvalid,
                  "the control allocation must be one of this client's allocations (>= 4 KiB)");
  const Engine& e = engines_.Add(m.name, s.id, m.control_allocation, m.restoring);
  MB_INFO("engine_up", "client=%llu engine=\"%s\"%s", static_cast<unsigned long long>(s.id),
          LogText(m.name).c_str(), m.restoring ? " restoring=1" : "");
  if (e.restoring) return Status::Ok();  // peers connect once it is whole
  AnswerWaiters(Waiter::Kind::kResolve, m.name, [&](Session& peer, uint64_t rid) {
    Send(peer, rid, ipc::EngineResolveReply{});  // it is this host's
    return Status::Ok();
  });
  // Peers that were waiting for this name connect now.
  AnswerWaiters(Waiter::Kind::kConnect, m.name,
                [&](Session& peer, uint64_t rid) { return ConnectPeer(peer, rid, m.name); });
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineFinalizeRequest&) {
  if (engines_.OwnedBy(s.id) == nullptr) return NoEngine();
  // Its peers are disconnected (their next transfer learns it when it
  // refreshes the region list), and its own connections end.
  engines_.OnSessionEnd(s.id);
  cluster_.SetEngines(engines_.Listening());
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineRegisterRequest& m) {
  Engine* own = engines_.OwnedBy(s.id);
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
  if (!m.name.empty()) MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxRegionNameBytes, "a region name"));
  if (!m.name.empty())
    for (const auto& [address, r] : e.regions)
      if (r.name == m.name)
        return Status(ErrorCode::kAlreadyExists, "this engine has a range named \"" + ipc::EscapeText(m.name) + "\" already");
  bool read_only = false;
  if (m.allocation != 0) {
    const Allocation* a = holdings_.Find(m.allocation);
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
  return ipc::EngineRegisterReply{
      engines_.AddRegion(e, ipc::EngineRegion{0, m.address, m.length, m.allocation, m.offset, read_only, m.name})};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineDeregisterRequest& m) {
  Engine* own = engines_.OwnedBy(s.id);
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

Status Broker::ConnectPeer(Session& peer, uint64_t rid, const std::string& name) {
  const Engine* e = engines_.Find(name);
  const Session* owner = e == nullptr ? nullptr : sessions_.Find(e->session_id);
  if (owner == nullptr) return NotConnectedTo(name);
  if (owner->cred.uid != peer.cred.uid)
    return Status(ErrorCode::kPermissionDenied, "engine \"" + name + "\" belongs to another user (uid " +
                                                    std::to_string(owner->cred.uid) + ")");
  MB_ASSIGN_OR_RETURN(uint32_t slot, engines_.Connect(peer.id, name));
  Send(peer, rid, EngineInfo(*e, slot));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::EngineConnectRequest& m) {
  if (engines_.OwnedBy(s.id) == nullptr) return NoEngine();
  if (m.remote.empty()) return Status(ErrorCode::kParamInvalid, "remote engine name is empty");
  // An engine whose process has exited (its socket's end not read yet) is
  // absent: the connect waits for the name's next owner.
  if (const Engine* e = engines_.Find(m.remote); e != nullptr && !e->restoring) {
    const uint64_t owner = e->session_id;
    if (!ReapIfExited(owner)) return SentOnSuccess(ConnectPeer(s, rid, m.remote));
  }
  if (m.timeout_ms == 0)
    return Status(ErrorCode::kNotFound, "no engine named \"" + m.remote + "\"");
  return SentOnSuccess(waiters_.Add({Waiter::Kind::kConnect, s.id, rid, m.remote}, m.timeout_ms));
}

// Where an engine is: this host's (connect by name here, as without a
// cluster), or another host's by its cluster record; else it waits for either.
Answer Broker::Handle(Session& s, uint64_t rid, const ipc::EngineResolveRequest& m) {
  if (engines_.OwnedBy(s.id) == nullptr) return NoEngine();
  if (!cluster_.started() || engines_.Find(m.remote) != nullptr) return ipc::EngineResolveReply{};
  if (std::optional<EngineLocation> at = cluster_.FindEngine(m.remote))
    return ipc::EngineResolveReply{at->host, static_cast<uint64_t>(at->generation), at->address};
  if (m.timeout_ms == 0) {
    const ClusterView v = cluster_.View();
    if (!v.watching)
      return Status(ErrorCode::kNotConnected, "no engine named \"" + m.remote +
                                                  "\" here, and etcd is out of reach: " + v.error);
    return Status(ErrorCode::kNotFound, "no engine named \"" + m.remote + "\" on any host of the cluster");
  }
  return SentOnSuccess(waiters_.Add({Waiter::Kind::kResolve, s.id, rid, m.remote}, m.timeout_ms));
}

// The cluster's table changed: other hosts' name events go to cluster
// subscribers, and resolves waiting for an engine and lookups waiting for a
// name now listed elsewhere are answered.
void Broker::OnClusterChanged() {
  for (const ClusterNameEvent& e : cluster_.TakeNameEvents()) PostEvent(e.kind, e.name, 0, 0, e.host);
  for (const std::string& name : waiters_.Keys(Waiter::Kind::kClusterLookup)) {
    const std::optional<NameLocation> at = cluster_.FindName(name);
    if (!at) continue;
    const ipc::ClusterLookupReply reply = at->Reply();
    AnswerWaiters(Waiter::Kind::kClusterLookup, name, [&](Session& peer, uint64_t rid) {
      Send(peer, rid, reply);
      return Status::Ok();
    });
  }
  for (const std::string& name : waiters_.Keys(Waiter::Kind::kResolve)) {
    const std::optional<EngineLocation> at = cluster_.FindEngine(name);
    if (!at) continue;
    const ipc::EngineResolveReply reply{at->host, static_cast<uint64_t>(at->generation), at->address};
    AnswerWaiters(Waiter::Kind::kResolve, name, [&](Session& peer, uint64_t rid) {
      Send(peer, rid, reply);
      return Status::Ok();
    });
  }
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineRegionsRequest& m) {
  const std::optional<uint32_t> slot = engines_.SlotOf(s.id, m.remote);
  if (!slot) return NotConnectedTo(m.remote);
  return EngineInfo(*engines_.Find(m.remote), *slot);
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::EngineImportRequest& m) {
  if (!engines_.SlotOf(s.id, m.remote)) return NotConnectedTo(m.remote);
  const Engine& e = *engines_.Find(m.remote);
  bool registered = m.allocation == e.control_allocation;
  for (const auto& [addr, r] : e.regions) registered |= (r.allocation == m.allocation);
  const Allocation* a = holdings_.Find(m.allocation);
  if (!registered || a == nullptr || m.allocation == 0)
    return Status(ErrorCode::kNotFound, "allocation " + std::to_string(m.allocation) +
                                            " is not registered by engine \"" + m.remote + "\"");
  const Session* owner = sessions_.Find(e.session_id);
  // What the owner may only read, its peers may only read too.
  const bool read_only = m.allocation != e.control_allocation && owner != nullptr &&
                         owner->ledger.ReadOnly(m.allocation);
  ipc::UniqueFd ro;
  if (read_only) {
    MB_ASSIGN_OR_RETURN(ro, BackendOf(a->memory, holdings_.backend()).ReadOnlyFd(a->memory));
  }
  return SentOnSuccess(Grant(s, rid, *a, read_only ? ro.get() : a->memory.fd.get(), read_only, Holding::kEngine));
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineReleaseRequest& m) {
  if (!holdings_.Release(s, m.allocation, Holding::kEngine))
    return Status(ErrorCode::kInvalidHandle, "this client's engine does not hold allocation " +
                                                 std::to_string(m.allocation));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineDisconnectRequest& m) {
  if (!engines_.Disconnect(s.id, m.remote)) return NotConnectedTo(m.remote);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineNotifyRequest& m) {
  if (engines_.OwnedBy(s.id) == nullptr) return NoEngine();
  if (!engines_.SlotOf(s.id, m.remote)) return NotConnectedTo(m.remote);
  Engine& to = *engines_.Find(m.remote);
  MB_RETURN_IF_ERROR(engines_.QueueNotify(to, m.remote, ipc::EngineNotify{engines_.NameOf(s.id), m.name, m.message}));
  if (Session* owner = sessions_.Find(to.session_id)) Wake(*owner);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineNetworkRequest& m) {
  Engine* own = engines_.OwnedBy(s.id);
  if (own == nullptr) return NoEngine();
  own->network = m;
  cluster_.SetEngines(engines_.Listening());
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::EngineGetNotifiesRequest&) {
  Engine* own = engines_.OwnedBy(s.id);
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
  Engine* own = engines_.OwnedBy(s.id);
  if (own == nullptr) return NoEngine();
  ipc::EnginePeersReply r;
  for (const auto& [peer_id, slot] : own->peers)
    if (const Session* peer = sessions_.Find(peer_id)) r.peers.push_back({slot, peer->cred.pid});
  return r;
}

}  // namespace membroker::broker
