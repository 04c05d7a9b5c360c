// KvStore, KvPut, KvLeases (membroker/kv_store.h). A KvStoreState is shared by
// a store's objects: the store's geometry, its slabs mapped read-only (each
// once, on first use) and the staging blocks writers fill before Seal has the
// broker copy them in.
//
// Across a broker restart (a take-over, systemd's fd store) the store comes
// back in new slabs under the same id. Each reply is tied to the broker that
// sent it (its Connection generation, the "epoch" here): the first one from a
// new broker retires the slabs mapped so far - unmapped once the leases taken
// from the old broker are released - and leases and reservations of an old
// broker are never sent to a new one, which does not know them.
#include "membroker/kv_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "client/client_core.h"
#include "membroker/ipc/escape.h"

namespace membroker {

namespace detail {

inline constexpr size_t kStagingChunkBytes = 16u << 20;

struct KvStoreState {
  Client client;
  ipc::KvStoreReply geometry;
  std::mutex mu;
  std::vector<const std::byte*> slabs;  // nullptr until mapped
  std::vector<uint64_t> slab_sizes;     // each mapping's length
  uint64_t slab_bytes = 0;              // the blocks of a full slab
  uint64_t epoch = 0;                   // the broker whose slabs these are
  // Slabs of earlier brokers, kept mapped while KvLeases granted there live.
  std::map<uint64_t, std::vector<std::pair<const std::byte*, uint64_t>>> retired;
  std::map<uint64_t, uint64_t> live_leases;  // KvLeases alive, by epoch
  // Staging: this process's memory (broker allocations) that writers fill;
  // block i lives in chunk i / chunk_blocks.
  struct Chunk {
    PhysicalHandle handle;
    Reservation range;
    Mapping map;
  };
  std::vector<Chunk> chunks;
  size_t chunk_blocks = 1;
  std::vector<int> free_staging;

  ~KvStoreState() {
    for (size_t i = 0; i < slabs.size(); ++i)
      if (slabs[i] != nullptr) ::munmap(const_cast<std::byte*>(slabs[i]), slab_sizes[i]);
    for (const auto& [e, maps] : retired)
      for (const auto& [p, n] : maps) ::munmap(const_cast<std::byte*>(p), n);
  }
  Connection& conn() { return client.core_->conn(); }
  uint64_t Epoch() { return conn().generation(); }  // the broker that answers now
  size_t block_size() const { return geometry.block_size; }

  // A KvLeases of broker `e` begins and ends.
  void HoldEpoch(uint64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ++live_leases[e];
  }
  void DropEpoch(uint64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = live_leases.find(e);
    if (it == live_leases.end() || --it->second != 0) return;
    live_leases.erase(it);
    UnmapRetiredLocked(e);
  }
  void UnmapRetiredLocked(uint64_t e) {
    auto r = retired.find(e);
    if (r == retired.end()) return;
    for (const auto& [p, n] : r->second) ::munmap(const_cast<std::byte*>(p), n);
    retired.erase(r);
  }

  // Block `slot` as broker `e` described it (mu held: a batch's blocks take it once).
  Result<const std::byte*> BlockLocked(uint64_t slot, uint64_t length, uint64_t e) {
    if (slot >= geometry.blocks || length == 0 || length > geometry.block_size)
      return Status(ErrorCode::kProtocolError, "the broker named block " + std::to_string(slot) + " of length " +
                                                   std::to_string(length) + ", outside the store");
    const uint32_t slab = static_cast<uint32_t>(slot / geometry.slab_blocks);
    if (e < epoch) return Restarted();
    if (e > epoch) {
      // A new broker: its slabs are new memory.
      auto& old = retired[epoch];
      for (size_t i = 0; i < slabs.size(); ++i)
        if (slabs[i] != nullptr) old.emplace_back(std::exchange(slabs[i], nullptr), slab_sizes[i]);
      if (live_leases.count(epoch) == 0) UnmapRetiredLocked(epoch);
      epoch = e;
    }
    if (slabs[slab] == nullptr) {
      MB_ASSIGN_OR_RETURN(Reply r, conn().Call(ipc::KvSlabRequest{geometry.store, slab}));
      if (r.broker != e) return Restarted();  // another broker's slab: not where e's lease is
      // The slab's memory is its blocks rounded up to its page size (a huge-page
      // slab maps only whole huge pages); it must hold every block of the slab.
      const uint64_t blocks_here =
          std::min<uint64_t>(geometry.slab_blocks, geometry.blocks - uint64_t{slab} * geometry.slab_blocks);
      auto* m = std::get_if<ipc::KvSlabReply>(&r.body);
      if (m == nullptr || m->size < blocks_here * geometry.block_size || m->size > slab_bytes + (1ull << 30))
        return Status(ErrorCode::kProtocolError, "KvSlabRequest got a wrong reply");
      void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, r.fds.at(0).get(), 0);
      if (p == MAP_FAILED)
        return Status(ErrorCode::kResourceExhausted,
                      "mmap of a store's slab failed: " + std::string(std::strerror(errno)));
      slabs[slab] = static_cast<const std::byte*>(p);
      slab_sizes[slab] = m->size;
    }
    return slabs[slab] + (slot % geometry.slab_blocks) * geometry.block_size;
  }

  static Status Restarted() {
    return Status(ErrorCode::kNotConnected, "the broker restarted during the call; call again");
  }

  Result<int> TakeStaging() {
    std::lock_guard<std::mutex> lock(mu);
    if (free_staging.empty()) {
      Chunk c;
      MB_ASSIGN_OR_RETURN(c.handle, client.MallocPhysical(chunk_blocks * block_size()));
      MB_ASSIGN_OR_RETURN(c.range, client.ReserveMemAddress(c.handle.size()));
      MB_ASSIGN_OR_RETURN(c.map, client.MapMem(c.range.base(), c.handle.size(), 0, c.handle));
      const int first = static_cast<int>(chunks.size() * chunk_blocks);
      chunks.push_back(std::move(c));
      for (int i = static_cast<int>(chunk_blocks); i-- > 0;) free_staging.push_back(first + i);
    }
    int i = free_staging.back();
    free_staging.pop_back();
    return i;
  }
  void GiveStaging(int i) {
    std::lock_guard<std::mutex> lock(mu);
    free_staging.push_back(i);
  }
  // (chunks only grow, and a Chunk's fields do not change once pushed)
  std::byte* StagingAddress(int i) {
    std::lock_guard<std::mutex> lock(mu);
    return chunks[i / chunk_blocks].map.as<std::byte>() + (i % chunk_blocks) * block_size();
  }
  ipc::KvSeal SealOf(int i, uint64_t slot, uint64_t generation, uint64_t length) {
    std::lock_guard<std::mutex> lock(mu);
    return {slot, generation, chunks[i / chunk_blocks].handle.id(), (i % chunk_blocks) * block_size(), length};
  }
};

}  // namespace detail

namespace {

using State = detail::KvStoreState;

Status CheckKeys(std::span<const std::string> keys) {
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].empty() || keys[i].size() > ipc::kMaxKvKeyBytes)
      return Status(ErrorCode::kParamInvalid, "key " + std::to_string(i) + " is " + std::to_string(keys[i].size()) +
                                                  " bytes; keys are 1 to " + std::to_string(ipc::kMaxKvKeyBytes));
  return Status::Ok();
}

Result<ipc::KvBlocksReply> Blocks(detail::Reply r, size_t expected, const char* what) {
  auto* m = std::get_if<ipc::KvBlocksReply>(&r.body);
  if (m == nullptr || m->blocks.size() != expected)
    return Status(ErrorCode::kProtocolError, std::string(what) + " got a wrong reply");
  return std::move(*m);
}

// Sends refs one-way in batches (releases and aborts: a failure is counted
// as the client's async error).
template <typename Request>
void SendRefs(State& st, std::vector<ipc::KvRef> refs) {
  for (size_t at = 0; at < refs.size(); at += ipc::kMaxKvBatch) {
    Request req;
    req.store = st.geometry.store;
    const size_t n = std::min(ipc::kMaxKvBatch, refs.size() - at);
    if (n == refs.size())
      req.refs = std::move(refs);  // one batch: no copy
    else
      req.refs.assign(refs.begin() + static_cast<ptrdiff_t>(at), refs.begin() + static_cast<ptrdiff_t>(at + n));
    (void)st.conn().SendOneWay(std::move(req));
  }
}

Result<KvStore> Opened(Client& client, detail::Reply r) {
  auto* m = std::get_if<ipc::KvStoreReply>(&r.body);
  if (m == nullptr || m->block_size == 0 || m->slab_blocks == 0 || m->blocks == 0 ||
      m->slabs != (m->blocks + m->slab_blocks - 1) / m->slab_blocks)
    return Status(ErrorCode::kProtocolError, "KvOpenRequest got a wrong reply");
  auto st = std::make_shared<State>();
  st->client = client;
  st->geometry = *m;
  st->slabs.assign(m->slabs, nullptr);
  st->slab_sizes.assign(m->slabs, 0);
  st->slab_bytes = m->slab_blocks * m->block_size;
  st->epoch = st->Epoch();
  st->chunk_blocks = std::clamp<size_t>(detail::kStagingChunkBytes / m->block_size, 1, ipc::kMaxKvBatch);
  return KvStore::FromState(std::move(st));
}

}  // namespace

// ---- KvStore ----

Result<KvStore> KvStore::Create(Client& client, const std::string& name, const KvStoreOptions& options) {
  if (!client.core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(ipc::CheckName(name, ipc::kMaxKvStoreNameBytes, "a store name"));
  MB_ASSIGN_OR_RETURN(detail::Reply r,
                      client.core_->conn().Call(ipc::KvOpenRequest{name, true, options.block_size, options.capacity,
                                                                   static_cast<ipc::PagePolicy>(options.page_policy),
                                                                   static_cast<uint8_t>(options.eviction)}));
  return Opened(client, std::move(r));
}

Result<KvStore> KvStore::Open(Client& client, const std::string& name) {
  if (!client.core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(ipc::CheckName(name, ipc::kMaxKvStoreNameBytes, "a store name"));
  MB_ASSIGN_OR_RETURN(detail::Reply r, client.core_->conn().Call(ipc::KvOpenRequest{name, false}));
  return Opened(client, std::move(r));
}

Status KvStore::Drop(Client& client, const std::string& name) {
  if (!client.core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(ipc::CheckName(name, ipc::kMaxKvStoreNameBytes, "a store name"));
  return client.core_->conn().Call(ipc::KvDropRequest{name}).status();
}

uint64_t KvStore::id() const { return state_ ? state_->geometry.store : 0; }
size_t KvStore::block_size() const { return state_ ? state_->geometry.block_size : 0; }
size_t KvStore::blocks() const { return state_ ? state_->geometry.blocks : 0; }

Result<std::vector<bool>> KvStore::Exists(std::span<const std::string> keys) {
  if (!state_) return Status(ErrorCode::kInvalidHandle, "an empty KvStore");
  MB_RETURN_IF_ERROR(CheckKeys(keys));
  std::vector<bool> out;
  out.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += ipc::kMaxKvBatch) {
    const auto batch = keys.subspan(at, std::min(ipc::kMaxKvBatch, keys.size() - at));
    MB_ASSIGN_OR_RETURN(detail::Reply r,
                        state_->conn().Call(ipc::KvGetRequest{id(), ipc::KvKeys(batch.begin(), batch.end()), false}));
    MB_ASSIGN_OR_RETURN(ipc::KvBlocksReply m, Blocks(std::move(r), batch.size(), "KvGetRequest"));
    for (const auto& b : m.blocks) out.push_back(b.code == ErrorCode::kOk);
  }
  return out;
}

Result<size_t> KvStore::PrefixHits(std::span<const std::string> keys) {
  if (!state_) return Status(ErrorCode::kInvalidHandle, "an empty KvStore");
  MB_RETURN_IF_ERROR(CheckKeys(keys));
  size_t hits = 0;
  for (size_t at = 0; at < keys.size(); at += ipc::kMaxKvBatch) {
    const auto batch = keys.subspan(at, std::min(ipc::kMaxKvBatch, keys.size() - at));
    MB_ASSIGN_OR_RETURN(detail::Reply r,
                        state_->conn().Call(ipc::KvGetRequest{id(), ipc::KvKeys(batch.begin(), batch.end()), false}));
    MB_ASSIGN_OR_RETURN(ipc::KvBlocksReply m, Blocks(std::move(r), batch.size(), "KvGetRequest"));
    hits += m.leading;
    if (m.leading < batch.size()) break;
  }
  return hits;
}

Result<KvLeases> KvStore::Get(std::span<const std::string> keys) {
  if (!state_) return Status(ErrorCode::kInvalidHandle, "an empty KvStore");
  MB_RETURN_IF_ERROR(CheckKeys(keys));
  KvLeases out;
  out.blocks_.reserve(keys.size());
  out.refs_.reserve(keys.size());
  bool leading = true;
  for (size_t at = 0; at < keys.size(); at += ipc::kMaxKvBatch) {
    const auto batch = keys.subspan(at, std::min(ipc::kMaxKvBatch, keys.size() - at));
    MB_ASSIGN_OR_RETURN(detail::Reply r,
                        state_->conn().Call(ipc::KvGetRequest{id(), ipc::KvKeys(batch.begin(), batch.end()), true}));
    const uint64_t broker = r.broker;
    MB_ASSIGN_OR_RETURN(ipc::KvBlocksReply m, Blocks(std::move(r), batch.size(), "KvGetRequest"));
    if (!out.state_) {
      out.state_ = state_;
      out.epoch_ = broker;
      state_->HoldEpoch(broker);
    } else if (broker != out.epoch_) {
      // The broker restarted between two batches: this batch's leases end at
      // the broker that granted them, and the call is to be made again.
      std::vector<ipc::KvRef> granted;
      for (const auto& b : m.blocks)
        if (b.code == ErrorCode::kOk) granted.push_back({b.slot, b.generation});
      if (state_->Epoch() == broker) SendRefs<ipc::KvReleaseRequest>(*state_, std::move(granted));
      return detail::KvStoreState::Restarted();
    }
    // Every lease is recorded before anything can fail, so `out` releases them all.
    for (const auto& b : m.blocks)
      if (b.code == ErrorCode::kOk) out.refs_.emplace_back(b.slot, b.generation);
    for (const auto& b : m.blocks)
      if (b.code == ErrorCode::kQuotaExceeded)
        return Status(ErrorCode::kQuotaExceeded,
                      "leasing these blocks would pass this client's or its uid's KV quota (kv= in --quota-client "
                      "or --quota-uid): release some first");
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const auto& b : m.blocks) {
      leading = leading && b.code == ErrorCode::kOk;
      if (leading) ++out.leading_;
      if (b.code != ErrorCode::kOk) {
        out.blocks_.emplace_back();
        continue;
      }
      MB_ASSIGN_OR_RETURN(const std::byte* p, state_->BlockLocked(b.slot, b.length, out.epoch_));
      out.blocks_.emplace_back(p, b.length);
    }
  }
  return out;
}

Result<KvPut> KvStore::Reserve(std::span<const std::string> keys) {
  if (!state_) return Status(ErrorCode::kInvalidHandle, "an empty KvStore");
  MB_RETURN_IF_ERROR(CheckKeys(keys));
  KvPut put;
  put.state_ = state_;
  put.blocks_.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += ipc::kMaxKvBatch) {
    const auto batch = keys.subspan(at, std::min(ipc::kMaxKvBatch, keys.size() - at));
    MB_ASSIGN_OR_RETURN(detail::Reply r,
                        state_->conn().Call(ipc::KvReserveRequest{id(), ipc::KvKeys(batch.begin(), batch.end())}));
    const uint64_t broker = r.broker;
    MB_ASSIGN_OR_RETURN(ipc::KvBlocksReply m, Blocks(std::move(r), batch.size(), "KvReserveRequest"));
    if (at == 0) {
      put.epoch_ = broker;
    } else if (broker != put.epoch_) {
      // The broker restarted between two batches: this batch's reservations
      // end at the broker that made them, and the call is to be made again.
      std::vector<ipc::KvRef> made;
      for (const auto& b : m.blocks)
        if (b.code == ErrorCode::kOk) made.push_back({b.slot, b.generation});
      if (state_->Epoch() == broker) SendRefs<ipc::KvAbortRequest>(*state_, std::move(made));
      return detail::KvStoreState::Restarted();
    }
    for (const auto& b : m.blocks) {
      KvPut::Block block;
      block.status = b.code;
      if (b.code == ErrorCode::kOk) {
        if (b.slot >= blocks())
          return Status(ErrorCode::kProtocolError, "the broker reserved a block outside the store");
        block.slot = b.slot;
        block.generation = b.generation;
        block.length = block_size();
        block.open = true;  // (before the staging block: a failure below aborts it with the put)
      }
      put.blocks_.push_back(block);
    }
  }
  for (KvPut::Block& b : put.blocks_) {
    if (!b.open) continue;
    MB_ASSIGN_OR_RETURN(b.staging, state_->TakeStaging());
  }
  return put;
}

Status KvStore::Seal(KvPut& put) {
  if (!state_ || put.state_ != state_) return Status(ErrorCode::kInvalidHandle, "the KvPut is not this store's");
  std::vector<size_t> open;
  for (size_t i = 0; i < put.blocks_.size(); ++i) {
    const KvPut::Block& b = put.blocks_[i];
    if (!b.open) continue;
    if (b.length == 0 || b.length > block_size())
      return Status(ErrorCode::kParamInvalid, "block " + std::to_string(i) + " has length " + std::to_string(b.length) +
                                                  "; blocks are 1 to " + std::to_string(block_size()) + " bytes");
    open.push_back(i);
  }
  if (put.epoch_ != state_->Epoch()) {
    // Reserved at a broker that has gone: the reservations went with it.
    for (size_t i : open) {
      KvPut::Block& b = put.blocks_[i];
      b.status = ErrorCode::kStale;
      b.open = false;
      state_->GiveStaging(std::exchange(b.staging, -1));
    }
    return Status(ErrorCode::kStale, std::to_string(open.size()) +
                                         " blocks were reserved at a broker that has since restarted; put them again");
  }
  size_t failed = 0;
  ErrorCode first = ErrorCode::kOk;
  std::vector<ipc::KvRef> to_abort;
  for (size_t at = 0; at < open.size(); at += ipc::kMaxKvBatch) {
    const size_t n = std::min(ipc::kMaxKvBatch, open.size() - at);
    ipc::KvSealRequest req{id(), {}};
    for (size_t k = at; k < at + n; ++k) {
      const KvPut::Block& b = put.blocks_[open[k]];
      req.blocks.push_back(state_->SealOf(b.staging, b.slot, b.generation, b.length));
    }
    MB_ASSIGN_OR_RETURN(detail::Reply r, state_->conn().Call(std::move(req)));
    const bool restarted = r.broker != put.epoch_;  // the new broker's answer: the reservations are gone
    MB_ASSIGN_OR_RETURN(ipc::KvBlocksReply m, Blocks(std::move(r), n, "KvSealRequest"));
    for (size_t k = 0; k < n; ++k) {
      KvPut::Block& b = put.blocks_[open[at + k]];
      b.status = m.blocks[k].code;
      b.open = false;
      state_->GiveStaging(std::exchange(b.staging, -1));
      if (restarted && b.status != ErrorCode::kOk) b.status = ErrorCode::kStale;
      if (b.status == ErrorCode::kOk) continue;
      if (failed++ == 0) first = b.status;
      if (b.status != ErrorCode::kStale && !restarted) to_abort.push_back({b.slot, b.generation});
    }
  }
  SendRefs<ipc::KvAbortRequest>(*state_, std::move(to_abort));
  if (failed != 0)
    return Status(first, std::to_string(failed) + " of " + std::to_string(open.size()) +
                             " blocks were not sealed (the first: " + std::string(ErrorCodeName(first)) + ")");
  return Status::Ok();
}

Status KvStore::Abort(KvPut& put) {
  if (!state_ || put.state_ != state_) return Status(ErrorCode::kInvalidHandle, "the KvPut is not this store's");
  put.AbortOpen();
  return Status::Ok();
}

Result<std::vector<ErrorCode>> KvStore::Put(std::span<const std::string> keys,
                                            std::span<const std::span<const std::byte>> values) {
  if (keys.size() != values.size())
    return Status(ErrorCode::kParamInvalid,
                  std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) + " values");
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].empty() || values[i].size() > block_size())
      return Status(ErrorCode::kParamInvalid, "value " + std::to_string(i) + " is " + std::to_string(values[i].size()) +
                                                  " bytes; blocks are 1 to " + std::to_string(block_size()));
  MB_ASSIGN_OR_RETURN(KvPut put, Reserve(keys));
  for (size_t i = 0; i < put.size(); ++i) {
    if (put.status(i) != ErrorCode::kOk) continue;
    std::memcpy(put.data(i).data(), values[i].data(), values[i].size());
    put.set_length(i, values[i].size());
  }
  Status sealed = Seal(put);  // per block in put's statuses
  (void)sealed;
  std::vector<ErrorCode> out;
  out.reserve(put.size());
  for (size_t i = 0; i < put.size(); ++i) out.push_back(put.status(i));
  return out;
}

// ---- KvPut ----

KvPut::~KvPut() { AbortOpen(); }

KvPut::KvPut(KvPut&& other) noexcept
    : state_(std::move(other.state_)), epoch_(other.epoch_), blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

KvPut& KvPut::operator=(KvPut&& other) noexcept {
  if (this != &other) {
    AbortOpen();
    state_ = std::move(other.state_);
    epoch_ = other.epoch_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

std::span<std::byte> KvPut::data(size_t i) const {
  const Block& b = blocks_.at(i);
  if (!b.open || b.staging < 0) return {};
  return {state_->StagingAddress(b.staging), state_->block_size()};
}

void KvPut::AbortOpen() {
  if (!state_) return;
  std::vector<ipc::KvRef> refs;
  for (Block& b : blocks_) {
    if (!b.open) continue;
    refs.push_back({b.slot, b.generation});
    if (b.staging >= 0) state_->GiveStaging(std::exchange(b.staging, -1));
    b.open = false;
  }
  if (epoch_ == state_->Epoch()) SendRefs<ipc::KvAbortRequest>(*state_, std::move(refs));
}

// ---- KvLeases ----

KvLeases::~KvLeases() { Release(); }

KvLeases::KvLeases(KvLeases&& other) noexcept
    : state_(std::move(other.state_)),
      epoch_(other.epoch_),
      blocks_(std::move(other.blocks_)),
      refs_(std::move(other.refs_)),
      leading_(other.leading_) {
  other.refs_.clear();
}

KvLeases& KvLeases::operator=(KvLeases&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    epoch_ = other.epoch_;
    blocks_ = std::move(other.blocks_);
    refs_ = std::move(other.refs_);
    leading_ = other.leading_;
    other.refs_.clear();
  }
  return *this;
}

void KvLeases::Release() {
  if (state_ && !refs_.empty() && epoch_ == state_->Epoch()) {
    std::vector<ipc::KvRef> refs;
    refs.reserve(refs_.size());
    for (const auto& [slot, generation] : refs_) refs.push_back({slot, generation});
    SendRefs<ipc::KvReleaseRequest>(*state_, std::move(refs));
  }
  if (state_) state_->DropEpoch(epoch_);  // (after: the spans are not read again)
  state_.reset();
  refs_.clear();
  blocks_.clear();
  leading_ = 0;
}

}  // namespace membroker
