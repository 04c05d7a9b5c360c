// HangupWatcher: one thread per process notices when the broker hangs up on
// any Client of the process - an epoll set of their sockets with no events
// asked for, so only hang-ups wake it (callers read the replies) - and tells
// that Client, which then reattaches on a thread of its own (reattach.cc).
// One thread for all, started with the first Client: a Connect costs one
// epoll_ctl, no thread and no wake-up.
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <thread>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::detail {

class ClientCore;

class HangupWatcher {
 public:
  // The process's watcher (a forked child gets a new one: threads do not
  // survive fork).
  static HangupWatcher& Get();

  // Watches fd for core; core->OnHangup() is called (once, on the watcher's
  // thread, under its lock) when it hangs up, and the watch ends.
  Status Watch(ClientCore* core, int fd);
  // After this returns the watcher never calls core again.
  void Forget(ClientCore* core);

 private:
  HangupWatcher() = default;
  Status Start();  // with mu_ held
  void Loop();

  struct Watched {
    ClientCore* core;
    int fd;
  };
  std::mutex mu_;
  // By registration number (the epoll events carry it: a core freed, and
  // another made at its address, while an event was on its way, is not mistaken).
  std::map<uint64_t, Watched> watched_;
  std::map<ClientCore*, uint64_t> by_core_;
  uint64_t next_ = 1;
  ipc::UniqueFd epoll_;
  std::thread thread_;
};

}  // namespace membroker::detail
