// Accepting a connection: its identity from the kernel, the uid/gid policy,
// a Session filed in Sessions, and the handshake deadline (Admission's timer):
// connections that never say hello are closed after --handshake-timeout-ms
// and have a cap of their own, so they cannot lock real clients out.
#include <unistd.h>

#include <algorithm>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/pidfd.h"
#include "uv_status.h"

namespace membroker::broker {

// One connection per turn of the loop (the listening socket's poll is
// level-triggered, so the next turn takes the next one): a burst of connects
// waits its turn with the sessions already served, and a lone connect costs
// no accept4 that finds nothing.
void Broker::Accept() {
  for (;;) {
    ipc::UniqueFd conn = admission_.AcceptOne();
    if (!conn.valid()) return;
    // Clients past their handshake are capped at --max-clients (at Hello);
    // as many more may be waiting for theirs. When that many wait, the one
    // waiting longest makes room: silent connections cannot lock out a
    // client that says hello at once.
    if (sessions_.Handshaking() >= options_.max_clients) {
      admission_.CountRefusal();
      CloseSession(*sessions_.OldestHandshaking(), CloseReason::kHandshakeTimeout,
                   "no hello yet, and " + std::to_string(options_.max_clients) +
                       " connections were waiting for theirs: closed to make room");
    }
    auto cred = ipc::GetPeerCred(conn.get());
    if (!cred.ok()) continue;
    if (cred->pid == 0) {
      // The kernel reports 0 for a process the broker's PID namespace cannot
      // see (a client in a sibling container): the broker could not follow its
      // process, so it is told why instead of being dropped.
      admission_.Refuse(
          std::move(conn), "pid_not_visible",
          Status(ErrorCode::kPermissionDenied,
                 "the client's process is not visible in the broker's PID namespace (its pid reads 0 here): "
                 "run the broker in the clients' PID namespace or an ancestor of it (docs/OPERATIONS.md, "
                 "containers)"));
      continue;
    }
    auto pidfd = ipc::PidfdOpenIfSupported(cred->pid);
    if (!pidfd.ok()) {
      if (pidfd.code() == ErrorCode::kResourceExhausted)  // EMFILE: we cannot follow its process
        admission_.Refuse(std::move(conn), "out_of_fds", OutOfFds(EMFILE));
      continue;  // otherwise it exited already
    }
    auto* s = new Session();
    s->fd = std::move(conn);
    s->cred = *cred;
    s->pidfd = std::move(*pidfd);
    s->admitted = Admits(s->cred, s->fd.get());
    s->connected_since = std::chrono::system_clock::now();
    s->accepted_ms = uv_now(&loop_);
    // A session that cannot be polled would never be served nor closed: it
    // is refused instead.
    if (Status st = UvStatus("uv_poll_init", uv_poll_init(&loop_, &s->poll, s->fd.get())); !st.ok()) {
      admission_.Refuse(std::move(s->fd), "poll_failed", st);
      delete s;
      continue;
    }
    s->poll.data = s;
    sessions_.Add(s);
    MB_INFO("connect", "client=%llu pid=%d uid=%u gid=%u admitted=%s", static_cast<unsigned long long>(s->id),
            static_cast<int>(s->cred.pid), s->cred.uid, s->cred.gid, s->admitted ? "yes" : "no");
    ++counters_.clients_total;
    if (Status st =
            UvStatus("uv_poll_start", uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, &Broker::OnSessionEvent));
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

void Broker::ArmHandshakeTimer() {
  const Session* oldest = sessions_.OldestHandshaking();
  if (oldest == nullptr) return;
  const uint64_t now = uv_now(&loop_), due = oldest->accepted_ms + options_.handshake_timeout_ms;
  admission_.ArmHandshakeTimer(due > now ? due - now : 0);
}

void Broker::CloseSilentSessions() {
  const uint64_t now = uv_now(&loop_);
  while (Session* s = sessions_.OldestHandshaking()) {
    if (now - s->accepted_ms < options_.handshake_timeout_ms) break;  // the rest came later
    CloseSession(*s, CloseReason::kHandshakeTimeout,
                 "no hello within " + std::to_string(options_.handshake_timeout_ms) + " ms");
  }
  ArmHandshakeTimer();
}

}  // namespace membroker::broker
