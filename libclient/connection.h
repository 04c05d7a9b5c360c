// Connection: the client's socket to the broker. Any thread may Call(); replies
// are matched to callers by request id. There is no background thread: the
// first waiting caller reads the socket for everyone (leader/follower), so a
// slow request of one thread never blocks another thread's reply.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::detail {

struct Reply {
  ipc::Message body;
  std::vector<ipc::UniqueFd> fds;
};

class Connection {
 public:
  explicit Connection(ipc::UniqueFd sock) : sock_(std::move(sock)) {}

  // Sends request and waits for its reply. An ErrorReply becomes its Status;
  // a reply with the wrong number of fds is a protocol error.
  Result<Reply> Call(ipc::Message request);
  // Sends request without waiting; a failure reply is counted later.
  Status Notify(ipc::Message request);

  uint64_t async_errors() const;
  Status last_async_error() const;

 private:
  Status Send(uint64_t rid, uint32_t flags, ipc::Message request);
  void Deliver(ipc::Frame frame);  // called with mu_ held

  ipc::UniqueFd sock_;
  std::atomic<uint64_t> next_rid_{1};
  std::mutex send_mu_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool reader_active_ = false;
  Status broken_;  // set once the connection failed
  std::unordered_set<uint64_t> waiting_;
  std::unordered_map<uint64_t, Reply> replies_;
  uint64_t async_errors_ = 0;
  Status last_async_error_;
};

}  // namespace membroker::detail
