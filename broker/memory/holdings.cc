// Holdings (holdings.h).
#include "memory/holdings.h"

#include <algorithm>

#include "log.h"

namespace membroker::broker {

namespace {
Ledger& LedgerOf(Session& s, Holding where) { return where == Holding::kLedger ? s.ledger : s.engine_holdings; }
constexpr Usage kOneImport{.imports = 1};
}  // namespace

Status Holdings::Charge(Session& s, const Usage& delta) {
  MB_RETURN_IF_ERROR(accounting_.Check(s.usage, s.cred.uid, delta));
  s.usage += delta;
  accounting_.ChargeUid(s.cred.uid, delta);
  return Status::Ok();
}

void Holdings::Uncharge(Session* s, uid_t uid, const Usage& delta) {
  if (s != nullptr) s->usage -= delta;
  accounting_.ReleaseUid(uid, delta);
}

Allocation& Holdings::Insert(Session& s, PhysicalMemory mem, ipc::PagePolicy policy, bool pinned,
                             const Usage& charged, uint64_t fixed_address, int pool) {
  // Settle the charge to what was actually created (HUGE_FIRST may fall back).
  const Usage actual = Usage::For(mem.size, pinned, mem.device);
  Uncharge(&s, s.cred.uid, charged);
  s.usage += actual;
  accounting_.ChargeUid(s.cred.uid, actual);
  Allocation& a = table_.Insert(std::move(mem), policy, s.id, s.cred.uid);
  a.charge = actual;
  a.fixed_address = fixed_address;
  a.pool = pool;
  if (pool >= 0) pools_.InUse(pool);
  journal_.Entered(a);
  s.ledger.Add(a.id);
  return a;
}

uint64_t Holdings::ReserveAddress(uint64_t size, uint64_t page_size) {
  // Aligned to the page size, and to 2 MiB at least, so huge pages line up.
  return window_.Allocate(size, std::max(page_size, ipc::kHuge2MPageSize));
}

Result<Allocation*> Holdings::Adopt(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy, uid_t uid,
                                    bool pinned, uint64_t fixed_address, std::pair<uint64_t, uint64_t> inode,
                                    const std::string& stored_as) {
  if (fixed_address != 0 && !window_.Claim(fixed_address, mem.size))
    return Status(ErrorCode::kAddressInUse, "the same-address range of allocation " + std::to_string(id) +
                                                " is taken here or outside --va-window");
  if (pinned) {
    // Its pages were locked by the broker that died; this one locks them again.
    if (Status pin = Pin(&mem); !pin.ok())
      MB_WARN("reattach_unpinned", "id=%llu reason=\"%s\"", static_cast<unsigned long long>(id),
              LogText(pin.message()).c_str());
  }
  const uint64_t size = mem.size;
  const int device = mem.device;
  Allocation& a = table_.Adopt(id, std::move(mem), policy, 0, uid, inode);
  a.holders = 0;  // its holders come back by reattaching
  a.fixed_address = fixed_address;
  a.charge = Usage::For(size, a.pinned, device);
  a.stored_as = stored_as;
  accounting_.ChargeUid(uid, a.charge);  // it exists: charged, never refused
  journal_.Entered(a);
  return &a;
}

void Holdings::Rehold(Session& s, Allocation& a, bool read_only, bool creator_back) {
  s.ledger.Add(a.id, read_only);
  table_.AddHolder(a.id);
  if (creator_back && a.creator == 0 && a.adopted) {
    a.creator = s.id;  // its maker is back: it pays for it again
    s.usage += a.charge;
  } else {
    s.usage += kOneImport;
    accounting_.ChargeUid(s.cred.uid, kOneImport);
  }
}

Status Holdings::Grant(Session& s, const Allocation& a, bool read_only, Holding where) {
  Ledger& into = LedgerOf(s, where);
  if (into.Holds(a.id))
    return Status(ErrorCode::kAlreadyExists, "this client already holds allocation " + std::to_string(a.id) +
                                                 " (take it once and share the handle)");
  if (into.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  MB_RETURN_IF_ERROR(Charge(s, kOneImport));
  into.Add(a.id, read_only);
  table_.AddHolder(a.id);
  table_.CountImport();
  return Status::Ok();
}

bool Holdings::Release(Session& s, uint64_t id, Holding where) {
  if (!LedgerOf(s, where).Remove(id)) return false;
  Allocation* a = table_.Find(id);
  if (a == nullptr) return true;  // unreachable while the tables agree (CheckTables)
  if (a->creator == s.id && where == Holding::kLedger) {
    s.usage -= a->charge;  // the uid stays charged while the allocation lives
    // Its maker let go (a publication may keep it alive): should the maker
    // take it again (Lookup), that is an import, charged and released as one.
    a->creator = 0;
  } else {
    Uncharge(&s, s.cred.uid, kOneImport);
  }
  DropReference(id);
  return true;
}

size_t Holdings::ReleaseAll(Session& s, Holding where) {
  const std::vector<uint64_t> ids = LedgerOf(s, where).Ids();
  for (uint64_t id : ids) Release(s, id, where);
  return ids.size();
}

void Holdings::DropReference(uint64_t id) {
  std::optional<Allocation> gone = table_.DropHolder(id);
  if (gone) Retire(std::move(*gone));
}

size_t Holdings::ExpireAwaiting() {
  std::vector<uint64_t> unheld;
  for (auto& [id, a] : table_.all())
    if (a.awaiting && a.holders == 0) unheld.push_back(id);
  size_t released = 0;
  for (uint64_t id : unheld)
    if (auto gone = table_.RemoveUnheld(id)) {
      Retire(std::move(*gone));
      ++released;
    }
  for (const auto& [id, a] : table_.all())
    if (Allocation* live = table_.Find(id)) live->awaiting = false;
  return released;
}

void Holdings::Retire(Allocation gone) {
  MB_DEBUG("free", "id=%llu size=%llu", static_cast<unsigned long long>(gone.id),
           static_cast<unsigned long long>(gone.size));
  accounting_.ReleaseUid(gone.creator_uid, gone.charge);
  journal_.Left(gone);
  if (gone.fixed_address) window_.Free(gone.fixed_address);
  if (gone.pool >= 0) pools_.Returned(gone.pool);
  // Its memory goes back to the kernel here; never to another tenant (pools.h).
  // Closing the last fd of 4 KiB pages frees them one by one: for a large
  // allocation, for everything a closing session held, or for an allocation
  // taken from a pool (taken and freed at a rate, and closing even a 4 KiB
  // memfd costs the loop about 6 us), a worker does it so the loop keeps
  // serving, after a pause as the pool's refills do. Huge pages are few and
  // quick to free, and go back at once, so a client that frees one may
  // allocate it again at once.
  if (gone.page_size != ipc::kNormalPageSize) return;
  if (gather_ != nullptr)
    gather_->Add(std::move(gone.memory));
  else if (gone.size > inline_bytes_ || gone.pool >= 0)
    workers_.ReturnLater(std::move(gone.memory));
}

Result<std::string> Holdings::Export(uint64_t id, const Session& s, uint32_t flags) {
  MB_ASSIGN_OR_RETURN(std::string token, table_.Export(id, s.id, s.cred.uid, flags));
  journal_.ExportsChanged();
  return token;
}

Status Holdings::SetPids(const std::string& token, const Session& s, std::vector<pid_t> pids) {
  MB_RETURN_IF_ERROR(table_.SetPids(token, s.id, std::move(pids)));
  journal_.ExportsChanged();
  return Status::Ok();
}

Status Holdings::RestoreExport(const std::string& token, uint64_t id, uint64_t exporter, uid_t exporter_uid,
                               uint32_t flags, const std::vector<ExportEntry::AllowedProcess>& pids) {
  MB_RETURN_IF_ERROR(table_.RestoreExport(token, id, exporter, exporter_uid, flags, pids));
  journal_.ExportsChanged();
  return Status::Ok();
}

}  // namespace membroker::broker
