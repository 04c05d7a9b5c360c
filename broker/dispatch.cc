// Dispatch: every inbound frame is decoded (verified) here and handed to the
// Handle overload of its message type (messages.h lists them); the Answer
// it returns is sent here, so each request gets exactly one reply, or none
// for a successful one-way request. Also the handshake, and the answers to
// requests that waited in the broker (waiters.h).
#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"

namespace membroker::broker {

void Broker::HandleFrame(Session& s, ipc::Frame&& frame) {
  ++counters_.requests;
  auto decoded = ipc::Decode(frame.bytes);
  if (!decoded.ok()) {
    // A framing violation: this client alone loses its connection.
    ++counters_.protocol_errors;
    CloseSession(s, CloseReason::kProtocolViolation, decoded.status().message());
    return;
  }
  ipc::Envelope& env = *decoded;
  const uint64_t rid = env.request_id;
  if (frame.fds.size() != ipc::ExpectedFds(env.body)) {  // (its fds close in ReadFrames)
    ++counters_.protocol_errors;
    CloseSession(s, CloseReason::kProtocolViolation,
                 std::string(ipc::MessageName(env.body)) + " carried " + std::to_string(frame.fds.size()) +
                     " file descriptors, not " + std::to_string(ipc::ExpectedFds(env.body)));
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
  // A KV request naming a store an earlier broker's restart is still making
  // again waits for it (then it is handled afresh, counted once).
  if (std::optional<uint64_t> store = kv_.RestoringFor(env.body)) {
    kv_.WhenRestored(*store, [this, sid = s.id, waiting = std::make_shared<ipc::Frame>(std::move(frame))] {
      --counters_.requests;
      Session* again = sessions_.Find(sid);
      if (again != nullptr && !again->closing) HandleFrame(*again, std::move(*waiting));
    });
    return;
  }
  const bool reply_on_success = (env.flags & ipc::kFlagNoReplyOnSuccess) == 0;
  const bool first_hello = !s.hello_done && std::holds_alternative<ipc::HelloRequest>(env.body);
  // Every request has its Handle overload (a missing one does not compile);
  // a reply type sent by a client is out of protocol.
  Answer answer = std::visit(
      [&](const auto& m) -> Answer {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ipc::ReattachRequest>) {
          return Handle(s, rid, m, frame.fds);  // one of the two requests that carry fds
        } else if constexpr (std::is_same_v<T, ipc::WakeRequest>) {
          return SetWakeSocket(s, std::move(frame.fds.at(0)));  // (the count is checked above)
        } else if constexpr (ipc::kIsRequest<T>) {
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
    if (first_hello)  // a failed handshake ends the connection
      CloseAfterReply(s, answer.status.code() == ErrorCode::kResourceExhausted ? CloseReason::kRefused
                                                                              : CloseReason::kProtocolViolation);
    return;
  }
  if (answer.deferred) return;
  // OkReply is left out for requests sent without waiting (NO_REPLY_ON_SUCCESS).
  if (!std::holds_alternative<ipc::OkReply>(answer.reply) || reply_on_success)
    Send(s, rid, std::move(answer.reply));
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
    return Status(ErrorCode::kVersionMismatch, "broker speaks protocol " + std::to_string(ipc::kProtocolVersion) +
                                                   ", client speaks " + std::to_string(m.protocol_version));
  if (!m.client_name.empty())
    MB_RETURN_IF_ERROR(ipc::CheckName(m.client_name, ipc::kMaxClientNameBytes, "the client name"));
  if (sessions_.Handshaken() >= options_.max_clients) {
    admission_.CountRefusal();
    return Status(ErrorCode::kResourceExhausted, "the broker serves " + std::to_string(options_.max_clients) +
                                                     " clients already (--max-clients); try again later");
  }
  sessions_.HelloDone(s);
  s.name = m.client_name;
  if (m.features & ipc::kFeatureReattach) {
    s.reattaching = true;
    ++counters_.clients_reattached;
    MB_INFO("client_reattaching", "client=%llu pid=%d name=\"%s\"", static_cast<unsigned long long>(s.id),
            static_cast<int>(s.cred.pid), LogText(s.name).c_str());
  }
  ipc::HelloReply reply{s.id, ipc::kProtocolVersion, 0, {}, cluster_.started() ? cluster_.options().host_name : ""};
  for (auto p : {ipc::PagePolicy::kNormalOnly, ipc::PagePolicy::kHugeFirst, ipc::PagePolicy::kHugeOnly,
                 ipc::PagePolicy::kHuge1GOnly})
    reply.granularities.push_back(holdings_.backend().Granularity(p));
  return reply;
}

Answer Broker::Handle(Session&, uint64_t, const ipc::PingRequest&) { return Status::Ok(); }

// Never answered: the client is closing. Its session ends now, not when the
// last copy of its socket closes (a child it forked may hold one for long,
// and could not use the session: a connection is its opener's alone).
Answer Broker::Handle(Session& s, uint64_t, const ipc::GoodbyeRequest&) {
  s.said_goodbye = true;
  CloseSession(s, CloseReason::kClean, "said goodbye");
  return Deferred{};
}

void Broker::AnswerWaiters(Waiter::Kind kind, const std::string& key,
                           const std::function<Status(Session&, uint64_t)>& answer) {
  for (const Waiter& w : waiters_.Take(kind, key)) {
    Session* s = sessions_.Find(w.session_id);
    if (s == nullptr) continue;
    Status st = answer(*s, w.request_id);
    if (!st.ok()) SendError(*s, w.request_id, st);
  }
}

void Broker::OnWaiterTimeout(const Waiter& w) {
  Session* s = sessions_.Find(w.session_id);
  if (s == nullptr) return;
  switch (w.kind) {
    case Waiter::Kind::kConnect:
      SendError(*s, w.request_id, Status(ErrorCode::kTimeout, "no engine named \"" + w.key + "\" appeared in time"));
      break;
    case Waiter::Kind::kResolve:
      SendError(*s, w.request_id,
                Status(ErrorCode::kTimeout, "no engine named \"" + w.key + "\" appeared on any host of the cluster in time"));
      break;
    case Waiter::Kind::kLookup:
      SendError(*s, w.request_id,
                Status(ErrorCode::kTimeout, "nothing was published as \"" + w.key + "\" in time"));
      break;
    case Waiter::Kind::kClusterLookup:
      SendError(*s, w.request_id, Status(ErrorCode::kTimeout, "nothing was published as \"" + w.key +
                                                                  "\" on any host of the cluster in time"));
      break;
    case Waiter::Kind::kEvents:
      SendEvents(*s, w.request_id);  // an empty list: the wait ended
      break;
  }
}

}  // namespace membroker::broker
