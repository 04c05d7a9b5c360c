// Memory requests: the handshake, MallocPhysical (from a pool, on the loop, or
// on a worker), free, export, pid allow-lists, import and host registration.
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
#include "membroker/ipc/memfd.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/ranges.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kHostRegisterAlign = 4096;

Status NotHeld(uint64_t handle) {
  return Status(ErrorCode::kInvalidHandle,
                "handle " + std::to_string(handle) +
                    " is not held by this client (unknown, foreign or already freed)");
}

}  // namespace

Answer Broker::Handle(Session& s, uint64_t, const ipc::HelloRequest& m) {
  if (s.hello_done) return Status(ErrorCode::kProtocolError, "handshake already done");
  if (!s.admitted) {
    ++counters_.clients_refused;
    return Status(ErrorCode::kPermissionDenied,
                  "uid " + std::to_string(s.cred.uid) + " (gid " + std::to_string(s.cred.gid) +
                      ") is not admitted by this broker (see --allow-uid, --allow-gid)");
  }
  if (m.protocol_version != ipc::kProtocolVersion)
    return Status(ErrorCode::kVersionMismatch,
                  "broker speaks protocol " + std::to_string(ipc::kProtocolVersion) +
                      ", client speaks " + std::to_string(m.protocol_version));
  if (!m.client_name.empty())
    MB_RETURN_IF_ERROR(ipc::CheckName(m.client_name, ipc::kMaxClientNameBytes, "the client name"));
  if (Handshaken() >= options_.max_clients) {
    ++counters_.connections_refused;
    return Status(ErrorCode::kResourceExhausted,
                  "the broker serves " + std::to_string(options_.max_clients) +
                      " clients already (--max-clients); try again later");
  }
  s.hello_done = true;
  handshaking_.erase(s.id);
  s.name = m.client_name;
  if (m.features & ipc::kFeatureReattach) {
    s.reattaching = true;
    ++counters_.clients_reattached;
    MB_INFO("client_reattaching", "client=%llu pid=%d name=\"%s\"", static_cast<unsigned long long>(s.id),
            static_cast<int>(s.cred.pid), LogText(s.name).c_str());
  }
  ipc::HelloReply reply{s.id, ipc::kProtocolVersion, 0, {}};
  for (auto p : {ipc::PagePolicy::kNormalOnly, ipc::PagePolicy::kHugeFirst,
                 ipc::PagePolicy::kHugeOnly, ipc::PagePolicy::kHuge1GOnly})
    reply.granularities.push_back(backend_.Granularity(p));
  return reply;
}

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
    // Why this broker has no device memory to give (no driver, no such device)...
    MB_RETURN_IF_ERROR(ipc::CudaDriver::Get().CheckDevice(m.device));
    // ...and, where it could, that the device backend is not built yet.
    return Status(ErrorCode::kUnsupported,
                  "device allocations (cuMemCreate) are not implemented in this membrokerd yet; device " +
                      std::to_string(m.device) + " is present");
  }
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  // Charge the largest size the policy may produce; settled in FinishMalloc.
  uint64_t reserve = backend_.MaxBytes(m.size, m.policy);
  if (reserve == 0) return Status(ErrorCode::kParamInvalid, "size overflows");
  const bool pinned = m.flags & ipc::kMallocPinned;
  PendingMalloc p{s.id, rid, s.cred.uid, m.policy, m.flags, m.export_flags,
                  Usage{reserve, pinned ? reserve : 0, 1, 0}, -1};
  MB_RETURN_IF_ERROR(Charge(s, p.charged));

  if (TakeFromPool(p, m.size)) return Deferred{};  // FinishMalloc answered

  counters_.bytes_pending += reserve;
  MemorySpec spec{MemoryName("membroker:client" + std::to_string(s.id)), m.size, m.policy,
                  (m.flags & ipc::kMallocPinned) != 0};
  if (reserve <= options_.inline_alloc_bytes) {
    FinishMalloc(p, backend_.Create(spec));
    return Deferred{};  // FinishMalloc answered
  }
  if (s.inflight >= options_.max_inflight_per_client) {
    counters_.bytes_pending -= reserve;
    Uncharge(&s, s.cred.uid, p.charged);
    return Status(ErrorCode::kResourceExhausted, "too many allocations in flight for this client");
  }
  CreateOnWorker(p, std::move(spec));
  return Deferred{};  // FinishMalloc answers when the worker is done
}

void Broker::FinishMalloc(const PendingMalloc& p, Result<ipc::PhysicalMemory> mem) {
  if (p.pool < 0) counters_.bytes_pending -= p.charged.bytes;
  Session* s = FindSession(p.session_id);
  uint64_t fixed = 0;
  if (s != nullptr && mem.ok() && (p.flags & ipc::kMallocSameAddress)) {
    // Aligned to the page size, and to 2 MiB at least, so huge pages line up.
    fixed = window_.Allocate(mem->size, std::max(mem->page_size, ipc::kHuge2MPageSize));
    if (fixed == 0)
      mem = Status(ErrorCode::kResourceExhausted,
                   "the same-address window is full (see --va-window)");
  }
  if (s == nullptr || !mem.ok()) {
    // The client left meanwhile, or creation failed: undo the charges.
    Uncharge(s, p.uid, p.charged);
    if (s != nullptr) SendError(*s, p.request_id, mem.status());
    return;  // any memory created closes here
  }
  // Settle the charge to what was actually created (HUGE_FIRST may fall back).
  Usage actual{mem->size, (p.flags & ipc::kMallocPinned) ? mem->size : 0, 1, 0};
  Uncharge(s, p.uid, p.charged);
  s->usage += actual;
  accounting_.ChargeUid(p.uid, actual);

  Allocation& a = table_.Insert(std::move(*mem), p.policy, s->id, p.uid);
  ReserveIds();
  a.charge = actual;
  a.fixed_address = fixed;
  a.pool = p.pool;
  if (p.pool >= 0) ++pools_[p.pool].in_use;
  StoreMemory(a);
  s->ledger.Add(a.id);
  std::string token;
  if (p.flags & ipc::kMallocExport) {
    // Exported in the same round trip; if that fails, so does the allocation.
    auto exported = table_.Export(a.id, s->id, s->cred.uid, p.export_flags);
    if (!exported.ok()) {
      Release(*s, a.id, Holding::kLedger);
      SendError(*s, p.request_id, exported.status());
      return;
    }
    token = std::move(*exported);
    StateChanged();
  }
  MB_DEBUG("alloc", "client=%llu id=%llu size=%llu page_size=%llu pinned=%d pool=%d",
           static_cast<unsigned long long>(s->id), static_cast<unsigned long long>(a.id),
           static_cast<unsigned long long>(a.size), static_cast<unsigned long long>(a.page_size),
           a.pinned ? 1 : 0, a.pool);
  int fd = a.memory.fd.get();
  Send(*s, p.request_id,
       ipc::MallocReply{a.id, a.size, a.page_size, a.fell_back, a.pinned, a.fixed_address,
                        p.pool >= 0, std::move(token)},
       std::span<const int>(&fd, 1));
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::FreeRequest& m) {
  if (!Release(s, m.handle, Holding::kLedger)) return NotHeld(m.handle);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::ExportRequest& m) {
  if (!s.ledger.Holds(m.handle)) return NotHeld(m.handle);
  // What this client may only read, it shares onward read-only.
  const uint32_t flags = m.flags | (s.ledger.ReadOnly(m.handle) ? ipc::kExportReadOnly : 0);
  MB_ASSIGN_OR_RETURN(std::string token, table_.Export(m.handle, s.id, s.cred.uid, flags));
  StateChanged();
  return ipc::ExportReply{std::move(token)};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::SetPidRequest& m) {
  MB_RETURN_IF_ERROR(table_.SetPids(m.token, s.id, std::vector<pid_t>(m.pids.begin(), m.pids.end())));
  StateChanged();
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::ImportRequest& m) {
  MB_ASSIGN_OR_RETURN(const ExportEntry* e,
                      table_.CheckImport(m.token, Importer{s.id, s.cred.pid, s.cred.uid,
                                                           ipc::PidfdAlive(s.pidfd.get()), &s.start_time}));
  const Allocation* a = table_.Find(e->allocation);
  bool read_only = e->read_only_fd.valid();
  return SentOnSuccess(
      GrantImport(s, rid, *a, read_only ? e->read_only_fd.get() : a->memory.fd.get(), read_only, s.ledger));
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
  MB_RETURN_IF_ERROR(Charge(s, Usage{0, m.size, 0, 0}));
  s.host_regs[m.address] = m.size;
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::UnregisterHostRequest& m) {
  auto it = s.host_regs.find(m.address);
  if (it == s.host_regs.end())
    return Status(ErrorCode::kNotFound, "no host registration starts at this address");
  if (auto e = engines_.find(s.engine.name); !s.engine.name.empty() && e != engines_.end())
    for (const auto& [addr, r] : e->second.regions)
      if (r.allocation == 0 && addr >= it->first && addr < it->first + it->second)
        return Status(ErrorCode::kBusy, "transfer engine region " + std::to_string(r.id) +
                                            " lies in this range (DeregisterMem it first)");
  Uncharge(&s, s.cred.uid, Usage{0, it->second, 0, 0});
  s.host_regs.erase(it);
  return Status::Ok();
}

}  // namespace membroker::broker
