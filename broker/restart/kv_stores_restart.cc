// KV-cache stores across a restart (kv_stores_restart.h).
#include "restart/kv_stores_restart.h"

#include <algorithm>
#include <chrono>
#include <memory>

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

namespace {
void LogLost(uint64_t id, const Status& why) {
  MB_WARN("kv_store_lost", "id=%llu reason=\"%s\"", static_cast<unsigned long long>(id),
          LogText(why.message()).c_str());
}
}  // namespace

size_t KvStoreParts::RestoreInto(KvStores& kv, Accounting& limits, Workers& workers,
                                 std::function<void(uint64_t store)> ended) {
  size_t restoring = 0;
  if (!ended) ended = [](uint64_t) {};
  for (auto& entry : stores_) {
    const uint64_t id = entry.first;  // (named: a lambda below uses them)
    Parts& parts = entry.second;
    auto index = [&]() -> Result<KvIndex::Contents> {
      if (!parts.index.valid()) return Status(ErrorCode::kProtocolError, "its index did not come");
      MB_ASSIGN_OR_RETURN(KvIndex::Contents contents, KvIndex::Read(parts.index.get()));
      if (contents.store != id)
        return Status(ErrorCode::kProtocolError, "its index names store " + std::to_string(contents.store));
      return contents;
    }();
    if (!index.ok()) {
      LogLost(id, index.status());
      ended(id);
      continue;
    }
    parts.index.reset();
    struct Job {
      KvIndex::Contents index;
      std::vector<ipc::UniqueFd> slabs;
      uint64_t generation = 0;
      Result<BlockStore::Restored> made = Status(ErrorCode::kInternal, "the restore did not run");
      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    };
    auto job = std::make_shared<Job>();
    job->generation = std::max(index->generation, parts.max_generation) + 1;
    job->index = std::move(*index);
    job->slabs = std::move(parts.slabs);
    kv.BeginRestore(id, job->index.spec.name);
    ++restoring;
    workers.Run([job] { job->made = BlockStore::Restore(job->index, std::move(job->slabs), job->generation); },
                [&kv, &limits, job, id, ended] {
                  Result<std::unique_ptr<BlockStore>> store = job->made.status();
                  uid_t uid = 0;
                  Usage charge{};
                  if (job->made.ok()) {
                    uid = job->made->store->spec().uid;
                    charge = Usage::For(job->made->store->bytes(), false, -1);
                    store = std::move(job->made->store);
                  }
                  Result<BlockStore*> adopted = kv.EndRestore(id, std::move(store));
                  ended(id);
                  // A store the broker is configured to have and the restore lost is made anew.
                  if (Status st = kv.MakeConfigured(limits); !st.ok())
                    MB_WARN("kv_store_not_made", "reason=\"%s\"", LogText(st.message()).c_str());
                  if (!adopted.ok()) return LogLost(id, adopted.status());
                  limits.ChargeUid(uid, charge);
                  MB_INFO("kv_store_restored", "store=\"%s\" id=%llu blocks=%llu dropped=%llu ms=%lld",
                          LogText((*adopted)->spec().name).c_str(), static_cast<unsigned long long>(id),
                          static_cast<unsigned long long>(job->made->blocks),
                          static_cast<unsigned long long>(job->made->dropped),
                          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                     std::chrono::steady_clock::now() - job->start)
                                                     .count()));
                });
  }
  stores_.clear();
  return restoring;
}

}  // namespace membroker::broker
