// A channel subscriber's wake fd (ChannelSubscriber::WakeFd), for event loops.
// The subscriber binds a datagram socket to an abstract address made of its
// pid and a random nonce, and writes the nonce in its slot; a publisher that
// finds it waiting that way sends one byte there instead of a futex wake. The
// fd handed out is an epoll fd over that socket and the publisher's pidfd, so
// it also becomes readable when the publisher dies. A byte is a hint: the
// subscriber drains the socket, then looks at its queue.
#pragma once

#include <cstdint>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::detail {

// One datagram to the subscriber (pid, nonce); never blocks, never fails (a
// subscriber that has gone has no address any more).
void SendChannelWake(int32_t pid, uint64_t nonce);

class ChannelWakeFd {
 public:
  // publisher_pidfd: -1 where pidfds are not supported.
  static Result<ChannelWakeFd> Open(int publisher_pidfd);
  int fd() const { return epoll_.get(); }
  uint64_t nonce() const { return nonce_; }
  // Reads every byte waiting; never blocks.
  void Drain() const;

 private:
  ipc::UniqueFd socket_, epoll_;
  uint64_t nonce_ = 0;
};

}  // namespace membroker::detail
