// KvStores (kv_stores.h).
#include "kv/kv_stores.h"

#include "membroker/ipc/escape.h"

namespace membroker::broker {

BlockStore* KvStores::Find(uint64_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

const BlockStore* KvStores::FindByName(const std::string& name) const {
  auto it = stores_.find(name);
  return it == stores_.end() ? nullptr : it->second.get();
}

Result<BlockStore*> KvStores::Add(KvStoreSpec spec) {
  if (stores_.count(spec.name) != 0)
    return Status(ErrorCode::kAlreadyExists, "a store named \"" + ipc::EscapeText(spec.name) + "\" exists");
  if (stores_.size() >= kKvMaxStores)
    return Status(ErrorCode::kResourceExhausted,
                  "the broker has " + std::to_string(kKvMaxStores) + " stores already; drop one first");
  const std::string name = spec.name;
  MB_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store, BlockStore::Create(next_id_, std::move(spec)));
  ++next_id_;
  BlockStore* p = store.get();
  by_id_[p->id()] = p;
  stores_[name] = std::move(store);
  return p;
}

Result<std::unique_ptr<BlockStore>> KvStores::Remove(const std::string& name) {
  auto it = stores_.find(name);
  if (it == stores_.end()) return Status(ErrorCode::kNotFound, "no store is named \"" + ipc::EscapeText(name) + "\"");
  if (it->second->InUse())
    return Status(ErrorCode::kBusy, "store \"" + ipc::EscapeText(name) + "\" has " +
                                        std::to_string(it->second->leases_held()) + " leases and " +
                                        std::to_string(it->second->writing_blocks()) +
                                        " blocks being written; they end first");
  std::unique_ptr<BlockStore> store = std::move(it->second);
  stores_.erase(it);
  dropped_ += store->stats();
  by_id_.erase(store->id());
  return store;
}

KvStoreStats KvStores::Totals() const {
  KvStoreStats sum = dropped_;
  for (const auto& [name, store] : stores_) sum += store->stats();
  return sum;
}

void KvStores::OnSessionEnd(uint64_t session) {
  for (auto& [name, store] : stores_) store->OnSessionEnd(session);
}

Status KvStores::Check() const {
  if (by_id_.size() != stores_.size()) return Status(ErrorCode::kInternal, "the stores' ids are off");
  for (const auto& [name, store] : stores_) MB_RETURN_IF_ERROR(store->Check());
  return Status::Ok();
}

}  // namespace membroker::broker
