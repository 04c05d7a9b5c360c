// KV-cache stores across a restart (docs/KV.md, "Across a restart"): a
// take-over sends every store's index and slabs (TakeOverKvStore frames),
// systemd's fd store keeps them (FdStoreSync), and the broker that starts
// next gathers a store's parts from either and makes it again
// (BlockStore::Restore: new slabs, the sealed blocks copied in with their
// keys and generations, the old memory gone once copied).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "kv/kv_stores.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

class Accounting;

// Sends every store through send, as TakeOverKvStore frames; answers how
// many stores went.
Result<uint64_t> SendKvStores(const KvStores& kv,
                              const std::function<Status(ipc::Message, std::span<const int>)>& send);

// A store's parts, as they come (part 0 its index, N + 1 its slab N), of
// one generation of the store (the fd store may hold two, if a broker died
// between storing a new set and removing the old: the older is whole).
class KvStoreParts {
 public:
  // PROTOCOL_ERROR for a part past the last slab a store can have, or one
  // that came twice.
  Status Add(uint64_t store, uint64_t generation, uint32_t part, ipc::UniqueFd fd);
  size_t size() const { return stores_.size(); }
  // Makes each store again, in kv, one generation above its parts', each on
  // a worker: the copy takes about 0.7 s per GiB here, and the loop serves
  // everyone else meanwhile; requests that name the store wait for it
  // (KvStores::BeginRestore). Each is charged to its creator's uid when it is
  // made (never refused: the memory exists already). A store that cannot be
  // made is logged (kv_store_lost) and skipped; answers how many are being
  // made. ended(id) runs on the loop when a store's restore has ended, made or
  // lost (its old parts may go from systemd's fd store then, not before).
  size_t RestoreInto(KvStores& kv, Accounting& limits, Workers& workers,
                     std::function<void(uint64_t store)> ended = nullptr);

 private:
  struct Parts {
    uint64_t generation = 0;      // of these parts
    uint64_t max_generation = 0;  // of any set seen: the new store goes above it
    ipc::UniqueFd index;
    std::vector<ipc::UniqueFd> slabs;
  };
  std::map<uint64_t, Parts> stores_;
};

}  // namespace membroker::broker
