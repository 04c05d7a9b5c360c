// The request handlers: every inbound frame is decoded (verified) here and
// answered with exactly one reply, or none for a successful one-way request.
#include <uv.h>

#include <optional>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/memfd.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kMaxHoldingsPerClient = 1u << 20;

Status NotHeld(uint64_t handle) {
  return Status(ErrorCode::kInvalidHandle,
                "handle " + std::to_string(handle) +
                    " is not held by this client (unknown, foreign or already freed)");
}
}  // namespace

struct MallocWork {
  uv_work_t req{};
  Broker* broker = nullptr;
  uint64_t session_id = 0;
  uint64_t request_id = 0;
  uint64_t size = 0;
  uint64_t reserved = 0;
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  std::string name;
  std::optional<Result<ipc::PhysicalMemory>> result;
};

void Broker::CloseAfterReply(Session& s) {
  if (s.outbound.empty())
    CloseSession(s, "closed after final reply");
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
    CloseSession(s, decoded.status().message().c_str());
    return;
  }
  ipc::Envelope& env = *decoded;
  const uint64_t rid = env.request_id;
  if (!frame.fds.empty()) {  // no request carries fds; they close with `frame`
    ++counters_.protocol_errors;
    ++counters_.clients_kicked;
    CloseSession(s, "a request carried file descriptors");
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
  Status st;
  bool replied = false;  // handlers that send their own success reply set this
  if (auto* m = std::get_if<ipc::HelloRequest>(&env.body)) {
    const bool first = !s.hello_done;
    st = HandleHello(s, rid, *m);
    replied = st.ok();
    if (!st.ok() && first) {  // a failed handshake ends the connection
      SendError(s, rid, st);
      CloseAfterReply(s);
      return;
    }
  } else if (auto* m = std::get_if<ipc::MallocRequest>(&env.body)) {
    st = HandleMalloc(s, rid, *m);
    replied = true;
  } else if (auto* m = std::get_if<ipc::FreeRequest>(&env.body)) {
    st = HandleFree(s, *m);
  } else if (auto* m = std::get_if<ipc::ExportRequest>(&env.body)) {
    st = HandleExport(s, rid, *m);
    replied = true;
  } else if (auto* m = std::get_if<ipc::SetPidRequest>(&env.body)) {
    st = HandleSetPid(s, rid, *m);
  } else if (auto* m = std::get_if<ipc::ImportRequest>(&env.body)) {
    st = HandleImport(s, rid, *m);
    replied = true;
  } else if (std::holds_alternative<ipc::PingRequest>(env.body)) {
    st = Status::Ok();
  } else if (std::holds_alternative<ipc::GoodbyeRequest>(env.body)) {
    s.said_goodbye = true;
    return;  // never answered: the client is closing
  } else {
    ++counters_.protocol_errors;
    st = Status(ErrorCode::kProtocolError,
                std::string(ipc::MessageName(env.body)) + " is not a request");
  }
  if (!st.ok()) {
    SendError(s, rid, st);
  } else if (!replied && reply_on_success) {
    Send(s, rid, ipc::OkReply{});
  }
}

Status Broker::HandleHello(Session& s, uint64_t rid, const ipc::HelloRequest& m) {
  if (s.hello_done) return Status(ErrorCode::kProtocolError, "handshake already done");
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
  Send(s, rid, std::move(reply));
  return Status::Ok();
}

Status Broker::HandleMalloc(Session& s, uint64_t rid, const ipc::MallocRequest& m) {
  if (m.size == 0) return Status(ErrorCode::kParamInvalid, "size must not be zero");
  if (m.size > ipc::kMaxAllocationBytes)
    return Status(ErrorCode::kParamInvalid,
                  "size " + std::to_string(m.size) + " exceeds the per-allocation limit");
  if (m.flags != 0)
    return Status(ErrorCode::kParamInvalid, "unknown malloc flags " + std::to_string(m.flags));
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  // Budget the largest page size the policy may use.
  uint64_t page = m.policy == ipc::PagePolicy::kHugeFirst && m.size > ipc::kHugeFirstThreshold
                      ? ipc::kHuge2MPageSize
                      : ipc::GranularityFor(m.policy).minimum;
  uint64_t reserve = ipc::RoundUp(m.size, page);
  uint64_t in_use = table_.counters().bytes_live + counters_.bytes_pending;
  if (reserve == 0 || reserve > options_.max_bytes - std::min(in_use, options_.max_bytes))
    return Status(ErrorCode::kResourceExhausted,
                  "allocating " + std::to_string(m.size) + " bytes would pass the broker's budget (" +
                      std::to_string(in_use) + " of " + std::to_string(options_.max_bytes) +
                      " bytes in use; see --max-bytes)");
  counters_.bytes_pending += reserve;
  std::string name = "membroker:client" + std::to_string(s.id);
  if (m.size <= options_.inline_alloc_bytes) {
    FinishMalloc(s.id, rid, m.policy, reserve, ipc::CreatePhysicalMemory(name, m.size, m.policy));
    return Status::Ok();
  }
  if (s.inflight >= options_.max_inflight_per_client) {
    counters_.bytes_pending -= reserve;
    return Status(ErrorCode::kResourceExhausted, "too many allocations in flight for this client");
  }
  auto* w = new MallocWork();
  w->req.data = w;
  w->broker = this;
  w->session_id = s.id;
  w->request_id = rid;
  w->size = m.size;
  w->reserved = reserve;
  w->policy = m.policy;
  w->name = std::move(name);
  ++s.inflight;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<MallocWork*>(r->data);
        w->result = ipc::CreatePhysicalMemory(w->name, w->size, w->policy);
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<MallocWork> w(static_cast<MallocWork*>(r->data));
        if (Session* s = w->broker->FindSession(w->session_id)) --s->inflight;
        if (!w->result) w->result = Status(ErrorCode::kInternal, "allocation was cancelled");
        w->broker->FinishMalloc(w->session_id, w->request_id, w->policy, w->reserved,
                                std::move(*w->result));
      });
  return Status::Ok();
}

void Broker::FinishMalloc(uint64_t session_id, uint64_t rid, ipc::PagePolicy policy,
                          uint64_t reserved, Result<ipc::PhysicalMemory> mem) {
  counters_.bytes_pending -= reserved;
  Session* s = FindSession(session_id);
  if (s == nullptr) return;  // the client left meanwhile: the memory closes here
  if (!mem.ok()) {
    SendError(*s, rid, mem.status());
    return;
  }
  Allocation& a = table_.Insert(std::move(*mem), policy, s->id);
  s->ledger.Add(a.id);
  int fd = a.fd.get();
  Send(*s, rid, ipc::MallocReply{a.id, a.size, a.page_size}, std::span<const int>(&fd, 1));
}

Status Broker::HandleFree(Session& s, const ipc::FreeRequest& m) {
  if (!s.ledger.Remove(m.handle)) return NotHeld(m.handle);
  table_.DropHolder(m.handle);
  return Status::Ok();
}

Status Broker::HandleExport(Session& s, uint64_t rid, const ipc::ExportRequest& m) {
  if (!s.ledger.Holds(m.handle)) return NotHeld(m.handle);
  MB_ASSIGN_OR_RETURN(std::string token, table_.Export(m.handle, s.id, s.cred.uid, m.flags));
  Send(s, rid, ipc::ExportReply{std::move(token)});
  return Status::Ok();
}

Status Broker::HandleSetPid(Session& s, uint64_t, const ipc::SetPidRequest& m) {
  return table_.SetPids(m.token, s.id, std::vector<pid_t>(m.pids.begin(), m.pids.end()));
}

Status Broker::HandleImport(Session& s, uint64_t rid, const ipc::ImportRequest& m) {
  MB_ASSIGN_OR_RETURN(const ExportEntry* e,
                      table_.CheckImport(m.token, Importer{s.id, s.cred.pid, s.cred.uid}));
  if (s.ledger.Holds(e->allocation))
    return Status(ErrorCode::kAlreadyExists, "this client already holds allocation " +
                                                 std::to_string(e->allocation) +
                                                 " (import it once and share the handle)");
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Status(ErrorCode::kResourceExhausted, "this client holds too many allocations");
  const Allocation* a = table_.Find(e->allocation);
  s.ledger.Add(a->id);
  table_.AddHolder(a->id);
  table_.CountImport();
  bool read_only = e->read_only_fd.valid();
  int fd = read_only ? e->read_only_fd.get() : a->fd.get();
  Send(s, rid, ipc::ImportReply{a->id, a->size, a->page_size, read_only},
       std::span<const int>(&fd, 1));
  return Status::Ok();
}

}  // namespace membroker::broker
