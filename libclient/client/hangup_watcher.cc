#include "client/hangup_watcher.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <future>

#include "client/client_core.h"
#include "membroker/ipc/syscall.h"

namespace membroker::detail {

HangupWatcher& HangupWatcher::Get() {
  static std::mutex init_mu;
  static HangupWatcher* instance = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lk(init_mu);
  // Never destroyed (its thread runs until the process exits); a forked
  // child's copy is the parent's, without the thread: it gets its own.
  if (instance == nullptr || owner != CurrentPid()) {
    instance = new HangupWatcher();
    owner = CurrentPid();
  }
  return *instance;
}

Status HangupWatcher::Start() {
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return ipc::ErrnoStatus("epoll_create1", "the hang-up watcher", errno);
  epoll_.reset(ep);
  // Returns only once the thread runs: a process that forks right after
  // Connect must not fork in the middle of a thread's creation (the child
  // would inherit the thread library's or a sanitizer's locks held).
  std::promise<void> running;
  std::future<void> started = running.get_future();
  thread_ = std::thread([this, &running] {
    running.set_value();
    Loop();
  });
  started.wait();
  return Status::Ok();
}

Status HangupWatcher::Watch(ClientCore* core, int fd) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!thread_.joinable()) MB_RETURN_IF_ERROR(Start());
  if (auto old = by_core_.find(core); old != by_core_.end()) {
    auto w = watched_.find(old->second);
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, w->second.fd, nullptr);
    watched_.erase(w);
    by_core_.erase(old);
  }
  const uint64_t serial = next_++;
  epoll_event ev{};
  ev.events = 0;  // EPOLLHUP and EPOLLERR are always reported
  ev.data.u64 = serial;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    return ipc::ErrnoStatus("epoll_ctl", "watching the broker socket", errno);
  watched_[serial] = Watched{core, fd};
  by_core_[core] = serial;
  return Status::Ok();
}

void HangupWatcher::Forget(ClientCore* core) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_core_.find(core);
  if (it == by_core_.end()) return;
  auto w = watched_.find(it->second);
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, w->second.fd, nullptr);
  watched_.erase(w);
  by_core_.erase(it);
}

void HangupWatcher::Loop() {
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0) continue;  // EINTR (nothing else can fail here)
    std::lock_guard<std::mutex> lk(mu_);
    for (int i = 0; i < n; ++i) {
      auto w = watched_.find(events[i].data.u64);
      if (w == watched_.end()) continue;  // forgotten while the event was on its way
      ClientCore* core = w->second.core;
      (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, w->second.fd, nullptr);
      by_core_.erase(core);
      watched_.erase(w);
      core->OnHangup();
    }
  }
}

}  // namespace membroker::detail
