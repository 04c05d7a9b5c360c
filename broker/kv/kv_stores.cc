// KvStores (kv_stores.h).
#include "kv/kv_stores.h"

#include <sys/random.h>

#include <chrono>
#include <type_traits>
#include <variant>

#include "log.h"
#include "memory/accounting.h"
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

namespace {
// 53 bits, so that the id is exact in a double (Python, JSON).
constexpr uint64_t kIdMask = (uint64_t{1} << 53) - 1;
}  // namespace

bool KvStores::Restoring(const std::string& name) const {
  for (const auto& [id, restoring] : restoring_)
    if (restoring == name) return true;
  return false;
}

Status KvStores::Admit(const std::string& name) const {
  if (stores_.count(name) != 0 || Restoring(name))
    return Status(ErrorCode::kAlreadyExists, "a store named \"" + ipc::EscapeText(name) + "\" exists");
  if (stores_.size() >= kKvMaxStores)
    return Status(ErrorCode::kResourceExhausted,
                  "the broker has " + std::to_string(kKvMaxStores) + " stores already; drop one first");
  return Status::Ok();
}

Status KvStores::OpenDisk(const std::string& dir, uint64_t capacity, bool taking_over) {
  MB_ASSIGN_OR_RETURN(disk_, KvDiskTier::Open(dir, capacity, taking_over));
  for (auto& [name, store] : stores_) HoldEvictedFor(*store);
  return Status::Ok();
}

void KvStores::HoldEvictedFor(BlockStore& store) {
  store.HoldEvicted([disk = disk_.get(), name = store.spec().name](const std::string& key) {
    return !disk->Has(name, key);
  });
}

void KvStores::WhenSlotsFree(uint64_t store, std::function<void()> retry) {
  waiting_.emplace(store, std::move(retry));
}

void KvStores::SlotsFreed(uint64_t store) {
  auto [first, last] = waiting_.equal_range(store);
  std::vector<std::function<void()>> retries;
  for (auto it = first; it != last; ++it) retries.push_back(std::move(it->second));
  waiting_.erase(first, last);
  for (auto& retry : retries) retry();  // (each may wait again)
}

void KvStores::QueueDiskWrite(Workers& workers, std::function<void()> work, std::function<void()> done) {
  disk_writes_.emplace_back(std::move(work), std::move(done));
  if (!disk_writing_) StartDiskWrite(workers);
}

void KvStores::StartDiskWrite(Workers& workers) {
  if (disk_writes_.empty()) return;
  disk_writing_ = true;
  auto job = std::move(disk_writes_.front());
  disk_writes_.pop_front();
  workers.Run(std::move(job.first), [this, &workers, done = std::move(job.second)] {
    disk_writing_ = false;
    done();
    StartDiskWrite(workers);
  });
}

Result<BlockStore*> KvStores::Add(KvStoreSpec spec) {
  MB_RETURN_IF_ERROR(Admit(spec.name));
  uint64_t id = 0;
  while (id == 0 || by_id_.count(id) != 0 || restoring_.count(id) != 0) {
    if (::getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id)))  // no entropy yet: the clock
      id = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
    id &= kIdMask;
  }
  MB_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store, BlockStore::Create(id, std::move(spec)));
  return Adopt(std::move(store));
}

void KvStores::BeginRestore(uint64_t id, const std::string& name) { restoring_[id] = name; }

std::optional<uint64_t> KvStores::RestoringFor(const ipc::Message& m) const {
  if (restoring_.empty()) return std::nullopt;
  return std::visit(
      [&](const auto& x) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, ipc::KvOpenRequest> || std::is_same_v<T, ipc::KvDropRequest>) {
          for (const auto& [id, name] : restoring_)
            if (name == x.name) return id;
        } else if constexpr (std::is_same_v<T, ipc::KvSlabRequest> || std::is_same_v<T, ipc::KvReserveRequest> ||
                             std::is_same_v<T, ipc::KvSealRequest> || std::is_same_v<T, ipc::KvAbortRequest> ||
                             std::is_same_v<T, ipc::KvGetRequest> || std::is_same_v<T, ipc::KvReleaseRequest>) {
          if (restoring_.count(x.store) != 0) return x.store;
        }
        return std::nullopt;
      },
      m);
}

Result<BlockStore*> KvStores::EndRestore(uint64_t id, Result<std::unique_ptr<BlockStore>> made) {
  restoring_.erase(id);
  Result<BlockStore*> adopted = made.ok() ? Adopt(std::move(*made)) : Result<BlockStore*>(made.status());
  SlotsFreed(id);  // what waited for it runs (and hears it is gone, if it was lost)
  return adopted;
}

Result<BlockStore*> KvStores::Create(KvStoreSpec spec, Accounting& limits) {
  const uid_t uid = spec.uid;
  const std::string name = spec.name;
  // The slabs' pages are reserved now: the whole capacity is charged to the
  // creator's uid (a store outlives its creator, as a persistent name does).
  MB_RETURN_IF_ERROR(limits.Check(Usage{}, uid, Usage::For(spec.blocks * spec.block_size, false, -1)));
  MB_ASSIGN_OR_RETURN(BlockStore * store, Add(std::move(spec)));
  const Usage actual = Usage::For(store->bytes(), false, -1);
  if (Status st = limits.Check(Usage{}, uid, actual); !st.ok()) {
    (void)Remove(name);  // rounded to its pages, it no longer fits
    return st;
  }
  limits.ChargeUid(uid, actual);
  MB_INFO("kv_store_created", "store=\"%s\" id=%llu block_size=%llu blocks=%llu slabs=%u eviction=%s uid=%u",
          LogText(name).c_str(), static_cast<unsigned long long>(store->id()),
          static_cast<unsigned long long>(store->spec().block_size),
          static_cast<unsigned long long>(store->spec().blocks), store->slab_count(),
          std::string(EvictionName(store->spec().eviction)).c_str(), static_cast<unsigned>(uid));
  return store;
}

Status KvStores::MakeConfigured(Accounting& limits) {
  for (const KvStoreSpec& spec : configured_) {
    if (const BlockStore* had = FindByName(spec.name)) {
      const KvStoreSpec& is = had->spec();
      if ((is.block_size != spec.block_size || is.blocks != spec.blocks) && warned_.insert(spec.name).second)
        MB_WARN("kv_store_kept",
                "store=\"%s\" block_size=%llu blocks=%llu reason=\"a restart brought it back; --kv-store asks for "
                "block_size=%llu blocks=%llu: dropped, it is made as asked\"",
                LogText(spec.name).c_str(), static_cast<unsigned long long>(is.block_size),
                static_cast<unsigned long long>(is.blocks), static_cast<unsigned long long>(spec.block_size),
                static_cast<unsigned long long>(spec.blocks));
      continue;
    }
    if (Restoring(spec.name)) continue;
    if (auto made = Create(spec, limits); !made.ok())
      return Status(made.status().code(), "--kv-store " + ipc::EscapeText(spec.name) + ": " + made.status().message());
  }
  return Status::Ok();
}

Result<BlockStore*> KvStores::Adopt(std::unique_ptr<BlockStore> store) {
  MB_RETURN_IF_ERROR(Admit(store->spec().name));
  if (store->id() == 0 || by_id_.count(store->id()) != 0)
    return Status(ErrorCode::kAlreadyExists, "a store with id " + std::to_string(store->id()) + " exists");
  BlockStore* p = store.get();
  if (disk_) HoldEvictedFor(*p);
  by_id_[p->id()] = p;
  stores_[p->spec().name] = std::move(store);
  journal_.StoreAdded(*p);
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
  journal_.StoreRemoved(*store);
  SlotsFreed(store->id());  // what waited for its slots hears that it is gone
  return store;
}

KvStoreStats KvStores::Totals() const {
  KvStoreStats sum = dropped_;
  for (const auto& [name, store] : stores_) sum += store->stats();
  return sum;
}

uint64_t KvStores::HeldBytes(uint64_t session) const {
  uint64_t n = 0;
  for (const auto& [name, store] : stores_) n += store->HeldBlocks(session) * store->spec().block_size;
  return n;
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
