// WakeSocket: what Client::WakeFd hands out - a datagram socket pair made on
// first use. The broker holds a copy of the sending end (WakeRequest) and
// sends a byte when it queues a name event or an engine notify for this
// client; this process sends the same byte itself for a notify from another
// host (the network transport) and after a reattach. The receiving end is the
// fd an event loop polls; it stays the same for the life of the Client.
#pragma once

#include <mutex>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::detail {

class WakeSocket {
 public:
  // The receiving end, making the pair on the first call (*made: true then).
  Result<int> Open(bool* made);
  // Forgets a pair whose sending end the broker refused.
  void Close();
  // The sending end, or -1 before Open.
  int sending() const;
  // One byte from this side; never blocks.
  void Poke() const;
  // Reads every byte waiting; never blocks.
  void Drain() const;

 private:
  mutable std::mutex mu_;
  ipc::UniqueFd receive_, send_;
};

}  // namespace membroker::detail
