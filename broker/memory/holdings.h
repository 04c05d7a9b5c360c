// Holdings: the memory the broker owns and who holds it - the allocation
// table, the charges (accounting) and the same-address window - and the
// rules that tie them together. A session holds a reference in its ledger
// (created, imported, looked up) or in its engine's holdings (EngineImport of
// a peer's region); a publication holds one of its own. A reference is given
// with Grant (or at Insert) and given back with Release, which removes the
// entry and settles its charge in one step; the allocation goes with its last
// reference, and Retire settles everything it had: its uid's charge, its
// same-address range, its pool's count, the journal (the fd store), and its
// pages (on a worker when they are many).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memory/accounting.h"
#include "memory/address_window.h"
#include "memory/allocation_table.h"
#include "memory/backend.h"
#include "memory/pools.h"
#include "memory/workers.h"
#include "server/session.h"

namespace membroker::broker {

// What the restart side keeps of the memory (systemd's fd store, or nothing):
// told of every allocation that enters and leaves the table and of every
// change to the exports.
class MemoryJournal {
 public:
  virtual ~MemoryJournal() = default;
  virtual void Entered(Allocation& a) = 0;
  virtual void Left(const Allocation& a) = 0;
  virtual void ExportsChanged() = 0;
};

class Holdings {
 public:
  // Freed pages of allocations above inline_bytes go back on a worker.
  Holdings(PhysicalBackend& backend, Pools& pools, Workers& workers, MemoryJournal& journal,
           AddressWindow window, uint64_t inline_bytes)
      : backend_(backend), table_(backend), window_(window), pools_(pools), workers_(workers), journal_(journal),
        inline_bytes_(inline_bytes) {}
  Holdings(const Holdings&) = delete;
  Holdings& operator=(const Holdings&) = delete;

  PhysicalBackend& backend() { return backend_; }
  // Budgets and quotas (set once, from the options).
  Accounting& limits() { return accounting_; }

  // Charges: QUOTA_EXCEEDED or RESOURCE_EXHAUSTED, or charged to s and its uid.
  Status Charge(Session& s, const Usage& delta);
  void Uncharge(Session* s, uid_t uid, const Usage& delta);

  // New memory of s: its charge settles from `charged` (made up front) to
  // what was created; s holds it.
  Allocation& Insert(Session& s, PhysicalMemory mem, ipc::PagePolicy policy, bool pinned,
                     const Usage& charged, uint64_t fixed_address, int pool);
  // A same-address range (0 when the window is full), freed with its allocation.
  uint64_t ReserveAddress(uint64_t size, uint64_t page_size);
  void FreeAddress(uint64_t address) { window_.Free(address); }
  // Memory an earlier broker made, under its old id: pinned again if it was,
  // at its old same-address range (ADDRESS_IN_USE if that is taken: nothing
  // changes), charged to uid, held by nobody yet. stored_as: its name in
  // systemd's fd store, where it is stored already.
  Result<Allocation*> Adopt(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy, uid_t uid, bool pinned,
                            uint64_t fixed_address, std::pair<uint64_t, uint64_t> inode,
                            const std::string& stored_as = "");
  // s holds adopted memory again; creator_back: s made it, and pays for it
  // again if no one else has claimed it.
  void Rehold(Session& s, Allocation& a, bool read_only, bool creator_back);

  // One more reference for s, recorded in `where` and charged as an import
  // (ALREADY_EXISTS if s holds it there, RESOURCE_EXHAUSTED past the cap).
  Status Grant(Session& s, const Allocation& a, bool read_only, Holding where);
  // Removes s's entry for id from `where` and releases it; false if s held none there.
  bool Release(Session& s, uint64_t id, Holding where);
  // Releases every entry of `where`; returns how many there were.
  size_t ReleaseAll(Session& s, Holding where);
  // A reference held by something other than a session (a publication).
  void AddReference(uint64_t id) { table_.AddHolder(id); }
  void DropReference(uint64_t id);
  // Handed-over memory nobody reattached to goes; the rest is ordinary
  // memory from now on. Returns how many went.
  size_t ExpireAwaiting();
  // While a session ends: what is freed is gathered in *batch (returned on
  // one worker, by the caller). Returns the batch it replaces.
  ReturnBatch* GatherReturns(ReturnBatch* batch) { return std::exchange(gather_, batch); }

  // Exports (allocation_table.h); every change is journaled.
  Result<std::string> Export(uint64_t id, const Session& s, uint32_t flags);
  Status SetPids(const std::string& token, const Session& s, std::vector<pid_t> pids);
  Result<const ExportEntry*> CheckImport(const std::string& token, const Importer& who) {
    return table_.CheckImport(token, who);
  }
  Status RestoreExport(const std::string& token, uint64_t id, uint64_t exporter, uid_t exporter_uid, uint32_t flags,
                       const std::vector<ExportEntry::AllowedProcess>& pids);

  Allocation* Find(uint64_t id) { return table_.Find(id); }
  const Allocation* Find(uint64_t id) const { return table_.Find(id); }
  Allocation* FindByInode(uint64_t dev, uint64_t ino) { return table_.FindByInode(dev, ino); }
  void StartIdsAt(uint64_t first) { table_.StartIdsAt(first); }

  // Read by admin and the consistency check.
  const AllocationTable& table() const { return table_; }
  const Accounting& accounting() const { return accounting_; }
  const AddressWindow& window() const { return window_; }

 private:
  // Settles and releases an allocation that has left the table.
  void Retire(Allocation gone);

  PhysicalBackend& backend_;
  AllocationTable table_;
  Accounting accounting_;
  AddressWindow window_;
  Pools& pools_;
  Workers& workers_;
  MemoryJournal& journal_;
  const uint64_t inline_bytes_;
  ReturnBatch* gather_ = nullptr;
};

}  // namespace membroker::broker
