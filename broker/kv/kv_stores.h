// KvStores: the broker's KV-cache stores by name and id (kv/block_store.h
// holds one store). A store lives until it is dropped or the broker stops;
// its slabs are charged to its creator's uid for that long.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kv/block_store.h"
#include "kv/disk_tier.h"
#include "memory/workers.h"
#include "membroker/status.h"

namespace membroker::broker {

class Accounting;

// Told when a store comes and goes (the fd store keeps its fds).
class KvJournal {
 public:
  virtual ~KvJournal() = default;
  virtual void StoreAdded(const BlockStore& store) = 0;
  virtual void StoreRemoved(const BlockStore& store) = 0;
};

class KvStores {
 public:
  explicit KvStores(KvJournal& journal) : journal_(journal) {}

  // Gives every store, made before or after, the disk tier in dir (disk_tier.h;
  // taking_over: KvDiskTier::Open's).
  Status OpenDisk(const std::string& dir, uint64_t capacity, bool taking_over);
  // Blocks being written to the disk tier (a take-over waits for them).
  bool DiskWriting() const { return disk_ && disk_->stats().writing > 0; }
  KvDiskTier* disk() { return disk_.get(); }
  const KvDiskTier* disk() const { return disk_.get(); }
  // A request that found the store full while blocks were being written out
  // (BlockStore::spilling) runs `retry` when one has been (or the store went).
  void WhenSlotsFree(uint64_t store, std::function<void()> retry);
  void SlotsFreed(uint64_t store);
  // Runs a batch of the disk tier's file writes on a worker, one batch at a
  // time: slow writes never fill the worker pool that the copies out of
  // slots and the promotions (which clients wait for) need.
  void QueueDiskWrite(Workers& workers, std::function<void()> work, std::function<void()> done);

  // Stores of an earlier broker being made again on a worker (restart/
  // kv_stores_restart.h): a request that names one waits for it.
  void BeginRestore(uint64_t id, const std::string& name);
  bool restoring() const { return !restoring_.empty(); }
  size_t restoring_count() const { return restoring_.size(); }
  // The store being restored that m names (by id or name), if any.
  std::optional<uint64_t> RestoringFor(const ipc::Message& m) const;
  void WhenRestored(uint64_t id, std::function<void()> retry) { waiting_.emplace(id, std::move(retry)); }
  // The restore ended: the store is adopted (or was lost: made's error), and
  // what waited for it runs.
  Result<BlockStore*> EndRestore(uint64_t id, Result<std::unique_ptr<BlockStore>> made);

  BlockStore* Find(uint64_t id);
  const BlockStore* FindByName(const std::string& name) const;
  // RESOURCE_EXHAUSTED past kKvMaxStores; ALREADY_EXISTS for a taken name.
  // A store's id is random, so that a client's id from an earlier broker
  // that did not keep the store names no store here rather than another one.
  Result<BlockStore*> Add(KvStoreSpec spec);
  // Add, with the slabs' memory charged to the spec's uid (refused past its
  // limits), and logged: a store made by a client or by --kv-store.
  Result<BlockStore*> Create(KvStoreSpec spec, Accounting& limits);
  // The stores this broker is to have whenever it serves (--kv-store).
  // MakeConfigured makes each that is neither here nor being made again by a
  // restore: at the start, once the restores have begun, again when a
  // restore loses one, and when one is dropped (it comes back empty).
  void Configure(std::vector<KvStoreSpec> specs) { configured_ = std::move(specs); }
  Status MakeConfigured(Accounting& limits);
  // A store an earlier broker made (BlockStore::Restore), with its id.
  Result<BlockStore*> Adopt(std::unique_ptr<BlockStore> store);
  // The store goes (BUSY while a client leases from it or writes to it).
  Result<std::unique_ptr<BlockStore>> Remove(const std::string& name);
  void OnSessionEnd(uint64_t session);
  // The bytes of the blocks a session holds in every store (its kv_bytes).
  uint64_t HeldBytes(uint64_t session) const;
  const std::map<std::string, std::unique_ptr<BlockStore>>& all() const { return stores_; }
  // Every store's counters since the broker started, dropped stores' too.
  KvStoreStats Totals() const;
  bool empty() const { return stores_.empty(); }
  Status Check() const;

 private:
  Status Admit(const std::string& name) const;
  bool Restoring(const std::string& name) const;
  void HoldEvictedFor(BlockStore& store);
  void StartDiskWrite(Workers& workers);

  KvJournal& journal_;

  std::map<std::string, std::unique_ptr<BlockStore>> stores_;  // by name
  std::map<uint64_t, BlockStore*> by_id_;
  KvStoreStats dropped_;  // the counters of stores that were dropped
  std::unique_ptr<KvDiskTier> disk_;
  std::multimap<uint64_t, std::function<void()>> waiting_;  // store id -> retries
  std::map<uint64_t, std::string> restoring_;                // id -> name
  std::vector<KvStoreSpec> configured_;
  std::set<std::string> warned_;  // configured stores a restart brought back unlike their option
  std::deque<std::pair<std::function<void()>, std::function<void()>>> disk_writes_;
  bool disk_writing_ = false;
};

// Removes a store and gives its slabs' charge back to its creator's uid
// (kv/kv_requests.cc: the drop request's and the broker's own drop).
Status DropStore(KvStores& kv, Accounting& limits, const std::string& name);

}  // namespace membroker::broker
