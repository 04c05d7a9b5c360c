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
#include "memory_limits.h"
#include "systemd.h"
#include "uv_status.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/syscall.h"

#include <algorithm>

namespace membroker::broker {

namespace {
constexpr int kListenBacklog = 512;

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

Status BindSeqpacket(const std::string& path, mode_t umask_bits, ipc::UniqueFd* out, bool* bound) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return Status(ErrorCode::kParamInvalid, "socket path too long: " + path);
  MB_RETURN_IF_ERROR(PrepareSocketPath(path));
  int raw = -1;
  MB_RETURN_IF_ERROR(ipc::CheckedCall("socket", "AF_UNIX, SOCK_SEQPACKET", &raw, [] {
    return ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }));
  out->reset(raw);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  mode_t old = ::umask(umask_bits);
  int rc = ::bind(raw, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return ipc::ErrnoStatus("bind", path, err);
  *bound = true;
  return Status::Ok();
}

Broker::Broker(Options options)
    : options_(std::move(options)), window_(options_.va_window_base, options_.va_window_size) {
  g_log_level = options_.log_level;
  if (options_.state_file.empty()) options_.state_file = options_.socket_path + ".state";  // embedders
  // Defaults from the memory the broker really lives in (a container's
  // cgroup, not the host's RAM), so a request past them is an error reply,
  // never the OOM killer.
  const MemoryCeiling memory = MemoryAvailable();
  budget_source_ = "--max-bytes";
  if (options_.max_bytes == 0) {
    options_.max_bytes = memory.bytes / 2;
    budget_source_ = "half of " + memory.source + " (" + std::to_string(memory.bytes) + ")";
  }
  pinned_budget_source_ = "--max-pinned-bytes";
  if (options_.max_pinned_bytes == 0) {
    const MemoryCeiling lockable = LockableMemory();
    options_.max_pinned_bytes = memory.bytes / 8;
    pinned_budget_source_ = "an eighth of " + memory.source + " (" + std::to_string(memory.bytes) + ")";
    if (lockable.bytes < options_.max_pinned_bytes) {
      options_.max_pinned_bytes = lockable.bytes;
      pinned_budget_source_ = lockable.source + " (" + std::to_string(lockable.bytes) + ")";
    }
  }
  accounting_.max_bytes = options_.max_bytes;
  accounting_.max_pinned_bytes = options_.max_pinned_bytes;
  accounting_.client_limits = options_.quota_client;
  accounting_.uid_default = options_.quota_uid_default;
  for (const auto& [uid, limits] : options_.quota_uid) accounting_.uid_limits[uid] = limits;
  for (const PoolSpec& spec : options_.pools) pools_.emplace_back().spec = spec;
}

void Broker::ReportReady() {
  // Type=notify: systemd starts the units that need the broker only now.
  systemd::Notify("READY=1\nSTATUS=serving " + options_.socket_path);
  const uint64_t interval = systemd::WatchdogIntervalMs();
  if (interval == 0) return;
  // Half the interval, as sd_watchdog_enabled(3) advises; a loop that stops
  // turning stops the pings, and systemd restarts the broker.
  int rc = uv_timer_start(
      &watchdog_timer_,
      [](uv_timer_t* t) {
        auto* b = static_cast<Broker*>(t->data);
        systemd::Notify("WATCHDOG=1\nSTATUS=serving " + std::to_string(b->sessions_.size()) + " clients, " +
                        std::to_string(b->table_.all().size()) + " allocations");
      },
      interval / 2, interval / 2);
  if (rc != 0) MB_ERROR("watchdog_failed", "error=\"%s\"", uv_strerror(rc));
}

Broker::~Broker() {
  // Run() closes every handle and unlinks the sockets; this only covers a
  // Broker that never ran (Create failed half way, or an embedder).
  if (loop_.data == this) {
    if (socket_bound_) ::unlink(options_.socket_path.c_str());
    if (takeover_bound_) ::unlink(TakeOverSocketPath().c_str());
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
  for (uv_timer_t* t : {&b->background_timer_, &b->handshake_timer_, &b->listen_retry_timer_,
                        &b->watchdog_timer_, &b->handover_timer_, &b->grace_timer_, &b->state_timer_}) {
    MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(&b->loop_, t)));
    t->data = b.get();
  }
  // Kept for the moment the broker runs out of fds: closing it makes room to
  // accept a connection and refuse it with a reason.
  b->reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!b->reserve_fd_) return ipc::ErrnoStatus("open", "/dev/null (the reserve fd)", errno);
  systemd::PassedFds passed = systemd::TakePassedFds();
  b->activated_socket_ = std::move(passed.client_socket);
  MB_RETURN_IF_ERROR(b->options_.take_over ? b->ReceiveTakeOver() : b->Listen());
  // After Listen: a live broker on this socket has refused us by now, so the
  // state file is this broker's to carry on.
  MB_ASSIGN_OR_RETURN(b->identity_, BrokerIdentity::Open(b->options_.state_file));
  b->proc_fd_dir_.reset(::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!b->proc_fd_dir_) return ipc::ErrnoStatus("open", "/proc/self/fd", errno);
  b->table_.StartIdsAt(b->identity_->first_id());
  if (b->identity_->first_id() > 1)
    MB_INFO("state_file", "path=\"%s\" first_id=%llu (clients of a previous broker may reattach)",
            LogText(b->options_.state_file).c_str(), static_cast<unsigned long long>(b->identity_->first_id()));
  b->fd_store_ = b->options_.fd_store || systemd::StoreAnnounced();
  if (!passed.stored.empty() && !b->options_.take_over)
    MB_RETURN_IF_ERROR(b->RestoreFromFdStore(std::move(passed.stored)));
  MB_RETURN_IF_ERROR(b->ListenAdmin());
  MB_RETURN_IF_ERROR(b->ListenTakeOver());
  b->FillPools();  // before READY: a ready broker serves pooled sizes at once
  return b;
}

Status Broker::Listen() {
  // Started by systemd with the socket already listening (membrokerd.socket):
  // serve that one. It is systemd's to create and remove, and connections
  // queued while the broker (re)started are waiting in it.
  if (activated_socket_.valid()) {
    listen_fd_ = std::move(activated_socket_);
    const int activated = listen_fd_.get();
    socket_activated_ = true;
    MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("fcntl", "O_NONBLOCK on the activated socket", nullptr, [&] {
      return ::fcntl(activated, F_SETFL, ::fcntl(activated, F_GETFL) | O_NONBLOCK);
    }));
    (void)::fcntl(activated, F_SETFD, FD_CLOEXEC);
    MB_INFO("socket_activated", "fd=%d", activated);
    MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(&loop_, &listen_poll_, listen_fd_.get())));
    listen_poll_.data = this;
    return UvStatus("uv_poll_start", uv_poll_start(&listen_poll_, UV_READABLE, &Broker::OnListenReadable));
  }
  // Clients of the same uid or group may connect: mode 0660.
  MB_RETURN_IF_ERROR(BindSeqpacket(options_.socket_path, 0117, &listen_fd_, &socket_bound_));
  if (!options_.socket_group.empty()) {
    MB_ASSIGN_OR_RETURN(gid_t gid, ResolveGroup(options_.socket_group));
    MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("chown", options_.socket_path, nullptr, [&] {
      return ::chown(options_.socket_path.c_str(), static_cast<uid_t>(-1), gid);
    }));
  }
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("listen", options_.socket_path, nullptr, [&] {
    return ::listen(listen_fd_.get(), kListenBacklog);
  }));
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(&loop_, &listen_poll_, listen_fd_.get())));
  listen_poll_.data = this;
  return UvStatus("uv_poll_start", uv_poll_start(&listen_poll_, UV_READABLE, &Broker::OnListenReadable));
}

Status Broker::Run() {
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_init", uv_signal_init(&loop_, &sigterm_)));
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_init", uv_signal_init(&loop_, &sigint_)));
  sigterm_.data = sigint_.data = this;
  auto on_signal = [](uv_signal_t* h, int signum) {
    MB_INFO("stopping", "signal=%d", signum);
    static_cast<Broker*>(h->data)->Stop();
  };
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_start", uv_signal_start(&sigterm_, on_signal, SIGTERM)));
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_start", uv_signal_start(&sigint_, on_signal, SIGINT)));

  MB_INFO("serving", "socket=%s admin=%s max_bytes=%llu max_pinned_bytes=%llu pid=%d",
          options_.socket_path.c_str(), options_.admin_socket_path.c_str(),
          static_cast<unsigned long long>(options_.max_bytes),
          static_cast<unsigned long long>(options_.max_pinned_bytes), static_cast<int>(::getpid()));
  ReportReady();
  if (options_.ready_fd >= 0) {
    // A supervisor that cannot be told we are ready would wait forever: that
    // is a failed start, not a warning.
    char line[64];
    int n = std::snprintf(line, sizeof(line), "READY %d\n", static_cast<int>(::getpid()));
    ssize_t written = 0;
    Status st = ipc::CheckedCall("write", "--ready-fd " + std::to_string(options_.ready_fd), &written,
                                 [&] { return ::write(options_.ready_fd, line, static_cast<size_t>(n)); });
    // stdin, stdout and stderr stay open (on /dev/null): a socket accepted
    // later must never take their numbers (--ready-fd 1 is common).
    if (options_.ready_fd <= 2) {
      int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null_fd >= 0) {
        ::dup2(null_fd, options_.ready_fd);
        ::close(null_fd);
      }
    } else {
      ::close(options_.ready_fd);
    }
    options_.ready_fd = -1;
    if (st.ok() && written != n) st = Status(ErrorCode::kInternal, "short write to --ready-fd");
    if (!st.ok()) {
      Stop();
      uv_run(&loop_, UV_RUN_DEFAULT);
      (void)uv_loop_close(&loop_);
      loop_.data = nullptr;
      if (!socket_activated_) ::unlink(options_.socket_path.c_str());
      ::unlink(options_.admin_socket_path.c_str());
      return Status(st.code(), "cannot report readiness: " + st.message());
    }
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle is closed and every worker finished: the loop is empty.
  int rc = uv_loop_close(&loop_);
  loop_.data = nullptr;
  if (!socket_activated_) ::unlink(options_.socket_path.c_str());
  ::unlink(options_.admin_socket_path.c_str());
  MB_INFO("stopped", "released_allocations=%zu", table_.all().size());
  if (rc != 0) return Status(ErrorCode::kInternal, "loop still had open handles at exit");
  return Status::Ok();
}

void Broker::Stop() {
  if (stopping_) return;
  stopping_ = true;
  systemd::Notify("STOPPING=1\nSTATUS=stopping: releasing every client's holdings");
  uv_close(reinterpret_cast<uv_handle_t*>(&watchdog_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), nullptr);  // stops it even if paused
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
  uv_close(reinterpret_cast<uv_handle_t*>(&handshake_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&listen_retry_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&handover_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&grace_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&state_timer_), nullptr);
  if (takeover_bound_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&takeover_poll_), nullptr);
    ::unlink(TakeOverSocketPath().c_str());
    takeover_bound_ = false;
  }
}

void Broker::OnListenReadable(uv_poll_t* h, int status, int) {
  if (status < 0) return;
  static_cast<Broker*>(h->data)->Accept();
}

size_t Broker::UnpublishAll() {
  size_t n = names_.size();
  while (!names_.empty()) Unpublish(names_.begin(), 0);
  return n;
}

}  // namespace membroker::broker
