// Sessions: accepting a connection (identity from the kernel, admission),
// reading its frames (a bounded number per turn of the loop), sending replies
// (queued while the socket is full; a client that does not read is dropped)
// and the closes that are not the session's end itself (session_end.cc).
#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
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

// One connection per turn of the loop (the listening socket's poll is
// level-triggered, so the next turn takes the next one): a burst of connects
// waits its turn with the sessions already served, and a lone connect costs
// no accept4 that finds nothing.
void Broker::Accept() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE) {
        if (RefuseForLackOfFds(err)) continue;  // one refused; more may wait
        return;
      }
      LogRefusal("accept_failed", std::strerror(err));
      return;
    }
    ipc::UniqueFd conn(fd);
    // Clients past their handshake are capped at --max-clients (at Hello);
    // as many more may be waiting for theirs. When that many wait, the one
    // waiting longest makes room: silent connections cannot lock out a
    // client that says hello at once.
    if (Handshaking() >= options_.max_clients) EvictOldestHandshaking();
    auto cred = ipc::GetPeerCred(conn.get());
    if (!cred.ok()) continue;
    auto pidfd = ipc::PidfdOpenIfSupported(cred->pid);
    if (!pidfd.ok()) {
      if (pidfd.code() == ErrorCode::kResourceExhausted)  // EMFILE: we cannot follow its process
        Refuse(std::move(conn), "out_of_fds", OutOfFds(EMFILE));
      continue;  // otherwise it exited already
    }
    auto* s = new Session();
    s->id = next_session_id_++;
    s->fd = std::move(conn);
    s->cred = *cred;
    s->pidfd = std::move(*pidfd);
    s->admitted = Admits(s->cred, s->fd.get());
    MB_INFO("connect", "client=%llu pid=%d uid=%u gid=%u admitted=%s",
            static_cast<unsigned long long>(s->id), static_cast<int>(s->cred.pid), s->cred.uid,
            s->cred.gid, s->admitted ? "yes" : "no");
    s->connected_since = std::chrono::system_clock::now();
    s->accepted_ms = uv_now(&loop_);
    // A session that cannot be polled would never be served nor closed: it
    // is refused instead.
    if (Status st = UvStatus("uv_poll_init", uv_poll_init(&loop_, &s->poll, s->fd.get())); !st.ok()) {
      Refuse(std::move(s->fd), "poll_failed", st);
      delete s;
      continue;
    }
    s->poll.data = s;
    sessions_[s->id] = s;
    handshaking_.insert(s->id);
    ++counters_.clients_total;
    if (Status st = UvStatus("uv_poll_start", uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT,
                                                            &Broker::OnSessionEvent));
        !st.ok()) {
      CloseSession(*s, CloseReason::kIoError, st.message());
      continue;
    }
    ArmHandshakeTimer();
    // A client sends its hello right after connect, so it is usually here
    // already: answered now, not after another turn of the loop.
    ReadFrames(*s);
    return;
  }
}

bool Broker::Admits(const ipc::PeerCred& c, int fd) const {
  if (c.uid == 0 || c.uid == ::geteuid()) return true;
  const auto& uids = options_.allow_uids;
  if (std::find(uids.begin(), uids.end(), c.uid) != uids.end()) return true;
  const auto& gids = options_.allow_gids;
  if (gids.empty()) return false;
  if (std::find(gids.begin(), gids.end(), c.gid) != gids.end()) return true;
  // The supplementary groups (a system call) only when they can decide.
  auto groups = ipc::GetPeerGroups(fd);
  if (!groups.ok()) return false;
  for (gid_t g : *groups)
    if (std::find(gids.begin(), gids.end(), g) != gids.end()) return true;
  return false;
}

Session* Broker::FindSession(uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() || it->second->closing ? nullptr : it->second;
}

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
      self->CloseSession(*s, CloseReason::kPeerClosed, std::string("socket error: ") + uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) self->Flush(*s);
  if (!s->closing && (events & (UV_READABLE | UV_DISCONNECT))) self->ReadFrames(*s);
}

void Broker::ReadFrames(Session& s) {
  ipc::Frame frame;
  for (int i = 0; i < kFramesPerTurn && !s.closing; ++i) {
    bool would_block = false;
    Status st = ipc::RecvFrame(s.fd.get(), &frame, &would_block);
    if (would_block) return;
    if (!st.ok()) {
      if (st.code() == ErrorCode::kProtocolError) {
        ++counters_.protocol_errors;
        CloseSession(s, CloseReason::kProtocolViolation, st.message());
      } else {
        CloseSession(s, st.code() == ErrorCode::kNotConnected ? CloseReason::kPeerClosed
                                                              : CloseReason::kIoError,
                     st.message());
      }
      return;
    }
    const uint64_t sent_before = s.frames_sent;
    HandleFrame(s, std::move(frame));
    if (s.frames_sent != sent_before) return;  // answered: the turn ends (level-triggered poll comes back)
  }
}

void Broker::Send(Session& s, uint64_t request_id, ipc::Message body,
                  std::span<const int> fds) {
  if (s.closing) return;
  ++s.frames_sent;
  ipc::Envelope env{ipc::kProtocolVersion, request_id, 0, std::move(body)};
  std::vector<uint8_t> bytes = ipc::Encode(env);
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
  if (outbound_bytes_ + bytes.size() > options_.max_outbound_total_bytes) {
    CloseSession(s, CloseReason::kSlowReader,
                 std::to_string(outbound_bytes_) +
                     " bytes of replies wait for slow readers in all (--max-outbound-total)");
    return;
  }
  // Queued: the frame needs its own fds, since the originals may close first.
  OutFrame out{std::move(bytes), {}};
  for (int fd : fds) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      CloseSession(s, CloseReason::kIoError, "cannot duplicate an fd for a queued reply");
      return;
    }
    out.fds.emplace_back(copy);
  }
  s.outbound_bytes += out.bytes.size();
  outbound_bytes_ += out.bytes.size();
  s.outbound.push_back(std::move(out));
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
    s.outbound_bytes -= out.bytes.size();
    outbound_bytes_ -= out.bytes.size();
    s.outbound.pop_front();
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
  Session* s = FindSession(id);
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
  Session* s = FindSession(session_id);
  if (s == nullptr || ipc::PidfdAlive(s->pidfd.get())) return false;
  // Its last requests (a Goodbye, say) are already there: serve them, so it
  // closes for the right reason. Bounded: a child it forked may still hold
  // the socket open, so its end may never come.
  for (int i = 0; i < 64 && !s->closing; ++i) ReadFrames(*s);
  if (!s->closing) CloseSession(*s, CloseReason::kPeerClosed, "its process has exited");
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
