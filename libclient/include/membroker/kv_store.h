// KV-cache stores (docs/KV.md): a node-wide cache of fixed-size blocks found
// by opaque keys (content hashes, usually chained over a prompt's prefix),
// shared by every process of the host through its broker.
//
//   auto store = KvStore::Create(client, "llama-70b/kv", {.block_size = 256 << 10, .capacity = 8ull << 30});
//   auto hits = store->PrefixHits(keys);            // how many leading blocks are cached
//   auto got = store->Get(keys);                     // leases: the bytes stay until `got` goes
//   auto put = store->Reserve(missing);              // then fill put->data(i) ...
//   store->Seal(*put);                               // ... and the blocks are visible, immutable
//
// Lifetime rules:
//  1. A block is written once. Reserve gives this process a block to fill
//     for each key that is neither present nor being written by another
//     process; Seal makes it visible to every process and immutable: the
//     broker copies it into memory that no client process can write (the
//     kernel refuses any writable mapping of it). Abort, or the end of this
//     process, drops what was reserved and not sealed.
//  2. A lease (KvLeases) keeps its blocks: they are not evicted or reused
//     until it is released - on destruction, Release(), or the end of this
//     process, however it ends.
//  3. Unleased blocks may be evicted at any time once the store is nearly
//     full (S3-FIFO by default). A block evicted and its slot reused answers
//     STALE to a reference to it, never another key's bytes.
//  4. A KvStore, KvPut or KvLeases is one thread's at a time (it may move
//     between threads); several KvStore objects of one store may be used by
//     threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "membroker/client.h"

namespace membroker {

namespace detail {
struct KvStoreState;
}

enum class KvEviction : uint8_t { kS3Fifo = 0, kLru = 1 };

struct KvStoreOptions {
  size_t block_size = 0;  // a multiple of 64 bytes, at most 256 MiB
  size_t capacity = 0;    // bytes: rounded down to whole blocks, all reserved at creation
  PagePolicy page_policy = PagePolicy::kNormalOnly;
  KvEviction eviction = KvEviction::kS3Fifo;
};

// Blocks reserved for writing (KvStore::Reserve), one per key, in order.
class MEMBROKER_API KvPut {
 public:
  KvPut() = default;
  ~KvPut();  // aborts what was neither sealed nor aborted (no wait)
  KvPut(KvPut&& other) noexcept;
  KvPut& operator=(KvPut&& other) noexcept;
  KvPut(const KvPut&) = delete;
  KvPut& operator=(const KvPut&) = delete;

  size_t size() const { return blocks_.size(); }
  // OK: reserved for this put, to fill and seal; ALREADY_EXISTS: the key is
  // cached; BUSY: another process is writing it; RESOURCE_EXHAUSTED: every
  // block is leased or being written; QUOTA_EXCEEDED: past the client's or
  // its uid's KV quota (blocks leased or reserved). After Seal: OK, or why it was not
  // sealed (STALE: the broker restarted since the reservation, which ended
  // with it; put them again).
  ErrorCode status(size_t i) const { return blocks_.at(i).status; }
  // Where to write block i: block_size bytes of this process's memory; empty
  // unless status(i) is OK and it is not sealed yet.
  std::span<std::byte> data(size_t i) const;
  // The block's length (default: block_size); at least 1.
  void set_length(size_t i, size_t length) { blocks_.at(i).length = length; }

 private:
  friend class KvStore;
  struct Block {
    ErrorCode status = ErrorCode::kOk;
    uint64_t slot = 0, generation = 0;
    size_t length = 0;
    int staging = -1;   // this put's staging block, while reserved
    bool open = false;  // reserved, not yet sealed or aborted
  };
  void AbortOpen();
  std::shared_ptr<detail::KvStoreState> state_;
  uint64_t epoch_ = 0;  // the broker that reserved the blocks (its connection's generation)
  std::vector<Block> blocks_;
};

// Blocks read under leases (KvStore::Get), one per key, in order.
class MEMBROKER_API KvLeases {
 public:
  KvLeases() = default;
  ~KvLeases();  // Release()
  KvLeases(KvLeases&& other) noexcept;
  KvLeases& operator=(KvLeases&& other) noexcept;
  KvLeases(const KvLeases&) = delete;
  KvLeases& operator=(const KvLeases&) = delete;

  size_t size() const { return blocks_.size(); }
  size_t leading() const { return leading_; }  // found from the first key on
  bool found(size_t i) const { return !blocks_.at(i).empty(); }
  // The sealed bytes of block i (read-only memory); empty if not found.
  // They stay readable, unchanged, across a broker restart: the broker that
  // follows copies the store into new slabs, and this process keeps the old
  // ones mapped until the leases taken there are released.
  std::span<const std::byte> data(size_t i) const { return blocks_.at(i); }
  // Ends the leases (no wait); the spans are no longer to be read.
  void Release();

 private:
  friend class KvStore;
  std::shared_ptr<detail::KvStoreState> state_;
  uint64_t epoch_ = 0;  // the broker that granted the leases (its connection's generation)
  std::vector<std::span<const std::byte>> blocks_;
  std::vector<std::pair<uint64_t, uint64_t>> refs_;  // (slot, generation) of each lease
  size_t leading_ = 0;
};

class MEMBROKER_API KvStore {
 public:
  // Creates the store, or opens it if one of that name has the same block
  // size (ALREADY_EXISTS if another). One round trip.
  static Result<KvStore> Create(Client& client, const std::string& name, const KvStoreOptions& options);
  // NOT_FOUND if there is none. One round trip.
  static Result<KvStore> Open(Client& client, const std::string& name);
  // Removes a store: BUSY while any process leases from it or writes to it;
  // PERMISSION_DENIED for another user's (except root). Mappings of its
  // blocks stay readable until unmapped.
  static Status Drop(Client& client, const std::string& name);

  KvStore() = default;
  bool valid() const { return state_ != nullptr; }
  uint64_t id() const;
  size_t block_size() const;
  size_t blocks() const;  // the capacity, in blocks

  // Keys are 1 to 64 bytes. A batch of more than 256 keys is sent as several
  // requests.
  // Which keys are cached (sealed). One round trip per 256 keys.
  Result<std::vector<bool>> Exists(std::span<const std::string> keys);
  // How many keys, from the first, are cached: a prompt's reusable prefix.
  Result<size_t> PrefixHits(std::span<const std::string> keys);
  // Leases the blocks found: their bytes stay readable and unchanged until
  // the KvLeases goes. A block's slab is mapped on first use (once per slab).
  // QUOTA_EXCEEDED when the blocks held (leased or reserved) would pass the
  // client's or its uid's KV quota; nothing stays leased then.
  Result<KvLeases> Get(std::span<const std::string> keys);
  // Reserves a block for each key (KvPut::status says which were reserved).
  Result<KvPut> Reserve(std::span<const std::string> keys);
  // Seals every reserved block of put: the broker copies its bytes in and the
  // key becomes visible. Blocks that fail are aborted; put.status(i) says why.
  Status Seal(KvPut& put);
  // Drops put's reserved blocks (no wait).
  Status Abort(KvPut& put);
  // Reserve, copy values[i] in (each 1 to block_size bytes), Seal. Per key:
  // OK (stored), ALREADY_EXISTS, BUSY, RESOURCE_EXHAUSTED or why it failed.
  Result<std::vector<ErrorCode>> Put(std::span<const std::string> keys,
                                     std::span<const std::span<const std::byte>> values);

  // (for the library itself)
  static KvStore FromState(std::shared_ptr<detail::KvStoreState> state) { return KvStore(std::move(state)); }

 private:
  explicit KvStore(std::shared_ptr<detail::KvStoreState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::KvStoreState> state_;
};

}  // namespace membroker
