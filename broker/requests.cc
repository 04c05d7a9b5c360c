// The request handlers: every inbound frame is decoded (verified) here and
// answered with exactly one reply, or none for a successful one-way request.
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/memfd.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/ranges.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kMaxHoldingsPerClient = 1u << 20;
constexpr uint64_t kHostRegisterAlign = 4096;

Status NotHeld(uint64_t handle) {
  return Status(ErrorCode::kInvalidHandle,
                "handle " + std::to_string(handle) +
                    " is not held by this client (unknown, foreign or already freed)");
}

// Creates the memory for a MallocRequest: on the loop for small sizes, on a
// worker thread for large ones.
Result<ipc::PhysicalMemory> MakeMemory(const std::string& name, uint64_t size,
                                       ipc::PagePolicy policy, uint32_t flags) {
  MB_ASSIGN_OR_RETURN(ipc::PhysicalMemory mem, ipc::CreatePhysicalMemory(name, size, policy));
  if (flags & ipc::kMallocPinned) MB_RETURN_IF_ERROR(ipc::Pin(&mem));
  return mem;
}
// Worker threads create, zero and return memory: bulk work that must not take
// a CPU from the loop thread, which serves every client. Nice 10 per thread
// (Linux threads have their own nice value) lets the loop preempt them.
void LowerWorkerPriority() {
  thread_local bool lowered = false;
  if (!lowered) {
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    lowered = true;
  }
}
}  // namespace

struct MallocWork {
  uv_work_t req{};
  Broker* broker = nullptr;
  Broker::PendingMalloc pending;
  uint64_t size = 0;
  std::string name;
  std::optional<Result<ipc::PhysicalMemory>> result;
};

// Creates `count` allocations for one pool: up to 64 MiB of them per work
// item, so refilling a pool of small allocations costs one worker wake-up and
// one completion per batch rather than per allocation.
struct RefillWork {
  static constexpr uint64_t kBatchBytes = 64ull << 20;
  uv_work_t req{};
  Broker* broker = nullptr;
  size_t pool = 0;
  uint32_t count = 0;
  std::vector<ipc::PhysicalMemory> created;
  uint32_t failures = 0;
};

// Freed allocations whose last fd (and pin) a worker closes: that returns the
// pages to the kernel, which takes milliseconds for a large allocation or for
// the thousands a crashed client may leave.
struct ReturnWork {
  uv_work_t req{};
  Broker* broker = nullptr;
  ReturnBatch batch;
};

void Broker::CloseAfterReply(Session& s) {
  if (s.outbound.empty())
    CloseSession(s, s.admitted ? CloseReason::kProtocolViolation : CloseReason::kNotAdmitted,
                 "closed after final reply");
  else
    s.close_after_flush = true;
}

void Broker::HandleFrame(Session& s, ipc::Frame frame) {
  ++counters_.requests;
  auto decoded = ipc::Decode(frame.bytes);
  if (!decoded.ok()) {
    // A framing violation: this client alone loses its connection.
    ++counters_.protocol_errors;
    ++counters_.clients_kicked;
    CloseSession(s, CloseReason::kProtocolViolation, decoded.status().message());
    return;
  }
  ipc::Envelope& env = *decoded;
  const uint64_t rid = env.request_id;
  if (!frame.fds.empty()) {  // no request carries fds; they close with `frame`
    ++counters_.protocol_errors;
    ++counters_.clients_kicked;
    CloseSession(s, CloseReason::kProtocolViolation, "a request carried file descriptors");
    return;
  }
  if (env.protocol_version != ipc::kProtocolVersion) {
    SendError(s, rid, Status(ErrorCode::kVersionMismatch,
                             "broker speaks protocol " + std::to_string(ipc::kProtocolVersion) +
                                 ", request uses " + std::to_string(env.protocol_version)));
    CloseAfterReply(s);
    return;
  }
  if (!s.hello_done && !std::holds_alternative<ipc::HelloRequest>(env.body)) {
    ++counters_.protocol_errors;
    SendError(s, rid, Status(ErrorCode::kProtocolError, "the first request must be HelloRequest"));
    CloseAfterReply(s);
    return;
  }
  const bool reply_on_success = (env.flags & ipc::kFlagNoReplyOnSuccess) == 0;
  const bool first_hello = !s.hello_done && std::holds_alternative<ipc::HelloRequest>(env.body);
  // Every request has its Handle overload (a missing one does not compile);
  // a reply type sent by a client is out of protocol.
  Answer answer = std::visit(
      [&](const auto& m) -> Answer {
        using T = std::decay_t<decltype(m)>;
        if constexpr (ipc::kIsRequest<T>) {
          return Handle(s, rid, m);
        } else {
          ++counters_.protocol_errors;
          return Status(ErrorCode::kProtocolError, std::string(ipc::MessageName(env.body)) +
                                                       " is not a request");
        }
      },
      env.body);
  if (!answer.status.ok()) {
    if (answer.status.code() == ErrorCode::kQuotaExceeded) ++counters_.quota_rejections;
    SendError(s, rid, answer.status);
    if (first_hello) CloseAfterReply(s);  // a failed handshake ends the connection
    return;
  }
  if (answer.deferred) return;
  // OkReply is left out for requests sent without waiting (NO_REPLY_ON_SUCCESS).
  if (!std::holds_alternative<ipc::OkReply>(answer.reply) || reply_on_success)
    Send(s, rid, std::move(answer.reply));
}

Answer Broker::Handle(Session&, uint64_t, const ipc::PingRequest&) { return Status::Ok(); }

Answer Broker::Handle(Session& s, uint64_t, const ipc::GoodbyeRequest&) {
  s.said_goodbye = true;
  return Deferred{};  // never answered: the client is closing
}

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
  s.hello_done = true;
  s.name = m.client_name;
  ipc::HelloReply reply{s.id, ipc::kProtocolVersion, 0, {}};
  for (auto p : {ipc::PagePolicy::kNormalOnly, ipc::PagePolicy::kHugeFirst,
                 ipc::PagePolicy::kHugeOnly, ipc::PagePolicy::kHuge1GOnly})
    reply.granularities.push_back(ipc::GranularityFor(p));
  return reply;
}

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

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::MallocRequest& m) {
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
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  // Charge the largest size the policy may produce; settled in FinishMalloc.
  uint64_t reserve = ipc::RoundUp(m.size, ipc::PreferredPageSize(m.policy, m.size));
  if (reserve == 0) return Status(ErrorCode::kParamInvalid, "size overflows");
  const bool pinned = m.flags & ipc::kMallocPinned;
  PendingMalloc p{s.id, rid, s.cred.uid, m.policy, m.flags, m.export_flags,
                  Usage{reserve, pinned ? reserve : 0, 1, 0}, -1};
  MB_RETURN_IF_ERROR(Charge(s, p.charged));

  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    if (!pool.Matches(m.size, m.policy, m.flags)) continue;
    if (pool.ready.empty()) {
      ++pool.misses;
      break;
    }
    ++pool.hits;
    ipc::PhysicalMemory mem = std::move(pool.ready.front());
    pool.ready.pop_front();
    p.pool = static_cast<int>(i);
    FinishMalloc(p, std::move(mem));
    DeferBackground();  // the refill
    return Deferred{};  // FinishMalloc answers
  }

  counters_.bytes_pending += reserve;
  std::string name = "membroker:client" + std::to_string(s.id);
  if (reserve <= options_.inline_alloc_bytes) {
    FinishMalloc(p, MakeMemory(name, m.size, m.policy, m.flags));
    return Deferred{};  // FinishMalloc answers
  }
  if (s.inflight >= options_.max_inflight_per_client) {
    counters_.bytes_pending -= reserve;
    Uncharge(&s, s.cred.uid, p.charged);
    return Status(ErrorCode::kResourceExhausted, "too many allocations in flight for this client");
  }
  auto* w = new MallocWork();
  w->req.data = w;
  w->broker = this;
  w->pending = p;
  w->size = m.size;
  w->name = std::move(name);
  ++s.inflight;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<MallocWork*>(r->data);
        w->result = MakeMemory(w->name, w->size, w->pending.policy, w->pending.flags);
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<MallocWork> w(static_cast<MallocWork*>(r->data));
        if (Session* s = w->broker->FindSession(w->pending.session_id)) --s->inflight;
        if (!w->result) w->result = Status(ErrorCode::kInternal, "allocation was cancelled");
        w->broker->FinishMalloc(w->pending, std::move(*w->result));
      });
  return Deferred{};  // FinishMalloc answers
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
  a.charge = actual;
  a.fixed_address = fixed;
  a.pool = p.pool;
  if (p.pool >= 0) ++pools_[p.pool].in_use;
  s->ledger.Add(a.id);
  std::string token;
  if (p.flags & ipc::kMallocExport) {
    // Exported in the same round trip; if that fails, so does the allocation.
    auto exported = table_.Export(a.id, s->id, s->cred.uid, p.export_flags);
    if (!exported.ok()) {
      s->ledger.Remove(a.id);
      ReleaseHolding(*s, a.id);
      SendError(*s, p.request_id, exported.status());
      return;
    }
    token = std::move(*exported);
  }
  MB_DEBUG("alloc", "client=%llu id=%llu size=%llu page_size=%llu pinned=%d pool=%d",
           static_cast<unsigned long long>(s->id), static_cast<unsigned long long>(a.id),
           static_cast<unsigned long long>(a.size), static_cast<unsigned long long>(a.page_size),
           a.pinned ? 1 : 0, a.pool);
  int fd = a.fd.get();
  Send(*s, p.request_id,
       ipc::MallocReply{a.id, a.size, a.page_size, a.fell_back, a.pinned, a.fixed_address,
                        p.pool >= 0, std::move(token)},
       std::span<const int>(&fd, 1));
}

void Broker::ReleaseHolding(Session& s, uint64_t id, bool engine_import) {
  Allocation* a = table_.Find(id);
  if (a == nullptr) return;
  if (a->creator == s.id && !engine_import)
    s.usage -= a->charge;  // the uid stays charged while the allocation lives
  else
    Uncharge(&s, s.cred.uid, Usage{0, 0, 0, 1});  // an import
  DropReference(id);
}

void Broker::DropReference(uint64_t id) {
  std::optional<Allocation> gone = table_.DropHolder(id);
  if (!gone) return;
  MB_DEBUG("free", "id=%llu size=%llu", static_cast<unsigned long long>(id),
           static_cast<unsigned long long>(gone->size));
  accounting_.ReleaseUid(gone->creator_uid, gone->charge);
  if (gone->fixed_address) window_.Free(gone->fixed_address);
  if (gone->pool >= 0) --pools_[gone->pool].in_use;
  // Its memory goes back to the kernel here; never to another tenant (pool.h).
  // Closing the last fd of 4 KiB pages frees them one by one: for a large
  // allocation, or for everything a closing session held, a worker does it so
  // the loop keeps serving. Huge pages are few and quick to free, and go back
  // at once, so a client that frees one may allocate it again at once.
  if (gone->page_size != ipc::kNormalPageSize) return;
  if (return_batch_ != nullptr) {
    return_batch_->Add(std::move(*gone));
  } else if (gone->size > options_.inline_alloc_bytes) {
    deferred_returns_.Add(std::move(*gone));
    DeferBackground();
  }
}

void Broker::DeferBackground() {
  const uint64_t delay = options_.background_delay_ms;
  if (delay == 0 || stopping_) {
    RunBackground();
    return;
  }
  const uint64_t now = uv_now(&loop_);
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&background_timer_)))
    background_deadline_ = now + 10 * delay;
  const uint64_t left = background_deadline_ > now ? background_deadline_ - now : 0;
  uv_timer_start(
      &background_timer_, [](uv_timer_t* t) { static_cast<Broker*>(t->data)->RunBackground(); },
      std::min(left, delay), 0);
}

void Broker::RunBackground() {
  uv_timer_stop(&background_timer_);
  for (size_t i = 0; i < pools_.size(); ++i) RefillPool(i);
  if (!deferred_returns_.fds.empty()) {
    ReturnOnWorker(std::exchange(deferred_returns_, ReturnBatch{}));
  }
}

void Broker::ReturnOnWorker(ReturnBatch batch) {
  auto* w = new ReturnWork();
  w->req.data = w;
  w->broker = this;
  w->batch = std::move(batch);
  counters_.bytes_returning += w->batch.bytes;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<ReturnWork*>(r->data);
        w->batch.locks.clear();
        w->batch.fds.clear();
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<ReturnWork> w(static_cast<ReturnWork*>(r->data));
        w->broker->counters_.bytes_returning -= w->batch.bytes;
      });
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::FreeRequest& m) {
  if (!s.ledger.Remove(m.handle)) return NotHeld(m.handle);
  ReleaseHolding(s, m.handle);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::ExportRequest& m) {
  if (!s.ledger.Holds(m.handle)) return NotHeld(m.handle);
  MB_ASSIGN_OR_RETURN(std::string token, table_.Export(m.handle, s.id, s.cred.uid, m.flags));
  return ipc::ExportReply{std::move(token)};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::SetPidRequest& m) {
  return table_.SetPids(m.token, s.id, std::vector<pid_t>(m.pids.begin(), m.pids.end()));
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::ImportRequest& m) {
  MB_ASSIGN_OR_RETURN(const ExportEntry* e,
                      table_.CheckImport(m.token, Importer{s.id, s.cred.pid, s.cred.uid,
                                                           ipc::PidfdAlive(s.pidfd.get())}));
  const Allocation* a = table_.Find(e->allocation);
  bool read_only = e->read_only_fd.valid();
  return SentOnSuccess(
      GrantImport(s, rid, *a, read_only ? e->read_only_fd.get() : a->fd.get(), read_only, s.ledger));
}

Status Broker::GrantImport(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only,
                           Ledger& into) {
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
  Send(s, rid, ipc::ImportReply{a.id, a.size, a.page_size, read_only, a.pinned, a.fixed_address},
       std::span<const int>(&fd, 1));
  return Status::Ok();
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
  if (auto e = engines_.find(s.engine); !s.engine.empty() && e != engines_.end())
    for (const auto& [addr, r] : e->second.regions)
      if (r.allocation == 0 && addr >= it->first && addr < it->first + it->second)
        return Status(ErrorCode::kBusy, "transfer engine region " + std::to_string(r.id) +
                                            " lies in this range (DeregisterMem it first)");
  Uncharge(&s, s.cred.uid, Usage{0, it->second, 0, 0});
  s.host_regs.erase(it);
  return Status::Ok();
}

void Broker::FillPools() {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    while (pool.ready.size() < pool.spec.count) {
      auto mem = ipc::CreatePhysicalMemory("membroker:pool", pool.spec.size, pool.spec.policy);
      if (!mem.ok()) {
        ++pool.refill_failures;
        MB_WARN("pool_fill_failed", "pool=%zu size=%llu filled=%zu capacity=%u error=\"%s\"", i,
                static_cast<unsigned long long>(pool.spec.size), pool.ready.size(), pool.spec.count,
                mem.status().ToString().c_str());
        break;
      }
      pool.ready.push_back(std::move(*mem));
    }
  }
}

void Broker::RefillPool(size_t index) {
  Pool& pool = pools_[index];
  while (!stopping_ && pool.NeedsRefill()) {
    auto* w = new RefillWork();
    w->req.data = w;
    w->broker = this;
    w->pool = index;
    const uint64_t needed = pool.spec.count - pool.ready.size() - pool.refilling;
    w->count = static_cast<uint32_t>(
        std::clamp<uint64_t>(RefillWork::kBatchBytes / pool.spec.size, 1, needed));
    pool.refilling += w->count;
    uv_queue_work(
        &loop_, &w->req,
        [](uv_work_t* r) {
          LowerWorkerPriority();
          auto* w = static_cast<RefillWork*>(r->data);
          const PoolSpec& spec = w->broker->pools_[w->pool].spec;
          for (uint32_t i = 0; i < w->count; ++i) {
            auto mem = ipc::CreatePhysicalMemory("membroker:pool", spec.size, spec.policy);
            if (!mem.ok()) {
              w->failures = w->count - i;
              break;
            }
            w->created.push_back(std::move(*mem));
          }
        },
        [](uv_work_t* r, int) {
          std::unique_ptr<RefillWork> w(static_cast<RefillWork*>(r->data));
          Pool& pool = w->broker->pools_[w->pool];
          pool.refilling -= w->count;
          pool.refill_failures += w->failures;  // retried on the next refill
          if (w->broker->stopping_) return;
          pool.refills += w->created.size();
          for (auto& mem : w->created) pool.ready.push_back(std::move(mem));
        });
  }
}

}  // namespace membroker::broker
