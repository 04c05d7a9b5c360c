// Take-over: a planned upgrade with nothing lost (docs/RESTART.md).
//
// The running broker listens on SOCKET.takeover (mode 0600; its own uid or
// root only). A new broker started with --take-over connects there; the old
// one then
//  1. stops accepting (new connections wait in the listening socket's
//     backlog) and stops reading its clients,
//  2. lets what is in flight finish (allocations being created on workers;
//     at most 5 s) and sends every queued reply,
//  3. sends the listening socket, every allocation with its fd, every export
//     and every name, and waits for the new broker's acknowledgement,
//  4. tells each client to reattach (an ErrorReply with request id 0 and
//     NOT_CONNECTED: every request it read was answered, so the client sends
//     again what got no answer) and exits 0 without releasing anything.
// If the new broker fails before acknowledging, the old one serves on as if
// nothing had happened. The new broker keeps memory and names nobody has
// reattached to for --reattach-grace-ms, then releases them.
//
// TakeOver is the old broker's side: the take-over socket, the connection to
// the new broker and the drain's deadline and timer. TakeOverReceiver is the
// new broker's: the connection to the old one, frame by frame. What is sent
// and what it is made of are the broker's (restart/takeover_steps.cc).
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

class TakeOver {
 public:
  static constexpr int kDrainMs = 5000;  // in-flight work may take this long to finish

  // on_request: a new broker connected and said hello; on_tick: the drain's
  // timer, every millisecond until Finish or Abort.
  TakeOver(uv_loop_t* loop, std::function<void()> on_request, std::function<void()> on_tick)
      : loop_(loop), on_request_(std::move(on_request)), on_tick_(std::move(on_tick)) {}
  TakeOver(const TakeOver&) = delete;
  TakeOver& operator=(const TakeOver&) = delete;
  Status Init();

  // Listens on path (mode 0600).
  Status Listen(const std::string& path);
  bool in_progress() const { return conn_.valid(); }
  pid_t new_pid() const { return new_pid_; }
  // Whether the drain has time left.
  bool Draining() const { return uv_now(loop_) < deadline_; }

  // To the new broker, each within its step's deadline.
  Status Send(ipc::Message m, std::span<const int> fds = {});
  Status AwaitAck();
  // The hand-over failed: the connection closes and the drain stops.
  void Abort();

  // The broker is stopping: the socket closes and its file goes.
  void Close(const std::string& path);

 private:
  void Accept();

  uv_loop_t* loop_;
  std::function<void()> on_request_;
  std::function<void()> on_tick_;
  ipc::UniqueFd listen_fd_;
  uv_poll_t poll_{};
  bool bound_ = false;  // SOCKET.takeover is ours to unlink
  ipc::UniqueFd conn_;  // the new broker, while handing over
  pid_t new_pid_ = 0;
  uint64_t deadline_ = 0;  // uv_now() by which draining ends
  uv_timer_t timer_{};
  bool closed_ = false;
};

class TakeOverReceiver {
 public:
  // Connects to the broker serving path's take-over socket and says hello.
  static Result<TakeOverReceiver> Connect(const std::string& path);
  // The next frame of the state, with its fds.
  Result<ipc::Envelope> Next(std::vector<ipc::UniqueFd>* fds);
  // Says it has it all, then waits for the old broker to exit.
  Status Finish();

 private:
  ipc::UniqueFd conn_;
  ipc::UniqueFd old_broker_;  // its pidfd, where it can be had
};

// Sends one frame within timeout_ms (polling while the socket is full).
Status SendWithin(int fd, ipc::Message m, std::span<const int> fds, int timeout_ms);
// Receives one frame within timeout_ms; its fds must be as many as its type carries.
Result<ipc::Envelope> ReceiveWithin(int fd, int timeout_ms, std::vector<ipc::UniqueFd>* fds);
// Milliseconds left until deadline, at least 0.
int Remaining(std::chrono::steady_clock::time_point deadline);

}  // namespace membroker::broker
