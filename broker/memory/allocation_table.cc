#include "memory/allocation_table.h"

#include <algorithm>

#include "membroker/ipc/pidfd.h"
#include "memory/token.h"

namespace membroker::broker {

Allocation& AllocationTable::Insert(PhysicalMemory mem, ipc::PagePolicy policy,
                                    uint64_t creator, uid_t creator_uid) {
  return Place(next_id_++, std::move(mem), policy, creator, creator_uid);
}

Allocation& AllocationTable::Adopt(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy,
                                   uint64_t creator, uid_t creator_uid, std::pair<uint64_t, uint64_t> inode) {
  Allocation& a = Place(id, std::move(mem), policy, creator, creator_uid);
  a.adopted = true;
  a.inode = inode;
  by_inode_[inode] = id;
  return a;
}

Allocation* AllocationTable::FindByInode(uint64_t dev, uint64_t ino) {
  auto it = by_inode_.find({dev, ino});
  return it == by_inode_.end() ? nullptr : Find(it->second);
}

Allocation& AllocationTable::Place(uint64_t id, PhysicalMemory mem, ipc::PagePolicy policy,
                                   uint64_t creator, uid_t creator_uid) {
  Allocation& a = allocations_[id];
  a.id = id;
  a.size = mem.size;
  a.page_size = mem.page_size;
  a.policy = policy;
  a.creator = creator;
  a.creator_uid = creator_uid;
  a.fell_back = mem.fell_back;
  a.pinned = mem.lock.locked();
  a.memory = std::move(mem);
  a.holders = 1;
  if (a.fell_back) ++counters_.huge_fallbacks;
  a.created = std::chrono::steady_clock::now();
  ++counters_.allocations_created;
  counters_.bytes_live += a.size;
  return a;
}

Allocation* AllocationTable::Find(uint64_t id) {
  auto it = allocations_.find(id);
  return it == allocations_.end() ? nullptr : &it->second;
}

const Allocation* AllocationTable::Find(uint64_t id) const {
  auto it = allocations_.find(id);
  return it == allocations_.end() ? nullptr : &it->second;
}

const ExportEntry* AllocationTable::FindExport(const std::string& token) const {
  auto it = exports_.find(token);
  return it == exports_.end() ? nullptr : &it->second;
}

void AllocationTable::AddHolder(uint64_t id) {
  if (Allocation* a = Find(id)) ++a->holders;
}

std::optional<Allocation> AllocationTable::DropHolder(uint64_t id) {
  auto it = allocations_.find(id);
  if (it == allocations_.end() || it->second.holders == 0) return std::nullopt;
  if (--it->second.holders > 0) return std::nullopt;
  return Erase(it);
}

std::optional<Allocation> AllocationTable::RemoveUnheld(uint64_t id) {
  auto it = allocations_.find(id);
  if (it == allocations_.end() || it->second.holders != 0) return std::nullopt;
  return Erase(it);
}

Allocation AllocationTable::Erase(std::map<uint64_t, Allocation>::iterator it) {
  for (const std::string& t : it->second.tokens) exports_.erase(t);
  if (it->second.adopted) by_inode_.erase(it->second.inode);
  counters_.bytes_live -= it->second.size;
  ++counters_.allocations_freed;
  Allocation gone = std::move(it->second);
  allocations_.erase(it);
  return gone;
}

Result<std::string> AllocationTable::Export(uint64_t id, uint64_t exporter, uid_t exporter_uid,
                                            uint32_t flags) {
  if (flags & ~ipc::kExportKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown export flags " + std::to_string(flags));
  Allocation* a = Find(id);
  if (a == nullptr) return Status(ErrorCode::kInvalidHandle, "unknown handle");
  if (a->tokens.size() >= kMaxExportsPerAllocation)
    return Status(ErrorCode::kResourceExhausted,
                  "allocation " + std::to_string(id) + " has " + std::to_string(kMaxExportsPerAllocation) +
                      " exports already (share one token with several pids instead)");
  ExportEntry e;
  e.allocation = id;
  e.exporter = exporter;
  e.exporter_uid = exporter_uid;
  e.flags = flags;
  if (flags & ipc::kExportReadOnly) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, BackendOf(a->memory, backend_).ReadOnlyFd(a->memory));
  }
  MB_ASSIGN_OR_RETURN(std::string token, RandomToken());
  a->tokens.push_back(token);
  exports_.emplace(token, std::move(e));
  ++counters_.exports_created;
  return token;
}

Status AllocationTable::SetPids(const std::string& token, uint64_t requester,
                                std::vector<pid_t> pids) {
  auto it = exports_.find(token);
  if (it == exports_.end() || it->second.exporter != requester)
    return Status(ErrorCode::kNotFound, "no such token exported by this client");
  // Duplicates collapse; each pid is tied to the process running now.
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  std::vector<ExportEntry::AllowedProcess> allowed;
  for (pid_t p : pids) {
    if (p <= 0) return Status(ErrorCode::kParamInvalid, "pid " + std::to_string(p) + " is invalid");
    auto start = ipc::ProcessStartTime(p);
    if (!start.ok()) {
      if (start.code() == ErrorCode::kNotFound)
        return Status(ErrorCode::kParamInvalid, "pid " + std::to_string(p) + " does not name a running process");
      return start.status();  // RESOURCE_EXHAUSTED when the broker is out of fds, saying so
    }
    allowed.push_back({p, *start});
  }
  it->second.allowed = std::move(allowed);
  return Status::Ok();
}

Status AllocationTable::RestoreExport(const std::string& token, uint64_t id, uint64_t exporter,
                                     uid_t exporter_uid, uint32_t flags,
                                     const std::vector<ExportEntry::AllowedProcess>& pids) {
  if (flags & ~ipc::kExportKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown export flags " + std::to_string(flags));
  const bool well_formed = token.size() == 32 && std::all_of(token.begin(), token.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (!well_formed) return Status(ErrorCode::kParamInvalid, "a token is 32 lowercase hex digits");
  Allocation* a = Find(id);
  if (a == nullptr) return Status(ErrorCode::kInvalidHandle, "unknown handle");
  if (auto it = exports_.find(token); it != exports_.end()) {
    // A take-over kept it: the same allocation and exporter make it the same export.
    if (it->second.allocation == id && it->second.exporter_uid == exporter_uid) {
      it->second.exporter = exporter;
      return Status::Ok();
    }
    return Status(ErrorCode::kAlreadyExists, "the token is in use for other memory");
  }
  if (a->tokens.size() >= kMaxExportsPerAllocation)
    return Status(ErrorCode::kResourceExhausted,
                  "allocation " + std::to_string(id) + " has " + std::to_string(kMaxExportsPerAllocation) +
                      " exports already");
  if (pids.size() > ipc::kMaxPidsPerRequest)
    return Status(ErrorCode::kParamInvalid, "at most 1024 pids per export");
  ExportEntry e;
  e.allocation = id;
  e.exporter = exporter;
  e.exporter_uid = exporter_uid;
  e.flags = flags;
  for (const auto& p : pids) {
    if (p.pid <= 0 || p.start_time == 0) continue;
    auto start = ipc::ProcessStartTime(p.pid);
    if (start.ok() && *start == p.start_time) e.allowed.push_back(p);  // else: that process is gone
  }
  if (flags & ipc::kExportReadOnly) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, BackendOf(a->memory, backend_).ReadOnlyFd(a->memory));
  }
  a->tokens.push_back(token);
  exports_.emplace(token, std::move(e));
  ++counters_.exports_created;
  return Status::Ok();
}

Result<const ExportEntry*> AllocationTable::CheckImport(const std::string& token,
                                                        const Importer& who) {
  static const Status kNoToken(ErrorCode::kNotFound,
                               "token unknown, freed, or not shared with this process");
  auto it = exports_.find(token);
  if (it == exports_.end()) return kNoToken;
  const ExportEntry& e = it->second;
  bool allowed = false;
  if (!who.alive) {
    allowed = false;  // a connection handed on by a process that has exited
  } else if (e.flags & ipc::kExportNoPidCheck) {
    allowed = who.uid == e.exporter_uid || who.uid == 0;
  } else {
    // The importer (alive: its pid is its own) must be the process that was
    // named, not a later one that got the same pid number.
    auto at = std::find_if(e.allowed.begin(), e.allowed.end(),
                           [&](const ExportEntry::AllowedProcess& a) { return a.pid == who.pid; });
    if (at != e.allowed.end()) {
      // Read from /proc once per importer: its process cannot change while alive.
      uint64_t start = who.start_time != nullptr ? *who.start_time : 0;
      if (start == 0) {
        auto read = ipc::ProcessStartTime(who.pid);
        start = read.ok() ? *read : 0;
        if (who.start_time != nullptr) *who.start_time = start;
      }
      allowed = start != 0 && start == at->start_time;
    }
  }
  if (!allowed) return kNoToken;
  return &e;
}

}  // namespace membroker::broker
