// The listener's side of the handshake (handshake.h): a TCP socket of our
// own that admits engines on other hosts before they learn our UCX worker's
// address. Runs on the transport's progress thread: Poll does whatever is
// ready and never blocks.
//
// What a peer can do to it: hold at most kMaxWaiting handshakes open at once
// (a newcomer past that closes the oldest, so a flood cannot lock out an
// engine that answers at once); keep one open until the handshake deadline;
// send at most one frame of kMaxFrameBytes. Silent, garbage, half-closed and
// refused connections are closed and reported (counted by the caller).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"
#include "transfer/net_address.h"
#include "transfer/ucx/handshake.h"

namespace membroker::detail {

struct DoorOptions {
  std::string engine;
  std::string secret;  // empty: only allow_from admits
  std::vector<AddressPrefix> allow_from;
  std::string worker_address;  // ours, sent to whoever proves the secret
  std::chrono::milliseconds handshake_timeout{5000};
  // Called with the reason for each connection turned away, before the peer
  // can read its refusal: whoever it tells knows of it by then.
  std::function<void(std::string)> refused;
  size_t max_waiting = 64;
};

// An engine that passed: open an endpoint to its worker, and mark what we
// send it with its token; it marks what it sends us with ours.
struct Admitted {
  std::string address;  // "ip:port" it came from
  std::string engine;
  std::string worker_address;
  handshake::Token peer_token{};
  handshake::Token token{};
};

class Door {
 public:
  using Clock = std::chrono::steady_clock;

  static Result<std::unique_ptr<Door>> Open(const SocketAddress& address, DoorOptions options);
  ~Door();

  // Readable when there is something for Poll to do.
  int fd() const { return epoll_.get(); }
  std::string address() const { return address_; }
  size_t waiting() const { return waiting_.size(); }
  // Who got in (each reported once its acceptance is written).
  std::vector<Admitted> Poll(Clock::time_point now);
  Clock::time_point NextDeadline() const;

 private:
  struct Waiting;
  Door(ipc::UniqueFd listen, ipc::UniqueFd epoll, std::string address, DoorOptions options);
  void Accept(Clock::time_point now, std::vector<Admitted>& out);
  void Serve(Waiting& w, uint32_t events, std::vector<Admitted>& out);
  void Answer(Waiting& w, std::vector<Admitted>& out);  // the proof is in: admit or refuse
  void Refuse(Waiting& w, ErrorCode code, const std::string& reason, std::vector<Admitted>& out);
  void Refused(std::string why) { options_.refused(std::move(why)); }
  void Send(Waiting& w, std::string bytes, std::vector<Admitted>& out);  // the last frame: then it closes
  bool Flush(Waiting& w);                                                // false when the peer is gone
  void Watch(int fd, uint32_t events);
  void Close(int fd);
  void PauseAccepting(Clock::time_point until);

  ipc::UniqueFd listen_, epoll_;
  std::string address_;
  DoorOptions options_;
  std::map<int, std::unique_ptr<Waiting>> waiting_;  // by fd
  std::deque<int> order_;                            // oldest first
  Clock::time_point accept_paused_until_{};          // out of fds: accept again then
};

}  // namespace membroker::detail
