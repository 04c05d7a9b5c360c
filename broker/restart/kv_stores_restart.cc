// KV-cache stores across a restart (kv_stores_restart.h).
#include "restart/kv_stores_restart.h"

#include <algorithm>
#include <chrono>

#include "log.h"
#include "memory/accounting.h"

namespace membroker::broker {

Result<uint64_t> SendKvStores(const KvStores& kv,
                              const std::function<Status(ipc::Message, std::span<const int>)>& send) {
  for (const auto& [name, store] : kv.all()) {
    ipc::TakeOverKvStore frame{store->id(), {}};
    std::vector<int> fds;
    for (uint32_t part = 0; part <= store->slab_count(); ++part) {
      frame.handles.push_back(part);
      fds.push_back(part == 0 ? store->index_fd() : *store->SlabFd(part - 1));
      if (frame.handles.size() == ipc::kMaxReattachHandles || part == store->slab_count()) {
        MB_RETURN_IF_ERROR(send(frame, fds));
        frame.handles.clear();
        fds.clear();
      }
    }
  }
  return static_cast<uint64_t>(kv.all().size());
}

Status KvStoreParts::Add(uint64_t store, uint64_t generation, uint32_t part, ipc::UniqueFd fd) {
  if (part > kKvMaxSlabs)
    return Status(ErrorCode::kProtocolError, "store " + std::to_string(store) + " has no part " + std::to_string(part));
  auto [it, fresh] = stores_.try_emplace(store);
  Parts& p = it->second;
  p.max_generation = std::max(p.max_generation, generation);
  if (fresh || generation < p.generation) {
    p = Parts{generation, p.max_generation, {}, {}};
  } else if (generation > p.generation) {
    return Status::Ok();  // a newer set, perhaps not whole: the older one is
  }
  ipc::UniqueFd* slot = &p.index;
  if (part > 0) {
    if (p.slabs.size() < part) p.slabs.resize(part);
    slot = &p.slabs[part - 1];
  }
  if (slot->valid())
    return Status(ErrorCode::kProtocolError,
                  "part " + std::to_string(part) + " of store " + std::to_string(store) + " came twice");
  *slot = std::move(fd);
  return Status::Ok();
}

size_t KvStoreParts::RestoreInto(KvStores& kv, Accounting& limits) {
  size_t restored = 0;
  for (auto& entry : stores_) {
    const uint64_t id = entry.first;  // (named: a lambda below uses them)
    Parts& parts = entry.second;
    const auto start = std::chrono::steady_clock::now();
    auto made = [&]() -> Result<BlockStore::Restored> {
      if (!parts.index.valid()) return Status(ErrorCode::kProtocolError, "its index did not come");
      MB_ASSIGN_OR_RETURN(KvIndex::Contents index, KvIndex::Read(parts.index.get()));
      if (index.store != id)
        return Status(ErrorCode::kProtocolError, "its index names store " + std::to_string(index.store));
      parts.index.reset();
      return BlockStore::Restore(index, std::move(parts.slabs), std::max(index.generation, parts.max_generation) + 1);
    }();
    Status st = made.status();
    if (made.ok()) {
      const uid_t uid = made->store->spec().uid;
      const Usage charge = Usage::For(made->store->bytes(), false, -1);
      auto adopted = kv.Adopt(std::move(made->store));
      st = adopted.status();
      if (adopted.ok()) {
        limits.ChargeUid(uid, charge);
        ++restored;
        MB_INFO("kv_store_restored", "store=\"%s\" id=%llu blocks=%llu dropped=%llu ms=%lld",
                LogText((*adopted)->spec().name).c_str(), static_cast<unsigned long long>(id),
                static_cast<unsigned long long>(made->blocks), static_cast<unsigned long long>(made->dropped),
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
                        .count()));
        continue;
      }
    }
    MB_WARN("kv_store_lost", "id=%llu reason=\"%s\"", static_cast<unsigned long long>(id),
            LogText(st.message()).c_str());
  }
  stores_.clear();
  return restored;
}

}  // namespace membroker::broker
