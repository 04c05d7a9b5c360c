// Memory requests: MallocPhysical (from a pool, on the loop, or on a worker),
// free, export, pid allow-lists, import and host registration, over Holdings.
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/cuda_driver.h"
#include "membroker/ipc/escape.h"
#include "memory/memfd.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/ranges.h"

namespace membroker::broker {

// A MallocRequest whose memory is being created (or taken from a pool).
struct Broker::PendingMalloc {
  uint64_t session_id = 0;
  uint64_t request_id = 0;
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  uint32_t flags = 0;
  uint32_t export_flags = 0;  // with ipc::kMallocExport
  Usage charged;              // up front; settled by FinishMalloc
  uid_t uid = 0;
};

namespace {
constexpr uint64_t kHostRegisterAlign = 4096;

Status NotHeld(uint64_t handle) {
  return Status(ErrorCode::kInvalidHandle,
                "handle " + std::to_string(handle) +
                    " is not held by this client (unknown, foreign or already freed)");
}

}  // namespace

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::MallocRequest& m) {
  if (m.policy > ipc::PagePolicy::kHuge1GOnly)
    return Status(ErrorCode::kParamInvalid,
                  "unknown page policy " + std::to_string(static_cast<int>(m.policy)));
  if (m.size == 0) return Status(ErrorCode::kParamInvalid, "size must not be zero");
  if (m.size > ipc::kMaxAllocationBytes)
    return Status(ErrorCode::kParamInvalid,
                  "size " + std::to_string(m.size) + " exceeds the per-allocation limit");
  if (m.flags & ~ipc::kMallocKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown malloc flags " + std::to_string(m.flags));
  if (m.export_flags & ~ipc::kExportKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown export flags " + std::to_string(m.export_flags));
  if (m.export_flags != 0 && !(m.flags & ipc::kMallocExport))
    return Status(ErrorCode::kParamInvalid, "export flags without the export malloc flag");
  if (m.device < -1) return Status(ErrorCode::kParamInvalid, "device " + std::to_string(m.device) + " is no device");
  if (m.device >= 0) {
    // Why this broker has no device memory to give (no driver, no such device).
    MB_RETURN_IF_ERROR(ipc::CudaDriver::Get().CheckDevice(m.device));
    if (m.flags & (ipc::kMallocPinned | ipc::kMallocSameAddress))
      return Status(ErrorCode::kParamInvalid, "device memory is neither pinned host memory nor same-address");
    if (m.policy != ipc::PagePolicy::kNormalOnly)
      return Status(ErrorCode::kParamInvalid,
                    "page policies are for host memory; device memory has the driver's granularity");
  }
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  // Charge the largest size the policy may produce; settled in FinishMalloc.
  const bool pinned = m.flags & ipc::kMallocPinned;
  MemorySpec spec{state_file_->NameFor("membroker:client" + std::to_string(s.id)), m.size, m.policy, pinned, m.device};
  PhysicalBackend& backend = BackendFor(spec, holdings_.backend());
  uint64_t reserve = backend.MaxBytes(spec);
  if (reserve == 0) return Status(ErrorCode::kParamInvalid, "size overflows");
  PendingMalloc p{s.id, rid, m.policy, m.flags, m.export_flags, Usage::For(reserve, pinned, m.device), s.cred.uid};
  MB_RETURN_IF_ERROR(holdings_.Charge(s, p.charged));

  if (auto taken = m.device >= 0 ? std::nullopt : pools_.Take(m.size, m.policy, m.flags)) {
    FinishMalloc(p, std::move(taken->memory), taken->pool);
    workers_.Defer();  // the refill
    return Deferred{};  // FinishMalloc answered
  }
  counters_.bytes_pending += reserve;
  if (reserve <= options_.inline_alloc_bytes) {
    FinishMalloc(p, backend.Create(spec), -1);
    return Deferred{};  // FinishMalloc answered
  }
  if (s.inflight >= options_.max_inflight_per_client) {
    counters_.bytes_pending -= reserve;
    holdings_.Uncharge(&s, s.cred.uid, p.charged);
    return Status(ErrorCode::kResourceExhausted, "too many allocations in flight for this client");
  }
  ++s.inflight;
  workers_.Create(std::move(spec), [this, p](Result<PhysicalMemory> mem) {
    if (Session* s = sessions_.Find(p.session_id)) --s->inflight;
    FinishMalloc(p, std::move(mem), -1);
  });
  return Deferred{};  // FinishMalloc answers when the worker is done
}

void Broker::FinishMalloc(const PendingMalloc& p, Result<PhysicalMemory> mem, int pool) {
  if (pool < 0) counters_.bytes_pending -= p.charged.bytes;
  Session* s = sessions_.Find(p.session_id);
  uint64_t fixed = 0;
  if (s != nullptr && mem.ok() && (p.flags & ipc::kMallocSameAddress)) {
    fixed = holdings_.ReserveAddress(mem->size, mem->page_size);
    if (fixed == 0) mem = Status(ErrorCode::kResourceExhausted, "the same-address window is full (see --va-window)");
  }
  if (s == nullptr || !mem.ok()) {
    // The client left meanwhile, or creation failed: undo the charges.
    holdings_.Uncharge(s, p.uid, p.charged);
    if (s != nullptr) SendError(*s, p.request_id, mem.status());
    return;  // any memory created closes here
  }
  Allocation& a = holdings_.Insert(*s, std::move(*mem), p.policy, p.flags & ipc::kMallocPinned, p.charged, fixed, pool);
  ReserveIds();
  std::string token;
  if (p.flags & ipc::kMallocExport) {
    // Exported in the same round trip; if that fails, so does the allocation.
    auto exported = holdings_.Export(a.id, *s, p.export_flags);
    if (!exported.ok()) {
      holdings_.Release(*s, a.id, Holding::kLedger);
      SendError(*s, p.request_id, exported.status());
      return;
    }
    token = std::move(*exported);
  }
  MB_DEBUG("alloc", "client=%llu id=%llu size=%llu page_size=%llu pinned=%d pool=%d",
           static_cast<unsigned long long>(s->id), static_cast<unsigned long long>(a.id),
           static_cast<unsigned long long>(a.size), static_cast<unsigned long long>(a.page_size),
           a.pinned ? 1 : 0, a.pool);
  int fd = a.memory.fd.get();
  Send(*s, p.request_id,
       ipc::MallocReply{a.id, a.size, a.page_size, a.fell_back, a.pinned, a.fixed_address, pool >= 0, std::move(token),
                        a.memory.device},
       std::span<const int>(&fd, 1));
}

Status Broker::Grant(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only, Holding where,
                     const std::string& metadata) {
  MB_RETURN_IF_ERROR(holdings_.Grant(s, a, read_only, where));
  Send(s, rid,
       ipc::ImportReply{a.id, a.size, a.page_size, read_only, a.pinned, a.fixed_address, metadata, a.memory.device},
       std::span<const int>(&fd, 1));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::FreeRequest& m) {
  if (!holdings_.Release(s, m.handle, Holding::kLedger)) return NotHeld(m.handle);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::ExportRequest& m) {
  if (!s.ledger.Holds(m.handle)) return NotHeld(m.handle);
  // What this client may only read, it shares onward read-only.
  const uint32_t flags = m.flags | (s.ledger.ReadOnly(m.handle) ? ipc::kExportReadOnly : 0);
  MB_ASSIGN_OR_RETURN(std::string token, holdings_.Export(m.handle, s, flags));
  return ipc::ExportReply{std::move(token)};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::SetPidRequest& m) {
  MB_RETURN_IF_ERROR(holdings_.SetPids(m.token, s, std::vector<pid_t>(m.pids.begin(), m.pids.end())));
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::ImportRequest& m) {
  MB_ASSIGN_OR_RETURN(const ExportEntry* e,
                      holdings_.CheckImport(m.token, Importer{s.id, s.cred.pid, s.cred.uid,
                                                           ipc::PidfdAlive(s.pidfd.get()), &s.start_time}));
  const Allocation* a = holdings_.Find(e->allocation);
  bool read_only = e->read_only_fd.valid();
  return SentOnSuccess(
      Grant(s, rid, *a, read_only ? e->read_only_fd.get() : a->memory.fd.get(), read_only, Holding::kLedger));
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::RegisterHostRequest& m) {
  if (m.address == 0 || m.size == 0 || m.address % kHostRegisterAlign || m.size % kHostRegisterAlign)
    return Status(ErrorCode::kParamInvalid,
                  "host register needs a non-zero address and size, both multiples of 4096");
  if (m.address + m.size < m.address) return Status(ErrorCode::kParamInvalid, "range overflows");
  if (m.flags != 0)
    return Status(ErrorCode::kParamInvalid, "unknown host register flags " + std::to_string(m.flags));
  if (ipc::Overlaps(s.host_regs, m.address, m.size, [](uint64_t n) { return n; }))
    return Status(ErrorCode::kOverlap, "range overlaps memory this client already registered");
  MB_RETURN_IF_ERROR(holdings_.Charge(s, Usage{.pinned_bytes = m.size}));
  s.host_regs[m.address] = m.size;
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::UnregisterHostRequest& m) {
  auto it = s.host_regs.find(m.address);
  if (it == s.host_regs.end())
    return Status(ErrorCode::kNotFound, "no host registration starts at this address");
  if (const Engine* e = engines_.OwnedBy(s.id))
    for (const auto& [addr, r] : e->regions)
      if (r.allocation == 0 && addr >= it->first && addr < it->first + it->second)
        return Status(ErrorCode::kBusy, "transfer engine region " + std::to_string(r.id) +
                                            " lies in this range (DeregisterMem it first)");
  holdings_.Uncharge(&s, s.cred.uid, Usage{.pinned_bytes = it->second});
  s.host_regs.erase(it);
  return Status::Ok();
}

}  // namespace membroker::broker
