// A session's socket: reading its frames (a bounded number per turn of the
// loop), sending replies (queued while the socket is full; a client that does
// not read is dropped) and the closes that are not the session's end itself
// (session_end.cc).
#include <fcntl.h>
#include <sys/socket.h>

#include <cstring>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/pidfd.h"
#include "uv_status.h"

namespace membroker::broker {

namespace {
// Fairness: a session's turn in the loop ends with the first request that was
// answered, so a client that sends its next request the moment its reply
// arrives waits for the others' turns like everyone else, instead of being
// served again and again in one wakeup. Requests answered only on failure
// (NO_REPLY_ON_SUCCESS frees) do not end the turn, up to this many per turn.
constexpr int kFramesPerTurn = 64;
}  // namespace

void Broker::OnSessionEvent(uv_poll_t* h, int status, int events) {
  auto* self = static_cast<Broker*>(h->loop->data);
  auto* s = static_cast<Session*>(h->data);
  if (s->closing) return;
  if (status < 0) {
    // libuv reports a socket error (EPOLLERR: the peer reset the connection,
    // closing with replies unread) as UV_EBADF. What is left to read says
    // what happened: a goodbye, or the peer's end (a crash if it said none).
    self->ReadFrames(*s);
    if (!s->closing)
      self->CloseSession(*s, PeerEnded(*s), std::string("socket error: ") + uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) self->Flush(*s);
  if (!s->closing && (events & (UV_READABLE | UV_DISCONNECT))) self->ReadFrames(*s);
}

void Broker::ReadFrames(Session& s) {
  // The loop thread's receive buffer, kept from frame to frame: a request
  // costs no allocation. (A nested ReadFrames, from a handler that reaps a
  // session, finds it taken and makes its own.)
  thread_local std::vector<uint8_t> spare_bytes;
  ipc::Frame frame;
  frame.bytes.swap(spare_bytes);
  for (int i = 0; i < kFramesPerTurn && !s.closing; ++i) {
    bool would_block = false;
    Status st = ipc::RecvFrame(s.fd.get(), &frame, &would_block);
    if (would_block) break;
    if (!st.ok()) {
      if (st.code() == ErrorCode::kProtocolError) {
        ++counters_.protocol_errors;
        CloseSession(s, CloseReason::kProtocolViolation, st.message());
      } else {
        CloseSession(s, st.code() == ErrorCode::kNotConnected ? PeerEnded(s) : CloseReason::kIoError, st.message());
      }
      break;
    }
    const uint64_t sent_before = s.frames_sent;
    HandleFrame(s, std::move(frame));
    frame.fds.clear();                        // the fds the request did not keep close now
    if (s.frames_sent != sent_before) break;  // answered: the turn ends (level-triggered poll comes back)
  }
  spare_bytes.swap(frame.bytes);
}

void Broker::Send(Session& s, uint64_t request_id, ipc::Message body,
                  std::span<const int> fds) {
  if (s.closing) return;
  ++s.frames_sent;
  const std::span<const uint8_t> bytes = encoder_(request_id, 0, body);  // (the encoder's until its next use)
  if (s.outbound.empty()) {
    bool would_block = false;
    Status st = ipc::SendFrame(s.fd.get(), bytes, fds, &would_block);
    if (st.ok()) return;
    if (!would_block) {
      CloseSession(s, CloseReason::kIoError, st.message());
      return;
    }
  }
  // A client that does not read is dropped before its replies cost the
  // broker unbounded memory: capped in frames, in bytes, and for all slow
  // readers together.
  if (s.outbound.size() >= options_.max_outbound_frames) {
    CloseSession(s, CloseReason::kSlowReader, "outbound queue full");
    return;
  }
  if (s.outbound_bytes + bytes.size() > options_.max_outbound_bytes) {
    CloseSession(s, CloseReason::kSlowReader,
                 std::to_string(s.outbound_bytes) + " bytes of replies unread (--max-outbound-bytes)");
    return;
  }
  if (sessions_.queued_bytes() + bytes.size() > options_.max_outbound_total_bytes) {
    CloseSession(s, CloseReason::kSlowReader,
                 std::to_string(sessions_.queued_bytes()) +
                     " bytes of replies wait for slow readers in all (--max-outbound-total)");
    return;
  }
  // Queued: the frame needs its own fds, since the originals may close first.
  OutFrame out{{bytes.begin(), bytes.end()}, {}};
  for (int fd : fds) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      CloseSession(s, CloseReason::kIoError, "cannot duplicate an fd for a queued reply");
      return;
    }
    out.fds.emplace_back(copy);
  }
  sessions_.Queued(s, std::move(out));
  if (!s.polling_writable) {
    s.polling_writable = true;
    if (Status st = UvStatus("uv_poll_start", uv_poll_start(&s.poll, UV_READABLE | UV_WRITABLE | UV_DISCONNECT,
                                                            &Broker::OnSessionEvent));
        !st.ok())
      CloseSession(s, CloseReason::kIoError, st.message());
  }
}

void Broker::SendError(Session& s, uint64_t request_id, const Status& st) {
  ++counters_.errors_sent;
  MB_INFO("request_refused", "client=%llu request=%llu code=%s message=\"%s\"",
          static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(request_id),
          std::string(ErrorCodeName(st.code())).c_str(), LogText(st.message()).c_str());
  Send(s, request_id, ipc::ErrorReply{st.code(), st.message()});
}

void Broker::Flush(Session& s) {
  while (!s.outbound.empty()) {
    OutFrame& out = s.outbound.front();
    std::vector<int> raw;
    for (auto& f : out.fds) raw.push_back(f.get());
    bool would_block = false;
    Status st = ipc::SendFrame(s.fd.get(), out.bytes, raw, &would_block);
    if (would_block) return;
    if (!st.ok()) {
      CloseSession(s, CloseReason::kIoError, st.message());
      return;
    }
    sessions_.Dequeued(s);
  }
  if (s.close_after_flush) {
    CloseAfterReply(s, s.close_reason);  // the queue is empty now: it closes
    return;
  }
  s.polling_writable = false;
  if (Status st = UvStatus("uv_poll_start",
                           uv_poll_start(&s.poll, UV_READABLE | UV_DISCONNECT, &Broker::OnSessionEvent));
      !st.ok())
    CloseSession(s, CloseReason::kIoError, st.message());
}

Status Broker::KickClient(uint64_t id) {
  Session* s = sessions_.Find(id);
  if (s == nullptr) return Status(ErrorCode::kNotFound, "no client " + std::to_string(id));
  // Said before closing, so the client does not reattach on its own.
  const std::vector<uint8_t> why = ipc::Encode(
      {ipc::kProtocolVersion, 0, 0,
       ipc::ErrorReply{ErrorCode::kPermissionDenied, "disconnected by the operator (membrokerctl kick)"}});
  (void)ipc::SendFrame(s->fd.get(), why, {});
  CloseSession(*s, CloseReason::kKicked, "by the admin socket");
  return Status::Ok();
}

bool Broker::ReapIfExited(uint64_t session_id) {
  Session* s = sessions_.Find(session_id);
  if (s == nullptr || ipc::PidfdAlive(s->pidfd.get())) return false;
  // Its last requests (a Goodbye, say) are already there: serve them, so it
  // closes for the right reason. Bounded: a child it forked may still hold
  // the socket open, so its end may never come.
  for (int i = 0; i < 64 && !s->closing; ++i) ReadFrames(*s);
  if (!s->closing) CloseSession(*s, PeerEnded(*s), "its process has exited");
  return true;
}

void Broker::CloseAfterReply(Session& s, CloseReason reason) {
  if (!s.admitted) reason = CloseReason::kNotAdmitted;
  if (s.outbound.empty()) {
    CloseSession(s, reason, "closed after final reply");
  } else {
    s.close_after_flush = true;
    s.close_reason = reason;
  }
}

}  // namespace membroker::broker
