// Dispatch: every inbound frame is decoded (verified) here and handed to the
// Handle overload of its message type (messages.h lists them); the Answer
// it returns is sent here, so each request gets exactly one reply, or none
// for a successful one-way request.
#include "broker.h"
#include "log.h"

namespace membroker::broker {

void Broker::HandleFrame(Session& s, ipc::Frame frame) {
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
  if (frame.fds.size() != ipc::ExpectedFds(env.body)) {  // the fds close with `frame`
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
  const bool reply_on_success = (env.flags & ipc::kFlagNoReplyOnSuccess) == 0;
  const bool first_hello = !s.hello_done && std::holds_alternative<ipc::HelloRequest>(env.body);
  // Every request has its Handle overload (a missing one does not compile);
  // a reply type sent by a client is out of protocol.
  request_fds_ = &frame.fds;
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
  request_fds_ = nullptr;
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

Answer Broker::Handle(Session&, uint64_t, const ipc::PingRequest&) { return Status::Ok(); }

Answer Broker::Handle(Session& s, uint64_t, const ipc::GoodbyeRequest&) {
  s.said_goodbye = true;
  return Deferred{};  // never answered: the client is closing
}

}  // namespace membroker::broker
