// Connection: the client's socket to the broker. Any thread may Call(); replies
// are matched to callers by request id. There is no background thread: the
// first waiting caller reads the socket for everyone (leader/follower), so a
// slow request of one thread never blocks another thread's reply.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/process_id.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::detail {

struct Reply {
  ipc::Message body;
  std::vector<ipc::UniqueFd> fds;
  uint64_t broker = 0;  // the generation of the socket it came on: which broker answered
};

class Connection {
 public:
  using Clock = std::chrono::steady_clock;
  // Every Call waits at most call_timeout for its reply (plus what the request
  // itself asks to wait in the broker).
  Connection(ipc::UniqueFd sock, std::chrono::milliseconds call_timeout)
      : sock_(std::move(sock)), call_timeout_(call_timeout), sliced_(SetSlices(sock_.get())) {}

  // Sends request and waits for its reply, at most call_timeout + waits_in_broker
  // (the timeout of a Lookup, Connect or WaitEvents): TIMEOUT then, and the
  // reply, if it still comes, is dropped - what it granted (an allocation,
  // an import) is released at once. An ErrorReply becomes its Status; a reply
  // with the wrong number of fds is a protocol error.
  // fds travel with the request (ReattachRequest's); they stay the caller's.
  Result<Reply> Call(ipc::Message request,
                     std::chrono::milliseconds waits_in_broker = std::chrono::milliseconds(0),
                     std::span<const int> fds = {});
  // Sends request (a release: Free, Goodbye, ...) without waiting; a failure
  // reply is counted later. One that finds no room until call_timeout says
  // TIMEOUT and is kept: it goes first, in order, with the next message sent.
  Status SendOneWay(ipc::Message request);

  uint64_t async_errors() const;
  Status last_async_error() const;

  // Calls that find the broker handed over wait for the reattach and are
  // sent again (on by default; off for clients that do not reattach).
  void set_resend_after_hand_over(bool on) { resend_after_hand_over_ = on; }

  // For the reattacher (reattach.cc), the one thread that swaps sockets.
  int socket_fd() const { return sock_.get(); }
  // The broker hung up: reads what it sent before (replies for their callers,
  // a refusal that says why), then breaks the connection with that refusal
  // or `otherwise`, unless it is broken already. Every call from now on fails
  // at once with the reason returned.
  Status BreakOnHangup(Status otherwise);
  // Whether calls go to a broker now (false from a hang-up to the reattach).
  bool attached() const;
  // Serves sock from now on; calls still waiting on the old one fail.
  void Replace(ipc::UniqueFd sock);
  // Sockets replaced so far, plus one: the broker that answers calls now
  // (a Reply's `broker` says which one answered it).
  uint64_t generation() const;
  ipc::UniqueFd TakeSocket() { return std::move(sock_); }

 private:
  // Sends the releases kept before, then one frame; TIMEOUT, with nothing
  // more sent, when the socket had no room until `deadline` (a SOCK_SEQPACKET
  // frame goes whole or not at all). one_way: a release, kept on TIMEOUT.
  Status Send(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
              std::span<const int> fds = {}, bool one_way = false);
  // (send_mu_ held) One frame; the kept releases first, then one frame.
  // Whether it was sent; *why says why not (the Status only on failure: a
  // request costs no Status moves).
  bool SendFrame(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
                 std::span<const int> fds, Status* why);
  bool SendAfterUnsent(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
                       std::span<const int> fds, Status* why);
  // One try of Call. *moved_at: the generation whose broker handed over
  // without reading the request (Call sends it again after the reattach).
  Result<Reply> CallOnce(const ipc::Message& request, Clock::time_point deadline, std::chrono::milliseconds total,
                         std::span<const int> fds, uint64_t* moved_at);
  // Files a reply for its caller (mu_ held); fds it does not hand on close here.
  void Deliver(std::span<const uint8_t> bytes, std::vector<ipc::UniqueFd> fds);

  // After a send failed for a lost connection (mu_ held): reads what the
  // broker sent before closing, breaks the connection with its reason (a
  // refusal, a hand-over notice) or with `sent`, and returns that.
  Status AfterFailedSend(std::unique_lock<std::mutex>& lk, Status sent);
  // Reads and delivers every frame already in the socket (mu_ held, no reader).
  void DrainLocked();
  // A late reply to an abandoned call: release what it granted.
  // engine_import: the call was an EngineImportRequest (released with
  // EngineRelease); any other grant is released with Free.
  void ReleaseLateGrant(bool engine_import, const ipc::Message& reply);

  // Removes rid from waiting_ (mu_ held): whether it was there.
  bool Unwait(uint64_t rid);
  // NOT_CONNECTED for a call from a forked child of the process that connected.
  Status NotOurs() const;

  // A reply is waited for in recvmsg itself, which the socket's receive
  // timeout (SO_RCVTIMEO, kSlice) bounds: one system call per reply where
  // poll and then recvmsg were two. The last slice before a deadline is
  // waited for in poll, which keeps the deadline exact. A send that finds the
  // socket full (a broker that does not read) waits in slices too
  // (SO_SNDTIMEO), until the call's deadline. False where the socket took
  // neither timeout: every receive then waits in poll, and a send as long as
  // the kernel makes it.
  static constexpr std::chrono::milliseconds kSlice{250};
  static bool SetSlices(int sock);
  // Waits for and reads one frame, until `deadline` at most: 1 with a frame
  // (or *st the reason none came), 0 when the time is up, -1 when poll failed
  // (errno in *poll_errno). Called without mu_, as the one reader.
  int ReadFrame(Clock::time_point deadline, ipc::Frame* frame, Status* st, int* poll_errno);
  // The frame the one reader reads into (the reader with reader_active_, or
  // DrainLocked with mu_ held and no reader): its buffer is kept, so a reply
  // costs no allocation.
  ipc::Frame frame_;

  const pid_t owner_ = CurrentPid();
  ipc::UniqueFd sock_;
  const std::chrono::milliseconds call_timeout_;
  bool sliced_;  // sock_ has both timeouts (Replace sets them again)
  std::atomic<uint64_t> next_rid_{1};
  std::mutex send_mu_;
  ipc::MessageEncoder encoder_;  // under send_mu_
  // Releases that found no room (under send_mu_), by request id, in the order
  // they were made: a later request may count on them (a Free before the
  // Malloc that needs its memory). Each releases something this client held,
  // so there are never more than it held. Dropped by Replace: a new broker
  // holds only what the client presents when it reattaches.
  std::vector<std::pair<uint64_t, ipc::Message>> unsent_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool reader_active_ = false;
  Status broken_;  // set once the connection failed
  uint64_t generation_ = 1;  // sockets replaced so far, plus one
  uint64_t moved_generation_ = 0;
  bool resend_after_hand_over_ = true;  // the generation whose broker handed over (0: none)
  // Calls waiting for their reply, and replies not yet taken by their call,
  // by request id: a few at a time (one per waiting thread), so vectors,
  // which keep their capacity, where hash tables allocated per call.
  std::vector<uint64_t> waiting_;
  std::vector<std::pair<uint64_t, Reply>> replies_;
  // Calls that timed out, by request id: whether each was an engine import.
  std::unordered_map<uint64_t, bool> abandoned_;
  uint64_t async_errors_ = 0;
  Status last_async_error_;
};

}  // namespace membroker::detail
