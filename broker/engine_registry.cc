// EngineRegistry (engine_registry.h).
#include "engine_registry.h"

#include <algorithm>
#include <set>

#include "log.h"

namespace membroker::broker {

namespace {
const std::string kNone;
}  // namespace

Engine* EngineRegistry::Find(const std::string& name) {
  auto it = engines_.find(name);
  return it == engines_.end() ? nullptr : &it->second;
}

const Engine* EngineRegistry::Find(const std::string& name) const {
  auto it = engines_.find(name);
  return it == engines_.end() ? nullptr : &it->second;
}

Engine* EngineRegistry::OwnedBy(uint64_t session_id) {
  auto it = by_owner_.find(session_id);
  return it == by_owner_.end() ? nullptr : Find(it->second);
}

const std::string& EngineRegistry::NameOf(uint64_t session_id) const {
  auto it = by_owner_.find(session_id);
  return it == by_owner_.end() ? kNone : it->second;
}

Engine& EngineRegistry::Add(const std::string& name, uint64_t session_id, uint64_t control_allocation,
                            bool restoring) {
  Engine& e = engines_[name];
  e = Engine{};
  e.session_id = session_id;
  e.control_allocation = control_allocation;
  e.restoring = restoring;
  by_owner_[session_id] = name;
  return e;
}

void EngineRegistry::RemoveOwnedBy(uint64_t session_id) {
  auto owner = by_owner_.find(session_id);
  if (owner == by_owner_.end()) return;
  if (const Engine* e = Find(owner->second))
    MB_INFO("engine_down", "client=%llu engine=\"%s\" regions=%zu peers=%zu", static_cast<unsigned long long>(session_id),
            LogText(owner->second).c_str(), e->regions.size(), e->peers.size());
  engines_.erase(owner->second);
  by_owner_.erase(owner);
}

Result<uint32_t> EngineRegistry::Connect(uint64_t peer_id, const std::string& name) {
  Engine* e = Find(name);
  if (e == nullptr) return Status(ErrorCode::kNotConnected, "not connected to engine \"" + name + "\"");
  if (e->peers.count(peer_id))
    return Status(ErrorCode::kAlreadyConnected, "already connected to engine \"" + name + "\"");
  std::vector<bool> used(kEngineSlots, false);
  for (const auto& [id, slot] : e->peers) used[slot] = true;
  auto free_slot = std::find(used.begin(), used.end(), false);
  if (free_slot == used.end())
    return Status(ErrorCode::kResourceExhausted,
                  "engine \"" + name + "\" has " + std::to_string(kEngineSlots) + " peers already");
  const uint32_t slot = static_cast<uint32_t>(free_slot - used.begin());
  e->peers[peer_id] = slot;
  return slot;
}

std::optional<uint32_t> EngineRegistry::SlotOf(uint64_t peer_id, const std::string& name) const {
  const Engine* e = Find(name);
  if (e == nullptr) return std::nullopt;
  auto it = e->peers.find(peer_id);
  if (it == e->peers.end()) return std::nullopt;
  return it->second;
}

bool EngineRegistry::Disconnect(uint64_t peer_id, const std::string& name) {
  Engine* e = Find(name);
  return e != nullptr && e->peers.erase(peer_id) == 1;
}

uint64_t EngineRegistry::AddRegion(Engine& e, const ipc::EngineRegion& r) {
  ipc::EngineRegion region = r;
  region.id = next_region_id_++;
  e.regions[region.address] = region;
  return region.id;
}

Status EngineRegistry::QueueNotify(Engine& e, const std::string& remote, ipc::EngineNotify n) {
  if (e.notifies.size() >= kMaxQueuedNotifies) {
    ++e.notifies_dropped;
    return Status(ErrorCode::kResourceExhausted,
                  "engine \"" + remote + "\" has " + std::to_string(kMaxQueuedNotifies) +
                      " notifies unread (its queue is full)");
  }
  e.notifies.push_back(std::move(n));
  return Status::Ok();
}

void EngineRegistry::OnSessionEnd(uint64_t session_id) {
  for (auto& [name, e] : engines_) e.peers.erase(session_id);
  RemoveOwnedBy(session_id);
}

Status EngineRegistry::Check(const std::function<bool(uint64_t)>& session_alive) const {
  auto broken = [](const std::string& what) { return Status(ErrorCode::kInternal, "tables disagree: " + what); };
  if (by_owner_.size() != engines_.size()) return broken("the engine owner index and the engines differ in size");
  for (const auto& [name, e] : engines_) {
    auto owner = by_owner_.find(e.session_id);
    if (owner == by_owner_.end() || owner->second != name)
      return broken("engine \"" + name + "\" is not indexed under its owner");
    if (!session_alive(e.session_id)) return broken("engine \"" + name + "\" outlived its client");
    std::set<uint32_t> slots;
    for (const auto& [peer, slot] : e.peers) {
      if (!session_alive(peer)) return broken("a peer of engine \"" + name + "\" left without disconnecting");
      if (slot >= kEngineSlots || !slots.insert(slot).second)
        return broken("engine \"" + name + "\" gave slot " + std::to_string(slot) + " twice or out of range");
    }
  }
  return Status::Ok();
}

std::vector<HostEngine> EngineRegistry::Listening() const {
  std::vector<HostEngine> out;
  for (const auto& [name, e] : engines_)
    if (ValidListenAddress(e.network.listen_address) && ipc::CheckName(name, 128, "").ok())
      out.push_back({name, e.network.listen_address});
  return out;
}

}  // namespace membroker::broker
