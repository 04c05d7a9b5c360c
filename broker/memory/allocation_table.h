// AllocationTable: every live allocation the broker owns, its holder count and
// its export tokens. Pure bookkeeping (no sockets, no loop), so its rules are
// unit-tested directly.
//
// Lifetime rules:
//  1. Insert() creates an allocation with one holder (its creator).
//  2. AddHolder()/DropHolder() follow the per-client ledgers; when the last
//     holder drops, the allocation is erased: its fd closes and its tokens die.
//  3. A token lives exactly as long as its allocation.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/accounting.h"
#include "memory/backend.h"
#include "memory/memfd.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

struct Allocation {
  uint64_t id = 0;
  PhysicalMemory memory;  // from the backend; its fd is what holders get
  uint64_t size = 0;
  uint64_t page_size = 0;
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  uint64_t creator = 0;  // client id
  uid_t creator_uid = 0;
  uint32_t holders = 0;
  bool fell_back = false;      // HUGE_FIRST that got normal pages
  bool pinned = false;
  int pool = -1;               // index of the pool it came from, or -1
  uint64_t fixed_address = 0;  // same-address allocations
  bool adopted = false;        // presented by a reattaching client or handed over, not created here
  bool awaiting = false;       // handed over: kept without holders until the reattach grace ends
  std::pair<uint64_t, uint64_t> inode{0, 0};  // (st_dev, st_ino), for adopted allocations
  std::string stored_as;       // its FDNAME in systemd's fd store (fd_store.h), if stored
  Usage charge;                // what it costs its creator (and the creator's uid)
  std::chrono::steady_clock::time_point created;
  std::vector<std::string> tokens;
};

// Exports of one allocation at once: each holds a token (and, read-only, an fd).
inline constexpr size_t kMaxExportsPerAllocation = 64;

struct ExportEntry {
  uint64_t allocation = 0;
  uint64_t exporter = 0;  // client id
  uid_t exporter_uid = 0;
  uint32_t flags = 0;
  // Who may import (unless kExportNoPidCheck): each pid with the start time of
  // the process it named at SetPids time, so a recycled pid never inherits
  // an entry - and no fd is held per entry.
  // The wire's type: what reattach and take-over carry is stored as it came.
  using AllowedProcess = ipc::AllowedPid;
  std::vector<AllowedProcess> allowed;
  ipc::UniqueFd read_only_fd;  // set for kExportReadOnly
};

struct Importer {
  uint64_t client = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  bool alive = true;  // the process that opened the connection still runs
  // Where the importer's process start time is kept once read (0: not yet);
  // null to read it every time.
  uint64_t* start_time = nullptr;
};

struct TableCounters {
  uint64_t allocations_created = 0;
  uint64_t huge_fallbacks = 0;
  uint64_t allocations_freed = 0;
  uint64_t bytes_live = 0;
  uint64_t exports_created = 0;
  uint64_t imports = 0;
};

class AllocationTable {
 public:
  // backend makes the read-only fds of read-only exports.
  explicit AllocationTable(PhysicalBackend& backend = MemfdBackend()) : backend_(backend) {}
  // Takes ownership of mem; the creator becomes the only holder.
  Allocation& Insert(PhysicalMemory mem, ipc::PagePolicy policy, uint64_t creator,
                     uid_t creator_uid);
  // Takes memory a reattaching client presented under the id a previous
  // broker gave it (reattach.cc checks it may): like Insert, with that id.
  // inode: (st_dev, st_ino) of mem's fd, as the caller read it.
  Allocation& Adopt(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy, uint64_t creator,
                    uid_t creator_uid, std::pair<uint64_t, uint64_t> inode);
  // Ids are handed out from first upwards (StateFile keeps them above a
  // predecessor's); next_id() is the next one.
  void StartIdsAt(uint64_t first) { next_id_ = first_id_ = first; }
  uint64_t first_id() const { return first_id_; }
  uint64_t next_id() const { return next_id_; }
  // The adopted allocation whose memory is this inode (fstat of any fd to
  // it), if any. Only adopted memory is indexed: memory this broker created
  // is never presented to it (a reattach goes to a later broker), so Insert
  // and frees cost no fstat.
  Allocation* FindByInode(uint64_t dev, uint64_t ino);

  Allocation* Find(uint64_t id);
  const Allocation* Find(uint64_t id) const;
  const ExportEntry* FindExport(const std::string& token) const;
  const std::map<uint64_t, Allocation>& all() const { return allocations_; }
  const TableCounters& counters() const { return counters_; }
  size_t export_count() const { return exports_.size(); }

  void AddHolder(uint64_t id);
  // When this was the last holder, removes the allocation and returns it (its
  // memory is released when the caller lets it go).
  std::optional<Allocation> DropHolder(uint64_t id);
  // Removes an allocation nobody holds (a handed-over one nobody reattached).
  std::optional<Allocation> RemoveUnheld(uint64_t id);
  const std::unordered_map<std::string, ExportEntry>& exports() const { return exports_; }

  // Creates an export token for allocation id.
  Result<std::string> Export(uint64_t id, uint64_t exporter, uid_t exporter_uid, uint32_t flags);
  // Only the client that created the token may restrict it. Each pid must name
  // a running process; the entry stays tied to that process (a pidfd), so a
  // recycled pid never inherits it.
  Status SetPids(const std::string& token, uint64_t requester, std::vector<pid_t> pids);
  // Checks the importer against the token's rules. Unknown, stale and
  // not-permitted tokens all give the same NOT_FOUND (no oracle).
  Result<const ExportEntry*> CheckImport(const std::string& token, const Importer& who);
  // Re-creates a token its exporter presents after a broker restart: the
  // same token, flags and pids (each kept only if that pid still names the
  // process it named: the same start time).
  Status RestoreExport(const std::string& token, uint64_t id, uint64_t exporter, uid_t exporter_uid,
                       uint32_t flags, const std::vector<ExportEntry::AllowedProcess>& pids);
  void CountImport() { ++counters_.imports; }

 private:
  Allocation Erase(std::map<uint64_t, Allocation>::iterator it);
  Allocation& Place(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy, uint64_t creator,
                    uid_t creator_uid);

  PhysicalBackend& backend_;
  uint64_t first_id_ = 1;
  uint64_t next_id_ = 1;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> by_inode_;  // adopted: (dev, ino) -> id
  std::map<uint64_t, Allocation> allocations_;
  std::unordered_map<std::string, ExportEntry> exports_;
  TableCounters counters_;
};

}  // namespace membroker::broker
