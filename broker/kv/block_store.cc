// BlockStore (block_store.h).
#include "kv/block_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>

#include "membroker/ipc/escape.h"

namespace membroker::broker {

namespace {
Status Invalid(const std::string& why) { return Status(ErrorCode::kParamInvalid, why); }

// Reads n bytes at offset of fd into to: OK, OUT_OF_RANGE past its end, or
// INTERNAL. The kernel copies straight from the memfd: nothing of it is
// mapped here, so hostile memory cannot fault the broker.
ErrorCode PreadAll(int fd, std::byte* to, uint64_t n, uint64_t offset) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, to + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got == 0 ? ErrorCode::kOutOfRange : ErrorCode::kInternal;
    done += static_cast<uint64_t>(got);
  }
  return ErrorCode::kOk;
}

// Copies n bytes at offset from one memfd to the same offset of another, in
// the kernel; false if it cannot (hugetlbfs) or the source is short.
bool CopyAll(int from, int to, uint64_t n, uint64_t offset) {
  loff_t in = static_cast<loff_t>(offset), out = static_cast<loff_t>(offset);
  for (uint64_t done = 0; done < n;) {
    const ssize_t put = ::copy_file_range(from, &in, to, &out, n - done, 0);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    done += static_cast<uint64_t>(put);
  }
  return true;
}
}  // namespace

KvStoreStats& KvStoreStats::operator+=(const KvStoreStats& o) {
  hits += o.hits;
  misses += o.misses;
  sealed += o.sealed;
  aborted += o.aborted;
  evictions += o.evictions;
  exhausted += o.exhausted;
  stale += o.stale;
  bytes_copied += o.bytes_copied;
  restored += o.restored;
  lost += o.lost;
  spilled += o.spilled;
  disk_hits += o.disk_hits;
  return *this;
}

BlockStore::BlockStore(uint64_t id, KvStoreSpec spec) : id_(id), spec_(std::move(spec)) {}

BlockStore::~BlockStore() {
  for (Slab& s : slabs_)
    if (s.base != nullptr) ::munmap(s.base, s.mem.size);
}

Result<std::unique_ptr<BlockStore>> BlockStore::Create(uint64_t id, KvStoreSpec spec, uint64_t generation) {
  return Make(id, std::move(spec), generation, nullptr);
}

Result<std::unique_ptr<BlockStore>> BlockStore::Make(uint64_t id, KvStoreSpec spec, uint64_t generation,
                                                     const SlabFill& fill) {
  MB_RETURN_IF_ERROR(ipc::CheckName(spec.name, ipc::kMaxKvStoreNameBytes, "a store name"));
  if (spec.block_size < kKvMinBlockBytes || spec.block_size > kKvMaxBlockBytes || spec.block_size % 64 != 0)
    return Invalid("block size " + std::to_string(spec.block_size) + " is not a multiple of 64 bytes from " +
                   std::to_string(kKvMinBlockBytes) + " to " + std::to_string(kKvMaxBlockBytes));
  if (spec.blocks == 0) return Invalid("a store's capacity must hold at least one block");
  if (spec.policy > ipc::PagePolicy::kHuge1GOnly) return Invalid("unknown page policy");
  const uint64_t slab_blocks = std::max<uint64_t>(1, kKvSlabTargetBytes / spec.block_size);
  const uint64_t slabs = (spec.blocks + slab_blocks - 1) / slab_blocks;
  if (slabs > kKvMaxSlabs)
    return Invalid("capacity " + std::to_string(spec.blocks * spec.block_size) + " needs more than " +
                   std::to_string(kKvMaxSlabs) + " slabs of " + std::to_string(slab_blocks * spec.block_size) +
                   " bytes");
  std::unique_ptr<BlockStore> store(new BlockStore(id, std::move(spec)));
  BlockStore& s = *store;
  s.slab_blocks_ = slab_blocks;
  s.generation_ = generation;
  for (uint64_t i = 0; i < slabs; ++i) {
    const uint64_t blocks = std::min(slab_blocks, s.spec_.blocks - i * slab_blocks);
    Slab slab;
    void* base = nullptr;
    std::function<Status(int)> fill_slab;
    if (fill) fill_slab = [&fill, i](int fd) { return fill(i, fd); };
    MB_ASSIGN_OR_RETURN(slab.mem, CreatePhysicalMemory("membroker-kv:" + s.spec_.name + ":" + std::to_string(i),
                                                       blocks * s.spec_.block_size, s.spec_.policy, &base, fill_slab));
    slab.base = static_cast<std::byte*>(base);
    // (pushed before the next step can fail, so the destructor unmaps it)
    s.slabs_.push_back(std::move(slab));
    MB_ASSIGN_OR_RETURN(s.slabs_.back().read_only, ReopenReadOnly(s.slabs_.back().mem.fd.get()));
  }
  MB_ASSIGN_OR_RETURN(s.records_, KvIndex::Create(id, generation, s.spec_));
  s.slots_.resize(s.spec_.blocks);
  s.free_.reserve(s.spec_.blocks);
  for (uint64_t i = s.spec_.blocks; i-- > 0;) s.free_.push_back(i);  // slot 0 first
  s.high_ = s.spec_.blocks - s.spec_.blocks / 20;
  s.low_ = std::min(s.spec_.blocks - s.spec_.blocks / 10, s.spec_.blocks - 1);
  s.policy_ = EvictionPolicy::Make(s.spec_.eviction, s.spec_.blocks);
  return store;
}

Result<BlockStore::Restored> BlockStore::Restore(const KvIndex::Contents& index, std::vector<ipc::UniqueFd> slabs,
                                                 uint64_t generation) {
  Restored out;
  // The kernel copies each sealed block from its old slab into the new one
  // before the new one is sealed (copy_file_range): tmpfs fills the pages a
  // write covers without clearing them first, which a copy into the mapping
  // costs (twice as long). Where it cannot (slabs in huge pages: hugetlbfs
  // has no write), the copy below goes through the mapping.
  const uint64_t slab_blocks = std::max<uint64_t>(1, kKvSlabTargetBytes / index.spec.block_size);
  std::vector<bool> copied_in(index.spec.blocks, false);
  auto fill = [&](uint64_t slab, int fd) {
    if (slab >= slabs.size() || !slabs[slab].valid()) return Status::Ok();
    bool can = true;  // (one that fails makes the rest of its slab go through the mapping)
    for (const KvIndex::Record& r : index.records) {
      if (r.slot / slab_blocks != slab || !r.sealed) continue;
      can = can && CopyAll(slabs[slab].get(), fd, r.length, (r.slot % slab_blocks) * index.spec.block_size);
      copied_in[r.slot] = can;
    }
    // Every block of the old slab is in: it goes now, before the next new slab
    // is made, so a restore needs one slab of memory beyond the old store, not
    // a second store. (Only a copy into normal pages succeeds, and that is the
    // last page size Make tries: no second fill will want this slab.)
    if (can) slabs[slab].reset();
    return Status::Ok();
  };
  MB_ASSIGN_OR_RETURN(out.store, Make(index.store, index.spec, generation, fill));
  BlockStore& s = *out.store;
  out.dropped = index.damaged.size();
  // Every slot keeps a generation above any reference handed out for it; a
  // damaged record's slot, whose generation is unknown, goes above them all.
  for (uint64_t slot : index.damaged) {
    s.slots_[slot].generation = index.max_generation + 1;
    s.Record(slot);
  }
  for (const KvIndex::Record& r : index.records) {
    Slot& slot = s.slots_[r.slot];
    slot.generation = r.generation;
    const uint64_t slab = r.slot / s.slab_blocks_;
    // Slabs are copied in slot order: one whose blocks are all copied goes now.
    for (uint64_t done = 0; done < slab && done < slabs.size(); ++done) slabs[done].reset();
    if (!r.sealed) {
      s.Record(r.slot);
      continue;
    }
    const bool copied = s.index_.count(r.key) == 0 &&
                        (copied_in[r.slot] ||
                         (slab < slabs.size() && slabs[slab].valid() &&
                          PreadAll(slabs[slab].get(), s.Address(r.slot), r.length,
                                   (r.slot % s.slab_blocks_) * s.spec_.block_size) == ErrorCode::kOk));
    if (!copied) {
      ++out.dropped;
      s.Record(r.slot);
      continue;
    }
    slot.state = State::kSealed;
    slot.length = r.length;
    slot.key = r.key;
    s.index_.emplace(r.key, r.slot);
    s.policy_->Inserted(r.slot, std::hash<std::string>{}(r.key));
    ++s.used_;
    s.Record(r.slot);
    ++out.blocks;
  }
  s.free_.clear();
  for (uint64_t i = s.spec_.blocks; i-- > 0;)
    if (s.slots_[i].state == State::kFree) s.free_.push_back(i);
  s.stats_.restored = out.blocks;
  s.stats_.lost = out.dropped;
  return out;
}

ipc::KvStoreReply BlockStore::Describe() const {
  return {id_, spec_.block_size, spec_.blocks, slab_blocks_, slab_count()};
}

uint64_t BlockStore::bytes() const {
  uint64_t n = 0;
  for (const Slab& s : slabs_) n += s.mem.size;
  return n;
}

uint64_t BlockStore::page_size() const { return slabs_.empty() ? 0 : slabs_.front().mem.page_size; }

Result<int> BlockStore::SlabFd(uint32_t slab) const {
  if (slab >= slabs_.size())
    return Invalid("store \"" + ipc::EscapeText(spec_.name) + "\" has " + std::to_string(slabs_.size()) +
                   " slabs, not " + std::to_string(slab + 1ull));
  return slabs_[slab].read_only.get();
}

std::byte* BlockStore::Address(uint64_t slot) const {
  return slabs_[slot / slab_blocks_].base + (slot % slab_blocks_) * spec_.block_size;
}

ipc::KvBlock BlockStore::BlockOf(ErrorCode code, uint64_t slot) const {
  const Slot& s = slots_[slot];
  return {code, slot, s.generation, s.length};
}

void BlockStore::Record(uint64_t slot) {
  const Slot& s = slots_[slot];
  records_.Write({slot, s.generation, s.length, s.state == State::kSealed, s.key});
}

void BlockStore::Free(uint64_t slot) {
  Slot& s = slots_[slot];
  index_.erase(s.key);
  s.key.clear();
  s.state = State::kFree;
  s.length = 0;
  s.writer = 0;
  if (copying_.count(slot) != 0 || spilling_.count(slot) != 0) {
    held_back_.insert(slot);  // a worker still uses it: reused after its copy or spill
  } else {
    free_.push_back(slot);
  }
  --used_;
  Record(slot);
}

void BlockStore::Unhold(uint64_t slot) {
  if (copying_.count(slot) == 0 && spilling_.count(slot) == 0 && held_back_.erase(slot) != 0) free_.push_back(slot);
}

bool BlockStore::EvictOne() {
  const auto evictable = [this](uint64_t slot) {
    return slots_[slot].state == State::kSealed && slots_[slot].leases == 0;
  };
  auto victim = policy_->Victim(evictable);
  if (!victim) return false;  // everything left is leased, being written or promoted
  if (unwritten_ && unwritten_(slots_[*victim].key)) {
    spilling_.insert(*victim);
    evicted_.push_back({*victim, slots_[*victim].key, slots_[*victim].length,
                        static_cast<uint32_t>(*victim / slab_blocks_), (*victim % slab_blocks_) * spec_.block_size});
  }
  Free(*victim);
  ++stats_.evictions;
  return true;
}

void BlockStore::EvictToLowWatermark() {
  const size_t freed_from = free_.size();
  while (used_ > low_)
    if (!EvictOne()) break;
  LowestFirst(freed_from);
}

void BlockStore::MakeRoom(uint64_t n) {
  const size_t freed_from = free_.size();
  while (free_.size() + held_back_.size() < std::min<uint64_t>(n, slots_.size()))
    if (!EvictOne()) break;
  LowestFirst(freed_from);
}

void BlockStore::LowestFirst(size_t from) {
  std::sort(free_.begin() + static_cast<ptrdiff_t>(from), free_.end(), std::greater<>());
}

std::optional<uint64_t> BlockStore::TakeSlot() {
  if (used_ >= high_) EvictToLowWatermark();
  if (free_.empty()) {
    ++stats_.exhausted;
    return std::nullopt;
  }
  const uint64_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void BlockStore::Spilled(uint64_t slot, bool written) {
  spilling_.erase(slot);
  Unhold(slot);
  if (written) ++stats_.spilled;
}

std::optional<uint64_t> BlockStore::Claim(std::string_view key, State state) {
  const std::optional<uint64_t> taken = TakeSlot();
  if (!taken) return std::nullopt;
  ++used_;
  Slot& s = slots_[*taken];
  s.state = state;
  s.generation += 1;
  s.length = 0;
  s.key = key;
  index_.emplace(s.key, *taken);
  return taken;
}

ipc::KvBlock BlockStore::BeginPromote(std::string_view key, std::byte** to) {
  if (Knows(key)) return {ErrorCode::kBusy, 0, 0, 0};
  const std::optional<uint64_t> taken = Claim(key, State::kPromoting);
  if (!taken) return {ErrorCode::kResourceExhausted, 0, 0, 0};
  const uint64_t slot = *taken;
  ++promoting_blocks_;
  copying_.insert(slot);
  Record(slot);
  *to = Address(slot);
  return BlockOf(ErrorCode::kOk, slot);
}

ipc::KvBlock BlockStore::EndPromote(const ipc::KvBlock& begun, const Result<uint64_t>& length, uint64_t lease_for) {
  // (a promoting slot changes only here: no client names it, eviction skips it)
  copying_.erase(begun.slot);
  --promoting_blocks_;
  Slot& s = slots_[begun.slot];
  if (!length.ok()) {
    Free(begun.slot);
    ++stats_.misses;
    return {ErrorCode::kNotFound, 0, 0, 0};
  }
  s.state = State::kSealed;
  s.length = *length;
  policy_->Inserted(begun.slot, std::hash<std::string>{}(s.key));
  Record(begun.slot);
  ++stats_.disk_hits;
  if (lease_for != 0) {
    ++leases_[lease_for][begun.slot];
    ++s.leases;
    ++stats_.hits;
  }
  return BlockOf(ErrorCode::kOk, begun.slot);
}

ipc::KvBlock BlockStore::Reserve(uint64_t session, std::string_view key) {
  if (auto it = index_.find(key); it != index_.end()) {
    const Slot& s = slots_[it->second];
    return BlockOf(s.state == State::kSealed ? ErrorCode::kAlreadyExists : ErrorCode::kBusy, it->second);
  }
  const std::optional<uint64_t> taken = Claim(key, State::kWriting);
  if (!taken) return {ErrorCode::kResourceExhausted, 0, 0, 0};
  const uint64_t slot = *taken;
  ++writing_blocks_;
  slots_[slot].writer = session;
  writing_[session].insert(slot);
  Record(slot);  // the generation is taken, even if the broker dies before the seal
  return BlockOf(ErrorCode::kOk, slot);
}

ipc::KvBlock BlockStore::Seal(uint64_t session, const ipc::KvSeal& seal, int src_fd) {
  std::byte* to = nullptr;
  const ipc::KvBlock begun = BeginCopy(session, seal, &to);
  if (begun.code != ErrorCode::kOk) return begun;
  return EndCopy(session, seal, CopyInto(to, src_fd, seal.offset, seal.length));
}

ipc::KvBlock BlockStore::BeginCopy(uint64_t session, const ipc::KvSeal& seal, std::byte** to) {
  const ipc::KvRef ref{seal.slot, seal.generation};
  if (!Refers(ref)) {
    ++stats_.stale;
    return {ErrorCode::kStale, seal.slot, seal.generation, 0};
  }
  Slot& s = slots_[seal.slot];
  if (s.state != State::kWriting || s.writer != session || copying_.count(seal.slot) != 0)
    return {ErrorCode::kInvalidHandle, seal.slot, seal.generation, 0};
  if (seal.length == 0 || seal.length > spec_.block_size)
    return {ErrorCode::kParamInvalid, seal.slot, seal.generation, 0};
  copying_.insert(seal.slot);
  *to = Address(seal.slot);
  return BlockOf(ErrorCode::kOk, seal.slot);
}

ErrorCode BlockStore::CopyInto(std::byte* to, int src_fd, uint64_t offset, uint64_t length) {
  return PreadAll(src_fd, to, length, offset);
}

ipc::KvBlock BlockStore::EndCopy(uint64_t session, const ipc::KvSeal& seal, ErrorCode copied) {
  copying_.erase(seal.slot);
  Unhold(seal.slot);
  Slot& s = slots_[seal.slot];
  // Aborted, or its writer ended, while the copy ran: nothing to seal.
  if (s.generation != seal.generation || s.state != State::kWriting || s.writer != session)
    return {ErrorCode::kInvalidHandle, seal.slot, seal.generation, 0};
  // A short read leaves the block reserved.
  if (copied != ErrorCode::kOk) return {copied, seal.slot, seal.generation, 0};
  s.state = State::kSealed;
  s.length = seal.length;
  s.writer = 0;
  --writing_blocks_;
  auto w = writing_.find(session);
  w->second.erase(seal.slot);
  if (w->second.empty()) writing_.erase(w);
  policy_->Inserted(seal.slot, std::hash<std::string>{}(s.key));
  Record(seal.slot);  // after the bytes: a broker killed before this leaves the slot free
  ++stats_.sealed;
  stats_.bytes_copied += seal.length;
  return BlockOf(ErrorCode::kOk, seal.slot);
}

ErrorCode BlockStore::Abort(uint64_t session, const ipc::KvRef& ref) {
  if (!Refers(ref)) {
    ++stats_.stale;
    return ErrorCode::kStale;
  }
  Slot& s = slots_[ref.slot];
  if (s.state != State::kWriting || s.writer != session) return ErrorCode::kInvalidHandle;
  auto w = writing_.find(session);
  w->second.erase(ref.slot);
  if (w->second.empty()) writing_.erase(w);
  --writing_blocks_;
  Free(ref.slot);
  ++stats_.aborted;
  return ErrorCode::kOk;
}

ipc::KvBlock BlockStore::Get(uint64_t session, std::string_view key, bool lease, bool* newly_held) {
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != State::kSealed) {
    ++stats_.misses;
    return {ErrorCode::kNotFound, 0, 0, 0};
  }
  const uint64_t slot = it->second;
  if (lease) {
    uint32_t& mine = leases_[session][slot];
    if (mine >= kKvMaxLeasesPerBlock) return BlockOf(ErrorCode::kResourceExhausted, slot);
    if (newly_held != nullptr) *newly_held = mine == 0;
    ++mine;
    ++slots_[slot].leases;
  }
  ++stats_.hits;
  policy_->Accessed(slot);
  return BlockOf(ErrorCode::kOk, slot);
}

ErrorCode BlockStore::Release(uint64_t session, const ipc::KvRef& ref) {
  if (!Refers(ref)) {
    ++stats_.stale;
    return ErrorCode::kStale;
  }
  auto l = leases_.find(session);
  if (l == leases_.end()) return ErrorCode::kInvalidHandle;
  uint32_t* mine = l->second.Find(ref.slot);
  if (mine == nullptr) return ErrorCode::kInvalidHandle;
  --slots_[ref.slot].leases;
  if (--*mine == 0) l->second.Erase(ref.slot);
  return ErrorCode::kOk;
}

void BlockStore::OnSessionEnd(uint64_t session) {
  if (auto l = leases_.find(session); l != leases_.end()) {
    l->second.ForEach([this](uint64_t slot, uint32_t n) { slots_[slot].leases -= n; });
    leases_.erase(l);
  }
  if (auto w = writing_.find(session); w != writing_.end()) {
    for (uint64_t slot : w->second) {
      Free(slot);
      --writing_blocks_;
      ++stats_.aborted;
    }
    writing_.erase(w);
  }
}

bool BlockStore::InUse() const {
  if (!writing_.empty() || !copying_.empty()) return true;
  for (const auto& [session, slots] : leases_)
    if (!slots.empty()) return true;
  return false;
}

uint64_t BlockStore::leases_held() const {
  uint64_t n = 0;
  for (const auto& [session, slots] : leases_) slots.ForEach([&n](uint64_t, uint32_t c) { n += c; });
  return n;
}

uint64_t BlockStore::HeldBlocks(uint64_t session) const {
  uint64_t n = 0;
  if (auto l = leases_.find(session); l != leases_.end()) n += l->second.size();
  if (auto w = writing_.find(session); w != writing_.end()) n += w->second.size();
  return n;
}

std::map<uint64_t, std::pair<uint64_t, uint64_t>> BlockStore::BySession() const {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> out;
  for (const auto& [session, slots] : leases_)
    slots.ForEach([&out, session = session](uint64_t, uint32_t c) { out[session].first += c; });
  for (const auto& [session, slots] : writing_) out[session].second += slots.size();
  return out;
}

Status BlockStore::Check() const {
  auto broken = [this](const std::string& why) {
    return Status(ErrorCode::kInternal, "store \"" + ipc::EscapeText(spec_.name) + "\": " + why);
  };
  uint64_t used = 0, writing = 0, sealed = 0, promoting = 0;
  std::vector<uint32_t> leases(slots_.size(), 0);
  bool stray = false;
  for (const auto& [session, slots] : leases_)
    slots.ForEach([&](uint64_t slot, uint32_t c) {
      if (slot >= slots_.size() || c == 0)
        stray = true;
      else
        leases[slot] += c;
    });
  if (stray) return broken("a lease on no block");
  for (uint64_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.leases != leases[i]) return broken("slot " + std::to_string(i) + " counts leases its clients do not hold");
    if (s.state == State::kFree) {
      if (s.leases != 0 || !s.key.empty()) return broken("free slot " + std::to_string(i) + " is in use");
      continue;
    }
    ++used;
    auto it = index_.find(s.key);
    if (it == index_.end() || it->second != i)
      return broken("slot " + std::to_string(i) + "'s key is not indexed to it");
    if (s.state == State::kPromoting) {
      ++promoting;
      if (s.leases != 0 || copying_.count(i) == 0)
        return broken("slot " + std::to_string(i) + " is promoted by no worker");
    } else if (s.state == State::kWriting) {
      ++writing;
      auto w = writing_.find(s.writer);
      if (s.leases != 0 || w == writing_.end() || w->second.count(i) == 0)
        return broken("slot " + std::to_string(i) + " is written by no client");
    } else {
      ++sealed;
      if (s.length == 0 || s.length > spec_.block_size)
        return broken("slot " + std::to_string(i) + " has a bad length");
    }
  }
  if (used != used_ || writing != writing_blocks_ || promoting != promoting_blocks_)
    return broken("the block counts are off");
  for (uint64_t slot : spilling_)
    if (held_back_.count(slot) == 0) return broken("slot " + std::to_string(slot) + " is spilled but not held back");
  if (index_.size() != used) return broken("the index has keys of no slot");
  if (free_.size() + held_back_.size() + used != slots_.size()) return broken("the free list is off");
  if (policy_->size() != sealed)
    return broken("the eviction policy tracks " + std::to_string(policy_->size()) + " blocks, not the " +
                  std::to_string(sealed) + " sealed");
  uint64_t reserved = 0;
  for (const auto& [session, slots] : writing_) reserved += slots.size();
  if (reserved != writing) return broken("a reservation has no slot");
  return Status::Ok();
}

}  // namespace membroker::broker
