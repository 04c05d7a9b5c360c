#include "broker.h"

#include <signal.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "log.h"
#include "memory/memory_limits.h"
#include "restart/systemd.h"
#include "uv_status.h"
#include "membroker/ipc/cuda_driver.h"
#include "membroker/ipc/syscall.h"

namespace membroker::broker {

namespace {
// Defaults from the memory the broker really lives in (a container's cgroup,
// not the host's RAM), so a request past them is an error reply, never the
// OOM killer.
void SetBudgets(Options& options, Accounting& limits) {
  const MemoryCeiling memory = MemoryAvailable();
  limits.budget_source = "--max-bytes";
  if (options.max_bytes == 0) {
    options.max_bytes = memory.bytes / 2;
    limits.budget_source = "half of " + memory.source + " (" + std::to_string(memory.bytes) + ")";
  }
  limits.pinned_budget_source = "--max-pinned-bytes";
  if (options.max_pinned_bytes == 0) {
    const MemoryCeiling lockable = LockableMemory();
    options.max_pinned_bytes = memory.bytes / 8;
    limits.pinned_budget_source = "an eighth of " + memory.source + " (" + std::to_string(memory.bytes) + ")";
    if (lockable.bytes < options.max_pinned_bytes) {
      options.max_pinned_bytes = lockable.bytes;
      limits.pinned_budget_source = lockable.source + " (" + std::to_string(lockable.bytes) + ")";
    }
  }
  if (!memory.usage_file.empty() && options.max_bytes > memory.bytes)
    MB_WARN("budget_over_cgroup",
            "--max-bytes=%llu is above the %s (%llu): the broker refuses requests past what the cgroup has left "
            "(RESOURCE_EXHAUSTED), and other processes of the cgroup share that limit",
            static_cast<unsigned long long>(options.max_bytes), memory.source.c_str(),
            static_cast<unsigned long long>(memory.bytes));
  limits.max_bytes = options.max_bytes;
  limits.max_pinned_bytes = options.max_pinned_bytes;
  // Each CUDA device's budget: the option's, else all of the device's memory.
  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  for (int d = 0; d < driver.device_count(); ++d) {
    auto total = driver.TotalMemory(d);
    auto given = options.max_device_bytes.find(d);
    if (given != options.max_device_bytes.end())
      limits.max_device_bytes[d] = given->second;
    else if (total.ok())
      limits.max_device_bytes[d] = *total;
  }
  limits.client_limits = options.quota_client;
  limits.uid_default = options.quota_uid_default;
  for (const auto& [uid, l] : options.quota_uid) limits.uid_limits[uid] = l;
}
}  // namespace

Broker::Broker(Options options)
    : options_(std::move(options)),
      admission_(
          &loop_, [this] { Accept(); }, [this] { CloseSilentSessions(); }),
      admin_(&loop_, [this](const std::string& line) { return AdminCommand(line); }),
      metrics_(&loop_, [this] { return Tables().MetricsText(); }),
      takeover_(
          &loop_, [this] { BeginHandOver(); }, [this] { ContinueHandOver(); }),
      fd_store_(&loop_, [this] { return StateRecords(); }),
      pools_(MemfdBackend(), options_.pools, [this](const std::string& what) { return state_file_->NameFor(what); }),
      workers_(&loop_, MemfdBackend(), pools_, options_.background_delay_ms),
      holdings_(MemfdBackend(), pools_, workers_, fd_store_,
                AddressWindow(options_.va_window_base, options_.va_window_size), options_.inline_alloc_bytes),
      kv_(fd_store_),
      waiters_(&loop_, [this](const Waiter& w) { OnWaiterTimeout(w); }) {
  g_log_level = options_.log_level;
  if (options_.state_file.empty()) options_.state_file = options_.socket_path + ".state";  // embedders
  SetBudgets(options_, holdings_.limits());
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
                        std::to_string(b->live_allocations()) + " allocations");
      },
      interval / 2, interval / 2);
  if (rc != 0) MB_ERROR("watchdog_failed", "error=\"%s\"", uv_strerror(rc));
}

Broker::~Broker() {
  // Run() closes every handle and unlinks the sockets; this only covers a
  // Broker that never ran (Create failed half way, or an embedder).
  if (loop_.data == this) {
    admission_.RemoveSocketFile(options_.socket_path);
    takeover_.Close(options_.socket_path + ".takeover");
    waiters_.CloseAll();
    uv_walk(&loop_, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
}

Result<std::unique_ptr<Broker>> Broker::Create(Options options) {
  std::unique_ptr<Broker> b(new Broker(std::move(options)));
  // First: a bad cluster setting is a failed start that has made nothing.
  MB_RETURN_IF_ERROR(b->cluster_.Configure(b->options_.cluster, static_cast<int32_t>(::getpid())));
  if (int rc = uv_loop_init(&b->loop_); rc != 0)
    return Status(ErrorCode::kInternal, std::string("uv_loop_init: ") + uv_strerror(rc));
  b->loop_.data = b.get();
  for (uv_timer_t* t : {&b->watchdog_timer_, &b->grace_timer_}) {
    MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(&b->loop_, t)));
    t->data = b.get();
  }
  MB_RETURN_IF_ERROR(b->admission_.Init());
  MB_RETURN_IF_ERROR(b->takeover_.Init());
  MB_RETURN_IF_ERROR(b->fd_store_.Init());
  MB_RETURN_IF_ERROR(b->workers_.Init());
  // The disk tier's scan (a fraction of a second per 10,000 files) runs while
  // a broker being taken over still serves.
  if (!b->options_.kv_disk.empty())
    MB_RETURN_IF_ERROR(b->kv_.OpenDisk(b->options_.kv_disk, b->options_.kv_disk_bytes, b->options_.take_over));
  systemd::PassedFds passed = systemd::TakePassedFds();
  MB_RETURN_IF_ERROR(b->options_.take_over ? b->ReceiveTakeOver()
                                           : b->admission_.Listen(b->options_, std::move(passed.client_socket)));
  // After Listen: a live broker on this socket has refused us by now, so the
  // state file is this broker's to carry on.
  MB_ASSIGN_OR_RETURN(b->state_file_, StateFile::Open(b->options_.state_file));
  b->proc_fd_dir_.reset(::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!b->proc_fd_dir_) return ipc::ErrnoStatus("open", "/proc/self/fd", errno);
  b->holdings_.StartIdsAt(b->state_file_->first_id());
  if (b->state_file_->first_id() > 1)
    MB_INFO("state_file", "path=\"%s\" first_id=%llu (clients of a previous broker may reattach)",
            LogText(b->options_.state_file).c_str(), static_cast<unsigned long long>(b->state_file_->first_id()));
  if (b->options_.fd_store || systemd::StoreAnnounced()) b->fd_store_.Enable();
  if (!passed.stored.empty() && !b->options_.take_over)
    MB_RETURN_IF_ERROR(b->RestoreFromFdStore(std::move(passed.stored)));
  // --kv-store: after the restores have begun, so a store a restart brings back is kept.
  std::vector<KvStoreSpec> configured;
  for (const KvStoreOption& o : b->options_.kv_stores)
    configured.push_back({o.name, o.block_size, o.capacity / o.block_size, o.policy,
                          static_cast<EvictionKind>(o.eviction), ::geteuid()});
  b->kv_.Configure(std::move(configured));
  MB_RETURN_IF_ERROR(b->kv_.MakeConfigured(b->holdings_.limits()));
  MB_RETURN_IF_ERROR(b->admin_.Listen(b->options_.admin_socket_path));
  if (!b->options_.metrics_listen.empty()) MB_RETURN_IF_ERROR(b->metrics_.Listen(b->options_.metrics_listen));
  MB_RETURN_IF_ERROR(b->takeover_.Listen(b->options_.socket_path + ".takeover"));
  b->pools_.Fill();  // before READY: a ready broker serves pooled sizes at once
  Broker* self = b.get();
  b->cluster_.SetNames(b->ListedForCluster());  // those a take-over or the fd store brought back
  MB_RETURN_IF_ERROR(b->cluster_.Start(&b->loop_, [self] { self->OnClusterChanged(); }));
  return b;
}

Status Broker::Run() {
  for (uv_signal_t& h : signals_) {
    MB_RETURN_IF_ERROR(UvStatus("uv_signal_init", uv_signal_init(&loop_, &h)));
    h.data = this;
  }
  auto on_signal = [](uv_signal_t* h, int signum) {
    MB_INFO("stopping", "signal=%d", signum);
    static_cast<Broker*>(h->data)->Stop();
  };
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_start", uv_signal_start(&signals_[0], on_signal, SIGTERM)));
  MB_RETURN_IF_ERROR(UvStatus("uv_signal_start", uv_signal_start(&signals_[1], on_signal, SIGINT)));

  MB_INFO("serving", "socket=%s admin=%s max_bytes=%llu max_pinned_bytes=%llu pid=%d",
          options_.socket_path.c_str(), options_.admin_socket_path.c_str(),
          static_cast<unsigned long long>(options_.max_bytes),
          static_cast<unsigned long long>(options_.max_pinned_bytes), static_cast<int>(::getpid()));
  ReportReady();
  Status ready = Status::Ok();
  if (options_.ready_fd >= 0) {
    // A supervisor that cannot be told we are ready would wait forever: that
    // is a failed start, not a warning.
    char line[64];
    int n = std::snprintf(line, sizeof(line), "READY %d\n", static_cast<int>(::getpid()));
    ssize_t written = 0;
    ready = ipc::CheckedCall("write", "--ready-fd " + std::to_string(options_.ready_fd), &written,
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
    if (ready.ok() && written != n) ready = Status(ErrorCode::kInternal, "short write to --ready-fd");
    if (!ready.ok()) Stop();
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle is closed and every worker finished: the loop is empty.
  int rc = uv_loop_close(&loop_);
  loop_.data = nullptr;
  admission_.RemoveSocketFile(options_.socket_path);
  ::unlink(options_.admin_socket_path.c_str());
  if (!ready.ok()) return Status(ready.code(), "cannot report readiness: " + ready.message());
  MB_INFO("stopped", "released_allocations=%zu", live_allocations());
  if (rc != 0) return Status(ErrorCode::kInternal, "loop still had open handles at exit");
  return Status::Ok();
}

void Broker::Stop() {
  if (stopping_) return;
  stopping_ = true;
  systemd::Notify("STOPPING=1\nSTATUS=stopping: releasing every client's holdings");
  uv_close(reinterpret_cast<uv_handle_t*>(&watchdog_timer_), nullptr);
  for (uv_signal_t& h : signals_) uv_close(reinterpret_cast<uv_handle_t*>(&h), nullptr);
  admission_.Close();
  admin_.Close();
  metrics_.Close();
  fd_store_.Close();
  workers_.Stop();  // from here on, freed memory goes back at once and pools stay as they are
  for (uint64_t id : sessions_.Ids()) {
    if (Session* s = sessions_.Find(id)) {
      s->said_goodbye = true;  // the broker is ending it; not a client crash
      CloseSession(*s, CloseReason::kBrokerStopping);
    }
  }
  waiters_.CloseAll();
  uv_close(reinterpret_cast<uv_handle_t*>(&grace_timer_), nullptr);
  takeover_.Close(options_.socket_path + ".takeover");
  cluster_.Stop();  // the lease is revoked: this host's records go now
}

bool Broker::Idle() const {
  const Usage& u = holdings_.accounting().total();
  return sessions_.empty() && holdings_.table().all().empty() && holdings_.table().export_count() == 0 &&
         u.bytes == 0 && u.pinned_bytes == 0 && u.allocations == 0 && u.imports == 0 && u.device_bytes == 0 &&
         holdings_.window().used() == 0 && counters_.bytes_pending == 0 && workers_.bytes_returning() == 0 &&
         engines_.empty() && waiters_.empty() && names_.empty() && kv_.empty();
}

size_t Broker::RemoveOwnerless() {
  size_t n = names_.size();
  while (!names_.empty()) Unpublish(std::string(names_.all().begin()->first), 0);
  std::vector<std::string> stores;
  for (const auto& [name, store] : kv_.all()) stores.push_back(name);
  for (const std::string& name : stores) n += DropStore(kv_, holdings_.limits(), name).ok();
  return n;
}

}  // namespace membroker::broker
