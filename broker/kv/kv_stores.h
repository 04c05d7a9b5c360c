// KvStores: the broker's KV-cache stores by name and id (kv/block_store.h
// holds one store). A store lives until it is dropped or the broker stops;
// its slabs are charged to its creator's uid for that long.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kv/block_store.h"
#include "membroker/status.h"

namespace membroker::broker {

class KvStores {
 public:
  BlockStore* Find(uint64_t id);
  const BlockStore* FindByName(const std::string& name) const;
  // RESOURCE_EXHAUSTED past kKvMaxStores; ALREADY_EXISTS for a taken name.
  Result<BlockStore*> Add(KvStoreSpec spec);
  // The store goes (BUSY while a client leases from it or writes to it).
  Result<std::unique_ptr<BlockStore>> Remove(const std::string& name);
  void OnSessionEnd(uint64_t session);
  const std::map<std::string, std::unique_ptr<BlockStore>>& all() const { return stores_; }
  // Every store's counters since the broker started, dropped stores' too.
  KvStoreStats Totals() const;
  bool empty() const { return stores_.empty(); }
  Status Check() const;

 private:
  std::map<std::string, std::unique_ptr<BlockStore>> stores_;  // by name
  std::map<uint64_t, BlockStore*> by_id_;
  uint64_t next_id_ = 1;
  KvStoreStats dropped_;  // the counters of stores that were dropped
};

class Accounting;
// Removes a store and gives its slabs' charge back to its creator's uid
// (kv/kv_requests.cc: the drop request's and the broker's own drop).
Status DropStore(KvStores& kv, Accounting& limits, const std::string& name);

}  // namespace membroker::broker
