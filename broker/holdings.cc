// Holdings: a session's references to allocations (its ledger, and its
// engine's imports) and their charges. A reference is given with GrantImport
// or at creation, and given back with Release, which removes the ledger entry
// and releases it in one step; the allocation goes with its last reference.
#include <optional>

#include "broker.h"
#include "log.h"
#include "systemd.h"

namespace membroker::broker {

Status Broker::Charge(Session& s, const Usage& delta) {
  MB_RETURN_IF_ERROR(accounting_.Check(s.usage, s.cred.uid, delta));
  s.usage += delta;
  accounting_.ChargeUid(s.cred.uid, delta);
  return Status::Ok();
}

void Broker::Uncharge(Session* s, uid_t uid, const Usage& delta) {
  if (s != nullptr) s->usage -= delta;
  accounting_.ReleaseUid(uid, delta);
}

namespace {
Ledger& LedgerOf(Session& s, Holding where) {
  return where == Holding::kLedger ? s.ledger : s.engine.holdings;
}
}  // namespace

bool Broker::Release(Session& s, uint64_t id, Holding where) {
  Ledger& ledger = LedgerOf(s, where);
  if (!ledger.Remove(id)) return false;
  const Allocation* a = table_.Find(id);
  if (a == nullptr) return true;  // unreachable while the tables agree (CheckTables)
  if (a->creator == s.id && where == Holding::kLedger)
    s.usage -= a->charge;  // the uid stays charged while the allocation lives
  else
    Uncharge(&s, s.cred.uid, Usage{0, 0, 0, 1});  // an import
  DropReference(id);
  return true;
}

size_t Broker::ReleaseAll(Session& s, Holding where) {
  Ledger& ledger = LedgerOf(s, where);
  const std::vector<uint64_t> ids = ledger.Ids();
  for (uint64_t id : ids) Release(s, id, where);
  return ids.size();
}

void Broker::DropReference(uint64_t id) {
  std::optional<Allocation> gone = table_.DropHolder(id);
  if (gone) Retire(std::move(*gone));
}

void Broker::Retire(Allocation gone_allocation) {
  std::optional<Allocation> gone(std::move(gone_allocation));
  const uint64_t id = gone->id;
  MB_DEBUG("free", "id=%llu size=%llu", static_cast<unsigned long long>(id),
           static_cast<unsigned long long>(gone->size));
  accounting_.ReleaseUid(gone->creator_uid, gone->charge);
  if (!gone->stored_as.empty()) systemd::RemoveStoredFds(gone->stored_as);
  if (!gone->tokens.empty()) StateChanged();  // its exports went with it
  if (gone->fixed_address) window_.Free(gone->fixed_address);
  if (gone->pool >= 0) --pools_[gone->pool].in_use;
  // Its memory goes back to the kernel here; never to another tenant (pool.h).
  // Closing the last fd of 4 KiB pages frees them one by one: for a large
  // allocation, for everything a closing session held, or for an allocation
  // taken from a pool (taken and freed at a rate, and closing even a 4 KiB
  // memfd costs the loop about 6 us), a worker does it so the loop keeps
  // serving, after a pause as the pool's refills do. Huge pages are few and
  // quick to free, and go back at once, so a client that frees one may
  // allocate it again at once.
  if (gone->page_size != ipc::kNormalPageSize) return;
  if (return_batch_ != nullptr) {
    return_batch_->Add(std::move(*gone));
  } else if (gone->size > options_.inline_alloc_bytes || gone->pool >= 0) {
    deferred_returns_.Add(std::move(*gone));
    DeferBackground();
  }
}

Status Broker::GrantImport(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only,
                           Ledger& into, const std::string& metadata) {
  if (into.Holds(a.id))
    return Status(ErrorCode::kAlreadyExists, "this client already holds allocation " +
                                                 std::to_string(a.id) +
                                                 " (take it once and share the handle)");
  if (into.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  MB_RETURN_IF_ERROR(Charge(s, Usage{0, 0, 0, 1}));
  into.Add(a.id, read_only);
  table_.AddHolder(a.id);
  table_.CountImport();
  Send(s, rid, ipc::ImportReply{a.id, a.size, a.page_size, read_only, a.pinned, a.fixed_address, metadata},
       std::span<const int>(&fd, 1));
  return Status::Ok();
}

Status Broker::FreeAllocation(uint64_t id) {
  if (table_.Find(id) == nullptr) return Status(ErrorCode::kNotFound, "no allocation " + std::to_string(id));
  std::vector<Session*> holders;
  for (auto& [sid, s] : sessions_)
    if (s->ledger.Holds(id)) holders.push_back(s);
  for (Session* s : holders) Release(*s, id, Holding::kLedger);
  for (auto& [sid, s] : sessions_) Release(*s, id, Holding::kEngine);
  for (auto it = names_.begin(); it != names_.end();) {
    auto next = std::next(it);
    if (it->second.allocation == id) Unpublish(it, 0);
    it = next;
  }
  MB_INFO("allocation_freed_by_admin", "id=%llu holders=%zu", static_cast<unsigned long long>(id),
          holders.size());
  return Status::Ok();
}

}  // namespace membroker::broker
