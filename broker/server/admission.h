// Admission: the listening socket and the limits at its door. Connections
// the broker cannot take are refused with a reason (an ErrorReply with
// request id 0, then the close), never left hanging in the listen backlog:
// out of fds, a reserve fd makes room to accept one and refuse it; without
// even that, the listener pauses and retries. Connections that never say
// hello are closed after --handshake-timeout-ms (the handshake timer is here;
// who is waiting is Sessions'). Refusals are counted, and logged at most once
// a second.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"
#include "options.h"

namespace membroker::broker {

class Admission {
 public:
  // on_readable: a connection waits (Accept it); on_handshake_due: the
  // handshake timer fired.
  Admission(uv_loop_t* loop, std::function<void()> on_readable, std::function<void()> on_handshake_due)
      : loop_(loop), on_readable_(std::move(on_readable)), on_handshake_due_(std::move(on_handshake_due)) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  Status Init();

  // Serves the socket systemd passed (activated), or binds options' socket path.
  Status Listen(const Options& options, ipc::UniqueFd activated);
  // Serves a listening socket handed over by the broker this one took over;
  // its path is this broker's to remove from now on.
  Status Adopt(ipc::UniqueFd listening);
  int fd() const { return listen_fd_.get(); }

  // The next connection waiting, or an invalid fd when none does. Out of fds,
  // connections are refused with the reason (and the listener pauses when
  // not even that is possible).
  ipc::UniqueFd AcceptOne();
  // Sends `why` (request id 0) on a connection the broker will not serve, then closes it.
  void Refuse(ipc::UniqueFd conn, const char* reason, const Status& why);
  // Counts a refusal; logs it unless one was logged in the last second.
  void LogRefusal(const char* reason, const std::string& detail);
  void CountRefusal() { ++refused_; }
  uint64_t refused() const { return refused_; }

  // A take-over stops taking connections (they wait in the backlog) and
  // resumes if it fails.
  void Hold() { (void)uv_poll_stop(&poll_); }
  void Resume();

  // Fires on_handshake_due in due_in_ms, unless it is set already.
  void ArmHandshakeTimer(uint64_t due_in_ms);

  // The broker is stopping: nothing is accepted or timed any more.
  void Close();
  // The socket file, if it is this broker's (not systemd's), goes.
  void RemoveSocketFile(const std::string& path);

 private:
  Status StartPolling();
  static void OnReadable(uv_poll_t* h, int status, int events);
  // accept() failed for lack of fds: refuses one pending connection with the
  // reserve fd; false when none could be taken (the listener pauses).
  bool RefuseForLackOfFds(int err);
  void Pause();

  uv_loop_t* loop_;
  std::function<void()> on_readable_;
  std::function<void()> on_handshake_due_;
  ipc::UniqueFd listen_fd_;
  uv_poll_t poll_{};
  bool polling_ = false;  // poll_ was initialised
  bool bound_ = false;    // the socket file exists and is ours to unlink
  bool closed_ = false;
  ipc::UniqueFd reserve_fd_;  // closed to accept-and-refuse when out of fds
  bool paused_ = false;
  uv_timer_t retry_timer_{};
  uv_timer_t handshake_timer_{};
  struct {
    uint64_t window_start = 0;  // uv_now() of the last refusal logged
    uint64_t suppressed = 0;    // refusals since, not logged
  } refusal_log_;
  uint64_t refused_ = 0;
};

// The open-file limit the broker runs under (RLIMIT_NOFILE, soft).
uint64_t FdLimit();
// RESOURCE_EXHAUSTED for a connection refused for lack of fds (err: EMFILE or ENFILE).
Status OutOfFds(int err);

}  // namespace membroker::broker
