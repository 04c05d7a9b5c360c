#include "broker.h"

#include <signal.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/un.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "log.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/syscall.h"

#include <algorithm>

namespace membroker::broker {

namespace {
constexpr int kListenBacklog = 512;
// Frames read from one client per wakeup, so one busy client cannot starve others.
constexpr int kFramesPerWakeup = 64;

uint64_t RamBytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 8ull << 30;
  return static_cast<uint64_t>(si.totalram) * si.mem_unit;
}
}  // namespace

Result<gid_t> ResolveGroup(const std::string& name) {
  char* end = nullptr;
  unsigned long n = std::strtoul(name.c_str(), &end, 10);
  if (!name.empty() && *end == '\0') return static_cast<gid_t>(n);
  group grp{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return Status(ErrorCode::kParamInvalid, "unknown group '" + name + "' (--socket-group)");
  return found->gr_gid;
}

Status PrepareSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status(ErrorCode::kParamInvalid, "socket path is empty or too long: '" + path + "'");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ipc::ErrnoStatus("lstat", path, errno);
  }
  if (!S_ISSOCK(st.st_mode))
    return Status(ErrorCode::kAlreadyExists, path + " exists and is not a socket; not touching it");
  // Something is there: is a broker accepting on it?
  for (int type : {SOCK_SEQPACKET, SOCK_STREAM}) {
    ipc::UniqueFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    if (!probe) return ipc::ErrnoStatus("socket", "AF_UNIX", errno);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      return Status(ErrorCode::kAlreadyExists,
                    "another broker is serving " + path + "; refusing to start");
    if (errno == EPROTOTYPE) continue;  // a socket of the other type: try that
    if (errno != ECONNREFUSED) return ipc::ErrnoStatus("connect", path, errno);
    break;
  }
  // Nobody accepting: a stale socket from a dead broker.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ipc::ErrnoStatus("unlink", path, errno);
  MB_INFO("stale_socket_removed", "path=\"%s\"", LogText(path).c_str());
  return Status::Ok();
}

Broker::Broker(Options options)
    : options_(std::move(options)), window_(options_.va_window_base, options_.va_window_size) {
  g_log_level = options_.log_level;
  if (options_.max_bytes == 0) options_.max_bytes = RamBytes() / 2;
  if (options_.max_pinned_bytes == 0) options_.max_pinned_bytes = RamBytes() / 8;
  accounting_.max_bytes = options_.max_bytes;
  accounting_.max_pinned_bytes = options_.max_pinned_bytes;
  accounting_.client_limits = options_.quota_client;
  accounting_.uid_default = options_.quota_uid_default;
  for (const auto& [uid, limits] : options_.quota_uid) accounting_.uid_limits[uid] = limits;
  for (const PoolSpec& spec : options_.pools) pools_.emplace_back().spec = spec;
}

Broker::~Broker() {
  // Run() closes every handle and unlinks the sockets; this only covers a
  // Broker that never ran (Create failed half way, or an embedder).
  if (loop_.data == this) {
    if (socket_bound_) ::unlink(options_.socket_path.c_str());
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); },
            nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
}

Result<std::unique_ptr<Broker>> Broker::Create(Options options) {
  std::unique_ptr<Broker> b(new Broker(std::move(options)));
  if (int rc = uv_loop_init(&b->loop_); rc != 0)
    return Status(ErrorCode::kInternal, std::string("uv_loop_init: ") + uv_strerror(rc));
  b->loop_.data = b.get();
  uv_timer_init(&b->loop_, &b->background_timer_);
  b->background_timer_.data = b.get();
  MB_RETURN_IF_ERROR(b->Listen());
  MB_RETURN_IF_ERROR(b->ListenAdmin());
  b->FillPools();  // before READY: a ready broker serves pooled sizes at once
  return b;
}

Status Broker::Listen() {
  MB_RETURN_IF_ERROR(PrepareSocketPath(options_.socket_path));
  int raw = -1;
  MB_RETURN_IF_ERROR(ipc::CheckedCall("socket", "AF_UNIX, SOCK_SEQPACKET", &raw, [] {
    return ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }));
  listen_fd_.reset(raw);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.socket_path.c_str(), options_.socket_path.size() + 1);
  // Clients of the same uid or group may connect: mode 0660.
  mode_t old = ::umask(0117);
  int rc = ::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return ipc::ErrnoStatus("bind", options_.socket_path, err);
  socket_bound_ = true;
  if (!options_.socket_group.empty()) {
    MB_ASSIGN_OR_RETURN(gid_t gid, ResolveGroup(options_.socket_group));
    MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("chown", options_.socket_path, nullptr, [&] {
      return ::chown(options_.socket_path.c_str(), static_cast<uid_t>(-1), gid);
    }));
  }
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("listen", options_.socket_path, nullptr, [&] {
    return ::listen(listen_fd_.get(), kListenBacklog);
  }));
  uv_poll_init(&loop_, &listen_poll_, listen_fd_.get());
  listen_poll_.data = this;
  uv_poll_start(&listen_poll_, UV_READABLE, &Broker::OnListenReadable);
  return Status::Ok();
}

Status Broker::Run() {
  uv_signal_init(&loop_, &sigterm_);
  uv_signal_init(&loop_, &sigint_);
  sigterm_.data = sigint_.data = this;
  auto on_signal = [](uv_signal_t* h, int signum) {
    MB_INFO("stopping", "signal=%d", signum);
    static_cast<Broker*>(h->data)->Stop();
  };
  uv_signal_start(&sigterm_, on_signal, SIGTERM);
  uv_signal_start(&sigint_, on_signal, SIGINT);

  MB_INFO("serving", "socket=%s admin=%s max_bytes=%llu max_pinned_bytes=%llu pid=%d",
          options_.socket_path.c_str(), options_.admin_socket_path.c_str(),
          static_cast<unsigned long long>(options_.max_bytes),
          static_cast<unsigned long long>(options_.max_pinned_bytes), static_cast<int>(::getpid()));
  if (options_.ready_fd >= 0) {
    char line[64];
    int n = std::snprintf(line, sizeof(line), "READY %d\n", static_cast<int>(::getpid()));
    (void)!::write(options_.ready_fd, line, static_cast<size_t>(n));
    ::close(options_.ready_fd);
    options_.ready_fd = -1;
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle is closed and every worker finished: the loop is empty.
  int rc = uv_loop_close(&loop_);
  loop_.data = nullptr;
  ::unlink(options_.socket_path.c_str());
  ::unlink(options_.admin_socket_path.c_str());
  MB_INFO("stopped", "released_allocations=%zu", table_.all().size());
  if (rc != 0) return Status(ErrorCode::kInternal, "loop still had open handles at exit");
  return Status::Ok();
}

void Broker::Stop() {
  if (stopping_) return;
  stopping_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&admin_pipe_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), nullptr);
  std::vector<Session*> all;
  for (auto& [id, s] : sessions_) all.push_back(s);
  for (Session* s : all) {
    s->said_goodbye = true;  // the broker is ending it; not a client crash
    CloseSession(*s, CloseReason::kBrokerStopping);
  }
  CloseAdminConnections(&loop_, reinterpret_cast<uv_handle_t*>(&admin_pipe_));
  RunBackground();  // deferred returns go now; refills do not (stopping_)
  uv_close(reinterpret_cast<uv_handle_t*>(&background_timer_), nullptr);
}

void Broker::OnListenReadable(uv_poll_t* h, int status, int) {
  if (status < 0) return;
  static_cast<Broker*>(h->data)->Accept();
}

void Broker::Accept() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        MB_ERROR("accept_failed", "error=\"%s\"", std::strerror(errno));
      return;
    }
    ipc::UniqueFd conn(fd);
    if (sessions_.size() >= options_.max_clients) {
      MB_WARN("refused", "reason=max_clients connected=%zu", sessions_.size());
      continue;  // closing it tells the client
    }
    auto cred = ipc::GetPeerCred(conn.get());
    if (!cred.ok()) continue;
    auto pidfd = ipc::PidfdOpenIfSupported(cred->pid);
    if (!pidfd.ok()) continue;  // it exited already
    auto* s = new Session();
    s->id = next_session_id_++;
    s->fd = std::move(conn);
    s->cred = *cred;
    s->pidfd = std::move(*pidfd);
    if (auto groups = ipc::GetPeerGroups(s->fd.get()); groups.ok()) s->groups = std::move(*groups);
    s->admitted = Admits(*s);
    MB_INFO("connect", "client=%llu pid=%d uid=%u gid=%u admitted=%s",
            static_cast<unsigned long long>(s->id), static_cast<int>(s->cred.pid), s->cred.uid,
            s->cred.gid, s->admitted ? "yes" : "no");
    s->connected_since = std::chrono::system_clock::now();
    uv_poll_init(&loop_, &s->poll, s->fd.get());
    s->poll.data = s;
    uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, &Broker::OnSessionEvent);
    sessions_[s->id] = s;
    ++counters_.clients_total;
  }
}

bool Broker::Admits(const Session& s) const {
  const ipc::PeerCred& c = s.cred;
  if (c.uid == 0 || c.uid == ::geteuid()) return true;
  const auto& uids = options_.allow_uids;
  if (std::find(uids.begin(), uids.end(), c.uid) != uids.end()) return true;
  for (gid_t g : options_.allow_gids)
    if (c.gid == g || std::find(s.groups.begin(), s.groups.end(), g) != s.groups.end()) return true;
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
    self->CloseSession(*s, CloseReason::kIoError, uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) self->Flush(*s);
  if (!s->closing && (events & (UV_READABLE | UV_DISCONNECT))) self->ReadFrames(*s);
}

void Broker::ReadFrames(Session& s) {
  ipc::Frame frame;
  for (int i = 0; i < kFramesPerWakeup && !s.closing; ++i) {
    bool would_block = false;
    Status st = ipc::RecvFrame(s.fd.get(), &frame, &would_block);
    if (would_block) return;
    if (!st.ok()) {
      if (st.code() == ErrorCode::kProtocolError) {
        ++counters_.protocol_errors;
        ++counters_.clients_kicked;
        CloseSession(s, CloseReason::kProtocolViolation, st.message());
      } else {
        CloseSession(s, st.code() == ErrorCode::kNotConnected ? CloseReason::kPeerClosed
                                                              : CloseReason::kIoError,
                     st.message());
      }
      return;
    }
    HandleFrame(s, std::move(frame));
  }
}

void Broker::Send(Session& s, uint64_t request_id, ipc::Message body,
                  std::span<const int> fds) {
  if (s.closing) return;
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
  if (s.outbound.size() >= options_.max_outbound_frames) {
    ++counters_.clients_kicked;
    CloseSession(s, CloseReason::kSlowReader, "outbound queue full");
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
  s.outbound.push_back(std::move(out));
  if (!s.polling_writable) {
    s.polling_writable = true;
    uv_poll_start(&s.poll, UV_READABLE | UV_WRITABLE | UV_DISCONNECT, &Broker::OnSessionEvent);
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
    s.outbound.pop_front();
  }
  if (s.close_after_flush) {
    CloseAfterReply(s);  // the queue is empty now: it closes
    return;
  }
  s.polling_writable = false;
  uv_poll_start(&s.poll, UV_READABLE | UV_DISCONNECT, &Broker::OnSessionEvent);
}

void Broker::CloseSession(Session& s, CloseReason reason, const std::string& detail) {
  if (s.closing) return;
  s.closing = true;
  static const char* kReasons[] = {"eof", "protocol_violation", "slow_reader", "kicked",
                                   "not_admitted", "broker_stopping", "io_error"};
  const char* why = kReasons[static_cast<int>(reason)];
  if (reason == CloseReason::kPeerClosed) why = s.said_goodbye ? "clean" : "crash";
  if (reason == CloseReason::kPeerClosed && !s.said_goodbye) ++counters_.clients_crashed;
  // What this frees is closed together, by a worker when it is more than one
  // large allocation's worth: thousands of memfds take tens of milliseconds to
  // close, which the loop's other clients should not wait for.
  ReturnBatch freed;
  ReturnBatch* outer = std::exchange(return_batch_, &freed);
  EndEngineSession(s, /*all=*/true);
  EndNamesSession(s, /*crashed=*/!s.said_goodbye);
  for (Waiter* w : WaitersOf(s.id)) CloseWaiter(w);
  std::vector<uint64_t> held = s.ledger.TakeAll();
  counters_.released_on_disconnect += held.size();
  for (uint64_t id : held) ReleaseHolding(s, id);
  return_batch_ = outer;
  if (freed.bytes > options_.inline_alloc_bytes) ReturnOnWorker(std::move(freed));
  for (const auto& [addr, size] : s.host_regs) Uncharge(&s, s.cred.uid, Usage{0, size, 0, 0});
  s.host_regs.clear();
  MB_INFO("disconnect", "client=%llu pid=%d name=\"%s\" reason=%s released=%zu%s%s%s",
          static_cast<unsigned long long>(s.id), static_cast<int>(s.cred.pid), LogText(s.name).c_str(),
          why, held.size(), detail.empty() ? "" : " detail=\"", LogText(detail).c_str(), detail.empty() ? "" : "\"");
  s.outbound.clear();
  sessions_.erase(s.id);
  // Work still running for this session finds it gone and releases its result.
  uv_close(reinterpret_cast<uv_handle_t*>(&s.poll),
           [](uv_handle_t* h) { delete static_cast<Session*>(h->data); });
}

Status Broker::KickClient(uint64_t id) {
  Session* s = FindSession(id);
  if (s == nullptr) return Status(ErrorCode::kNotFound, "no client " + std::to_string(id));
  ++counters_.clients_kicked;
  CloseSession(*s, CloseReason::kKicked, "by the admin socket");
  return Status::Ok();
}

Status Broker::FreeAllocation(uint64_t id) {
  if (table_.Find(id) == nullptr) return Status(ErrorCode::kNotFound, "no allocation " + std::to_string(id));
  std::vector<Session*> holders;
  for (auto& [sid, s] : sessions_)
    if (s->ledger.Holds(id)) holders.push_back(s);
  for (Session* s : holders) {
    s->ledger.Remove(id);
    ReleaseHolding(*s, id);
  }
  for (auto& [sid, s] : sessions_)
    if (s->engine_holdings.Remove(id)) ReleaseHolding(*s, id, /*engine_import=*/true);
  for (auto it = names_.begin(); it != names_.end();) {
    auto next = std::next(it);
    if (it->second.allocation == id) Unpublish(it, 0);
    it = next;
  }
  MB_INFO("allocation_freed_by_admin", "id=%llu holders=%zu", static_cast<unsigned long long>(id),
          holders.size());
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

size_t Broker::UnpublishAll() {
  size_t n = names_.size();
  while (!names_.empty()) Unpublish(names_.begin(), 0);
  return n;
}

}  // namespace membroker::broker
