// CheckTables: each component checks its own state, then a walk over the
// tables checks that they agree with each other. It is how the tests catch
// bookkeeping drift that no single request shows: the integration suite runs
// it (admin `check`) after every test, and the fuzzer after every input.
#include <map>

#include "broker.h"

namespace membroker::broker {

namespace {
bool operator!=(const Usage& a, const Usage& b) {
  return a.bytes != b.bytes || a.pinned_bytes != b.pinned_bytes || a.allocations != b.allocations ||
         a.imports != b.imports || a.device_bytes != b.device_bytes || a.kv_bytes != b.kv_bytes;
}
std::string Text(const Usage& u) {
  return "bytes=" + std::to_string(u.bytes) + " pinned=" + std::to_string(u.pinned_bytes) +
         " allocations=" + std::to_string(u.allocations) + " imports=" + std::to_string(u.imports) +
         " device=" + std::to_string(u.device_bytes) + " kv=" + std::to_string(u.kv_bytes);
}
Status Broken(const std::string& what) {
  return Status(ErrorCode::kInternal, "tables disagree: " + what);
}
}  // namespace

Status Broker::CheckTables() const {
  // 0. Each component's own rules.
  auto alive = [this](uint64_t id) { return sessions_.Find(id) != nullptr; };
  MB_RETURN_IF_ERROR(sessions_.Check());
  MB_RETURN_IF_ERROR(engines_.Check(alive));
  MB_RETURN_IF_ERROR(names_.Check(alive));
  MB_RETURN_IF_ERROR(waiters_.Check(alive));
  MB_RETURN_IF_ERROR(kv_.Check());
  for (const auto& [name, store] : kv_.all())
    for (const auto& [sid, held] : store->BySession())
      if (!alive(sid)) return Broken("a KV lease or reservation of ended client " + std::to_string(sid));
  const AllocationTable& table = holdings_.table();
  std::vector<int> pools_of_live;
  for (const auto& [id, a] : table.all()) pools_of_live.push_back(a.pool);
  MB_RETURN_IF_ERROR(pools_.Check(pools_of_live));
  // 1. Holders: every reference an allocation counts is a ledger entry, an
  //    engine holding or a publication, and each of those names a live one.
  std::map<uint64_t, uint32_t> refs;
  for (const auto& [sid, s] : sessions_.all()) {
    for (const Ledger* l : {&s->ledger, &s->engine_holdings})
      for (uint64_t id : l->Ids()) {
        if (table.Find(id) == nullptr)
          return Broken("client " + std::to_string(sid) + " holds freed allocation " + std::to_string(id));
        ++refs[id];
      }
  }
  for (const auto& [name, e] : names_.all()) {
    if (table.Find(e.allocation) == nullptr)
      return Broken("a named object refers to freed allocation " + std::to_string(e.allocation));
    ++refs[e.allocation];
  }
  for (const auto& [id, a] : table.all()) {
    if (a.holders != refs[id])
      return Broken("allocation " + std::to_string(id) + " counts " + std::to_string(a.holders) +
                    " holders, the ledgers and names say " + std::to_string(refs[id]));
    for (const std::string& t : a.tokens)
      if (const ExportEntry* e = table.FindExport(t); e == nullptr || e->allocation != id)
        return Broken("allocation " + std::to_string(id) + " lists a token it does not own");
  }
  if (table.export_count() > 0) {
    size_t tokens = 0;
    for (const auto& [id, a] : table.all()) tokens += a.tokens.size();
    if (tokens != table.export_count()) return Broken("an export outlived its allocation");
  }
  // 2. Charges: with no creation in flight (those are charged up front),
  //    every charge has an owner - a client's own allocations, imports and
  //    host registrations, and per uid the live allocations' creators.
  if (counters_.bytes_pending != 0) return Status::Ok();
  std::map<uid_t, Usage> uid_expected;
  Usage total_expected;
  for (const auto& [id, a] : table.all()) {
    uid_expected[a.creator_uid] += a.charge;
    total_expected += a.charge;
  }
  for (const auto& [name, store] : kv_.all()) {  // a store's slabs, charged to its creator's uid
    const Usage slabs = Usage::For(store->bytes(), false, -1);
    uid_expected[store->spec().uid] += slabs;
    total_expected += slabs;
  }
  for (const auto& [sid, s] : sessions_.all()) {
    if (s->inflight != 0) return Status::Ok();
    Usage own;            // what the client is charged for
    Usage beyond_table;   // what its uid is charged for beyond its live allocations
    for (uint64_t id : s->ledger.Ids()) {
      const Allocation* a = table.Find(id);
      if (a->creator == sid) {
        own += a->charge;
      } else {
        own.imports += 1;
        beyond_table.imports += 1;
      }
    }
    own.imports += s->engine_holdings.size();
    beyond_table.imports += s->engine_holdings.size();
    for (const auto& [addr, size] : s->host_regs) {
      own.pinned_bytes += size;
      beyond_table.pinned_bytes += size;
    }
    const uint64_t kv_held = kv_.HeldBytes(sid);
    own.kv_bytes += kv_held;
    beyond_table.kv_bytes += kv_held;
    if (own != s->usage)
      return Broken("client " + std::to_string(sid) + " is charged " + Text(s->usage) +
                    " but holds " + Text(own));
    uid_expected[s->cred.uid] += beyond_table;
    total_expected += beyond_table;
  }
  const Accounting& accounting = holdings_.accounting();
  for (const auto& [uid, u] : accounting.by_uid())
    if (u != uid_expected[uid])
      return Broken("uid " + std::to_string(uid) + " is charged " + Text(u) + " but owns " +
                    Text(uid_expected[uid]));
  for (const auto& [uid, u] : uid_expected)
    if (accounting.by_uid().count(uid) == 0 && (u != Usage{}))
      return Broken("uid " + std::to_string(uid) + " owns " + Text(u) + " but is not charged");
  if (accounting.total() != total_expected)
    return Broken("the broker's totals " + Text(accounting.total()) + " are not the sum " +
                  Text(total_expected));
  return Status::Ok();
}

}  // namespace membroker::broker
