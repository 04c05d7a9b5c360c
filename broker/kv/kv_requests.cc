// KV-cache store requests over KvStores (docs/KV.md): open or create a store,
// a slab's fd, and the batches - reserve, seal, abort, get, release - each
// answered per key, in order. Drop removes a store nobody uses.
#include <fcntl.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"

namespace membroker::broker {

namespace {
// kv_bytes (accounting.h, rule 5) of n blocks of store.
Usage Held(uint64_t n, const BlockStore& store) { return Usage{.kv_bytes = n * store.spec().block_size}; }

Status NoStore(uint64_t id) {
  return Status(ErrorCode::kInvalidHandle, "no store has id " + std::to_string(id) + " at this broker");
}
// Applies op to every ref of a batch answered by one status (abort, release):
// OK, or the first failure and how many failed (the others were done).
template <typename Op>
Status EachRef(const char* what, const std::vector<ipc::KvRef>& refs, const Op& op) {
  size_t failed = 0, first = 0;
  ErrorCode code = ErrorCode::kOk;
  for (size_t i = 0; i < refs.size(); ++i)
    if (ErrorCode c = op(refs[i]); c != ErrorCode::kOk && failed++ == 0) {
      first = i;
      code = c;
    }
  if (failed == 0) return Status::Ok();
  return Status(code, std::string(what) + " " + std::to_string(first) + " of the batch failed with " +
                          std::string(ErrorCodeName(code)) + " (" + std::to_string(failed) +
                          " failed in all; the others were done)");
}

// Hands the blocks the store evicted to a worker that copies them out of
// their slots (which are then free again: what waited for a slot is retried),
// then writes them to the disk tier. A block is not written if the key is on
// the disk already, if it cannot fit, or if too many bytes wait to be: its
// slot is free at once.
void SpillEvicted(KvStores& kv, Workers& workers, BlockStore& store) {
  std::vector<BlockStore::Evicted> evicted = store.TakeEvicted();
  if (evicted.empty()) return;
  KvDiskTier& disk = *kv.disk();
  struct Spill {
    KvDiskTier::Write write;
    uint64_t slot = 0;
    Status result;
  };
  auto batch = std::make_shared<std::vector<Spill>>();
  std::map<uint32_t, std::shared_ptr<const ipc::UniqueFd>> slabs;  // one fd per slab for the batch
  for (BlockStore::Evicted& e : evicted) {
    std::optional<KvDiskTier::Write> w = disk.BeginWrite(store.spec().name, e.key, store.spec().block_size, e.length);
    std::shared_ptr<const ipc::UniqueFd>& slab = slabs[e.slab];
    if (w && !slab) {
      Result<int> fd = store.SlabFd(e.slab);
      slab = std::make_shared<const ipc::UniqueFd>(fd.ok() ? ::fcntl(*fd, F_DUPFD_CLOEXEC, 0) : -1);
    }
    if (!w || !slab->valid()) {
      if (w) disk.EndWrite(*w, Status(ErrorCode::kResourceExhausted, "no fd for the slab"));
      store.Spilled(e.slot, false);  // free at once: the caller sees it
      continue;
    }
    w->slab = slab;
    w->offset = e.offset;
    batch->push_back({std::move(*w), e.slot, Status::Ok()});
  }
  if (batch->empty()) return;
  workers.Run(
      [batch] {
        for (Spill& x : *batch) x.result = KvDiskTier::Copy(x.write);
      },
      [&kv, &workers, batch, store_id = store.id()] {
        // (a store dropped meanwhile took its slots with it)
        for (const Spill& x : *batch)
          if (x.result.ok()) kv.disk()->Copied(x.write);  // a get of the key is served from the copy now
        if (BlockStore* st = kv.Find(store_id)) {
          for (const Spill& x : *batch) st->Spilled(x.slot, x.result.ok());
          kv.SlotsFreed(store_id);
        }
        kv.QueueDiskWrite(
            workers,
            [batch] {
              for (Spill& x : *batch)
                if (x.result.ok()) x.result = KvDiskTier::Perform(x.write);
            },
            [&kv, batch, store_id] {
              for (Spill& x : *batch) {
                x.write.payload.reset();
                kv.disk()->EndWrite(x.write, x.result);
              }
              kv.SlotsFreed(store_id);  // (a get waits for a key being written)
            });
      });
}
// The answer to a get: each key's block (leased if asked, and charged to the
// client's kv quota), and how many lead the batch. Without a lease, a key
// on the disk is there too (a get with a lease promotes it). `promoted`:
// keys read from the disk for this get, leased and charged already.
ipc::KvBlocksReply GetBlocks(Holdings& holdings, const KvDiskTier* disk, Session& s, BlockStore& store,
                             const ipc::KvGetRequest& m,
                             std::map<std::string, ipc::KvBlock, std::less<>>&& promoted = {}) {
  ipc::KvBlocksReply reply;
  reply.blocks.reserve(m.keys.size());
  std::vector<bool> fresh(m.keys.size());  // the block's first lease for this client
  uint64_t fresh_blocks = 0;
  for (std::string_view key : m.keys) {
    ipc::KvBlock b{ErrorCode::kOk, 0, 0, 0};
    if (auto it = promoted.find(key); it != promoted.end()) {
      b = it->second;  // (once: the key again in the batch takes a lease of its own)
      promoted.erase(it);
    } else if (m.lease || disk == nullptr || store.Knows(key) || !disk->Has(store.spec().name, key)) {
      bool newly_held = false;
      b = store.Get(s.id, key, m.lease, &newly_held);
      fresh[reply.blocks.size()] = newly_held;
      fresh_blocks += newly_held;
    }
    reply.blocks.push_back(b);
  }
  // One charge for the batch. Past the quota, the blocks that fit stay
  // leased, in order, and the rest are released: a charge that failed fails
  // again for the next block, so every block after it is refused too.
  if (fresh_blocks != 0) {
    if (Status q = holdings.Charge(s, Held(fresh_blocks, store)); !q.ok()) {
      std::set<uint64_t> refused;  // slots
      for (size_t i = 0; i < reply.blocks.size(); ++i)
        if (fresh[i] && (!refused.empty() || !holdings.Charge(s, Held(1, store)).ok()))
          refused.insert(reply.blocks[i].slot);
      for (ipc::KvBlock& b : reply.blocks) {
        if (b.code != ErrorCode::kOk || refused.count(b.slot) == 0) continue;
        (void)store.Release(s.id, {b.slot, b.generation});
        b = {q.code(), 0, 0, 0};
      }
    }
  }
  bool leading = true;
  for (const ipc::KvBlock& b : reply.blocks) {
    leading = leading && b.code == ErrorCode::kOk;
    if (leading) ++reply.leading;
  }
  return reply;
}

// What a reserve or a get that waits for the disk tier goes on with, from a
// worker's completion or when slots free: the components it reads, and how
// its answer is sent.
struct KvWork {
  Sessions& sessions;
  KvStores& kv;
  Workers& workers;
  Holdings& holdings;
  std::function<void(Session&, uint64_t rid, Result<ipc::KvBlocksReply>)> answer;
};

// A reserve or a get with a disk tier may wait for it: for blocks being
// written out to free their slots, for promotions to be read in. It counts as
// its session's work in flight until it is answered (a take-over waits).
struct KvPending {
  KvPending(KvWork w, Session& s, uint64_t request) : work(std::move(w)), session(s.id), rid(request) { ++s.inflight; }
  ~KvPending() {
    if (Session* s = work.sessions.Find(session)) --s->inflight;
  }
  KvPending(const KvPending&) = delete;
  KvPending& operator=(const KvPending&) = delete;

  KvWork work;
  uint64_t session = 0, rid = 0;
  ipc::KvReserveRequest reserve;
  ipc::KvGetRequest get;
  ipc::KvBlocksReply reply;                      // a reserve's, so far
  size_t next = 0;                               // the reserve's next key
  std::map<std::string, ipc::KvBlock, std::less<>> promoted;  // the get's keys read from the disk, leased
};

void ReserveFrom(const std::shared_ptr<KvPending>& p) {
  KvWork& w = p->work;
  Session* s = w.sessions.Find(p->session);
  if (s == nullptr) return;
  BlockStore* store = w.kv.Find(p->reserve.store);
  if (store == nullptr) return w.answer(*s, p->rid, NoStore(p->reserve.store));
  const KvDiskTier* disk = w.kv.disk();
  if (disk != nullptr && p->next == 0) {
    uint64_t unknown = 0;
    for (std::string_view key : p->reserve.keys) unknown += !store->Knows(key) && !disk->Has(store->spec().name, key);
    store->MakeRoom(unknown);
  }
  for (; p->next < p->reserve.keys.size(); ++p->next) {
    const std::string_view key = p->reserve.keys[p->next];
    if (disk != nullptr && !store->Knows(key) && disk->Has(store->spec().name, key)) {
      p->reply.blocks.push_back({ErrorCode::kAlreadyExists, 0, 0, 0});  // on the disk: a get promotes it
      continue;
    }
    const uint64_t held = store->HeldBlocks(s->id);
    ipc::KvBlock b = store->Reserve(s->id, key);
    if (b.code == ErrorCode::kResourceExhausted && store->spilling()) {
      SpillEvicted(w.kv, w.workers, *store);  // (evicted blocks the disk has are free at once)
      if (store->free_slots() == 0) return w.kv.WhenSlotsFree(store->id(), [p] { ReserveFrom(p); });
      b = store->Reserve(s->id, key);
    }
    if (store->HeldBlocks(s->id) > held) {
      if (Status q = w.holdings.Charge(*s, Held(1, *store)); !q.ok()) {
        (void)store->Abort(s->id, {b.slot, b.generation});  // past the client's or its uid's quota
        b = {q.code(), 0, 0, 0};
      }
    }
    p->reply.blocks.push_back(b);
  }
  if (disk != nullptr) SpillEvicted(w.kv, w.workers, *store);
  w.answer(*s, p->rid, std::move(p->reply));
}

// Keys on the disk and not in memory are read into slots on a worker and
// leased for the client at once (so that the next promotions cannot evict
// them), then the get is answered. A pass that finds no free slot while
// blocks are being written out, or a key whose file is being written (evicted
// a moment ago), waits for a write to end. A pass may evict a block of the
// batch that was in memory: the next pass finds it on the disk. Every pass
// that promotes leases a key for good, so the passes end; the last one
// promotes nothing, evicts nothing, and is answered at once.
void GetFrom(const std::shared_ptr<KvPending>& p) {
  KvWork& w = p->work;
  Session* s = w.sessions.Find(p->session);
  if (s == nullptr) return;
  BlockStore* store = w.kv.Find(p->get.store);
  if (store == nullptr) return w.answer(*s, p->rid, NoStore(p->get.store));
  KvDiskTier& disk = *w.kv.disk();
  struct Promotion {
    KvDiskTier::Read read;
    ipc::KvBlock block;
    std::byte* to = nullptr;
    Result<uint64_t> length = uint64_t{0};
  };
  auto promotions = std::make_shared<std::vector<Promotion>>();
  bool full = false, being_written = false;
  uint64_t wanted = 0;
  for (std::string_view key : p->get.keys)
    wanted += p->promoted.count(key) == 0 && !store->Knows(key) && disk.Has(store->spec().name, key);
  store->MakeRoom(wanted);
  for (std::string_view key : p->get.keys) {
    if (p->promoted.count(key) != 0 || store->Knows(key)) continue;
    std::optional<KvDiskTier::Read> read = disk.BeginRead(store->spec().name, key, store->spec().block_size);
    if (!read) {  // not in the tier, or evicted a moment ago and not yet copied out
      being_written = being_written || disk.BeingWritten(store->spec().name, key);
      continue;
    }
    Promotion promotion{std::move(*read), {}, nullptr};
    promotion.block = store->BeginPromote(key, &promotion.to);
    if (promotion.block.code != ErrorCode::kOk) {
      disk.CancelRead(promotion.read);  // no slot for it now
      full = true;
      break;
    }
    SpillEvicted(w.kv, w.workers, *store);  // (so that a key it evicted is found on the disk from here on)
    promotions->push_back(std::move(promotion));
  }
  SpillEvicted(w.kv, w.workers, *store);
  if (!promotions->empty()) {
    w.workers.Run(
        [promotions] {
          for (Promotion& x : *promotions) x.length = KvDiskTier::Perform(x.read, x.to);
        },
        [promotions, p] {
          KvWork& w = p->work;
          BlockStore* st = w.kv.Find(p->get.store);  // (not dropped: a promotion in flight keeps it in use)
          Session* session = w.sessions.Find(p->session);
          for (const Promotion& x : *promotions) {
            ipc::KvBlock b = st->EndPromote(x.block, x.length, session != nullptr ? session->id : 0);
            w.kv.disk()->EndRead(x.read, x.length);
            if (session == nullptr || b.code != ErrorCode::kOk) continue;
            if (Status q = w.holdings.Charge(*session, Held(1, *st)); !q.ok()) {
              (void)st->Release(session->id, {b.slot, b.generation});  // past the client's or its uid's quota
              b = {q.code(), 0, 0, 0};
            }
            p->promoted.emplace(x.read.key, b);
          }
          GetFrom(p);  // the keys left, if any; then the answer
        });
    return;
  }
  if (full && store->free_slots() > 0) return GetFrom(p);  // evicted blocks the disk has were freed at once
  // (each write's end wakes what waits on the store's slots)
  if ((full && store->spilling()) || being_written) return w.kv.WhenSlotsFree(store->id(), [p] { GetFrom(p); });
  w.answer(*s, p->rid, GetBlocks(w.holdings, &disk, *s, *store, p->get, std::move(p->promoted)));
}

}  // namespace

Answer Broker::Handle(Session& s, uint64_t, const ipc::KvOpenRequest& m) {
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxKvStoreNameBytes, "a store name"));
  if (const BlockStore* store = kv_.FindByName(m.name)) {
    if (m.create && m.block_size != store->spec().block_size)
      return Status(ErrorCode::kAlreadyExists, "store \"" + ipc::EscapeText(m.name) + "\" exists with blocks of " +
                                                   std::to_string(store->spec().block_size) + " bytes, not " +
                                                   std::to_string(m.block_size));
    return store->Describe();
  }
  if (!m.create) return Status(ErrorCode::kNotFound, "no store is named \"" + ipc::EscapeText(m.name) + "\"");
  if (m.eviction > static_cast<uint8_t>(EvictionKind::kLru))
    return Status(ErrorCode::kParamInvalid, "unknown eviction policy " + std::to_string(m.eviction));
  if (m.block_size == 0 || m.capacity / m.block_size == 0)
    return Status(ErrorCode::kParamInvalid, "capacity " + std::to_string(m.capacity) + " holds no block of " +
                                                std::to_string(m.block_size) + " bytes");
  KvStoreSpec spec{m.name,    m.block_size, m.capacity / m.block_size, m.policy, static_cast<EvictionKind>(m.eviction),
                   s.cred.uid};
  MB_ASSIGN_OR_RETURN(BlockStore * store, kv_.Create(std::move(spec), holdings_.limits()));
  return store->Describe();
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::KvSlabRequest& m) {
  BlockStore* store = kv_.Find(m.store);
  if (store == nullptr) return NoStore(m.store);
  MB_ASSIGN_OR_RETURN(int fd, store->SlabFd(m.slab));
  const int fds[] = {fd};
  Send(s, rid, ipc::KvSlabReply{store->SlabBytes(m.slab)}, fds);
  return Deferred{};
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::KvReserveRequest& m) {
  if (kv_.Find(m.store) == nullptr) return NoStore(m.store);
  auto answer = [this](Session& c, uint64_t id, Result<ipc::KvBlocksReply> r) {
    r.ok() ? Send(c, id, std::move(*r)) : SendError(c, id, r.status());
  };
  auto p = std::make_shared<KvPending>(KvWork{sessions_, kv_, workers_, holdings_, answer}, s, rid);
  p->reserve = m;
  p->reply.blocks.reserve(m.keys.size());
  ReserveFrom(p);
  return Deferred{};
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::KvSealRequest& m) {
  BlockStore* store = kv_.Find(m.store);
  if (store == nullptr) return NoStore(m.store);
  // Each seal checked; the copies it needs, from the writers' memory into the slots.
  struct Copy {
    size_t index = 0;  // in the batch
    std::byte* to = nullptr;
    ipc::UniqueFd src;
    ErrorCode result = ErrorCode::kOk;
  };
  auto copies = std::make_shared<std::vector<Copy>>();
  ipc::KvBlocksReply reply;
  reply.blocks.reserve(m.blocks.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const ipc::KvSeal& seal = m.blocks[i];
    // The source: host memory this client holds, the range inside it.
    const Allocation* a = holdings_.Find(seal.allocation);
    if (a == nullptr || !s.ledger.Holds(seal.allocation) || a->memory.device >= 0) {
      reply.blocks.push_back({ErrorCode::kInvalidHandle, seal.slot, seal.generation, 0});
      continue;
    }
    if (seal.offset > a->size || seal.length > a->size - seal.offset) {
      reply.blocks.push_back({ErrorCode::kOutOfRange, seal.slot, seal.generation, 0});
      continue;
    }
    Copy c;
    reply.blocks.push_back(store->BeginCopy(s.id, seal, &c.to));
    if (reply.blocks.back().code != ErrorCode::kOk) continue;
    c.index = i;
    // (its own fd: the client may free the allocation while a worker copies)
    c.src.reset(::fcntl(a->memory.fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!c.src.valid()) c.result = ErrorCode::kResourceExhausted;
    bytes += seal.length;
    copies->push_back(std::move(c));
  }
  auto copy_all = [copies, seals = m.blocks] {
    for (Copy& c : *copies)
      if (c.result == ErrorCode::kOk)
        c.result = BlockStore::CopyInto(c.to, c.src.get(), seals[c.index].offset, seals[c.index].length);
  };
  // Seals what was copied, gives back the charge of what is no longer held
  // and answers; the client may have ended meanwhile (nothing to answer).
  auto finish = [this, copies, rid, sid = s.id, store_id = m.store, seals = m.blocks,
                 reply = std::move(reply)]() mutable {
    BlockStore* st = kv_.Find(store_id);  // (not dropped: a copy in flight keeps it in use)
    const uint64_t held = st->HeldBlocks(sid);
    for (const Copy& c : *copies) reply.blocks[c.index] = st->EndCopy(sid, seals[c.index], c.result);
    Session* session = sessions_.Find(sid);
    if (session == nullptr) return;
    holdings_.Uncharge(session, session->cred.uid, Held(held - st->HeldBlocks(sid), *st));  // sealed: no longer held
    Send(*session, rid, std::move(reply));
  };
  // Batches past the size allocations are made inline up to (1 MiB; a copy of
  // it takes the loop about a quarter of a millisecond) are copied on a
  // worker, so the loop serves everyone else meanwhile.
  if (bytes <= options_.inline_alloc_bytes || s.inflight >= options_.max_inflight_per_client) {
    copy_all();
    finish();
    return Deferred{};
  }
  ++s.inflight;
  workers_.Run(std::move(copy_all), [this, sid = s.id, finish = std::move(finish)]() mutable {
    if (Session* session = sessions_.Find(sid)) --session->inflight;
    finish();
  });
  return Deferred{};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::KvAbortRequest& m) {
  BlockStore* store = kv_.Find(m.store);
  if (store == nullptr) return NoStore(m.store);
  const uint64_t held = store->HeldBlocks(s.id);
  Status st = EachRef("abort", m.refs, [&](const ipc::KvRef& r) { return store->Abort(s.id, r); });
  holdings_.Uncharge(&s, s.cred.uid, Held(held - store->HeldBlocks(s.id), *store));
  return st;
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::KvGetRequest& m) {
  BlockStore* store = kv_.Find(m.store);
  if (store == nullptr) return NoStore(m.store);
  if (kv_.disk() == nullptr || !m.lease) return GetBlocks(holdings_, kv_.disk(), s, *store, m);
  auto answer = [this](Session& c, uint64_t id, Result<ipc::KvBlocksReply> r) {
    r.ok() ? Send(c, id, std::move(*r)) : SendError(c, id, r.status());
  };
  auto p = std::make_shared<KvPending>(KvWork{sessions_, kv_, workers_, holdings_, answer}, s, rid);
  p->get = m;
  GetFrom(p);
  return Deferred{};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::KvReleaseRequest& m) {
  BlockStore* store = kv_.Find(m.store);
  if (store == nullptr) return NoStore(m.store);
  const uint64_t held = store->HeldBlocks(s.id);
  Status st = EachRef("release", m.refs, [&](const ipc::KvRef& r) { return store->Release(s.id, r); });
  holdings_.Uncharge(&s, s.cred.uid, Held(held - store->HeldBlocks(s.id), *store));
  return st;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::KvDropRequest& m) {
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxKvStoreNameBytes, "a store name"));
  const BlockStore* found = kv_.FindByName(m.name);
  if (found != nullptr && found->spec().uid != s.cred.uid && s.cred.uid != 0)
    return Status(ErrorCode::kPermissionDenied,
                  "store \"" + ipc::EscapeText(m.name) + "\" belongs to uid " + std::to_string(found->spec().uid));
  return DropStore(kv_, holdings_.limits(), m.name);
}

Status DropStore(KvStores& kv, Accounting& limits, const std::string& name) {
  MB_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store, kv.Remove(name));
  limits.ReleaseUid(store->spec().uid, Usage::For(store->bytes(), false, -1));
  MB_INFO("kv_store_dropped", "store=\"%s\" id=%llu", LogText(name).c_str(),
          static_cast<unsigned long long>(store->id()));
  // A store the broker is configured to have (--kv-store) is made again, empty.
  if (Status st = kv.MakeConfigured(limits); !st.ok())
    MB_WARN("kv_store_not_made", "reason=\"%s\"", LogText(st.message()).c_str());
  return Status::Ok();
}

}  // namespace membroker::broker
