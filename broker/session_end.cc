// The end of a session. Every way a session ends - the client said goodbye,
// crashed or was SIGKILLed (EOF), broke the protocol, stopped reading, was
// kicked by an operator, was not admitted, or the broker is stopping - comes
// here, and this one function states the order in which what the session had
// is undone:
//
//   1. engines   its transfer engine (name, regions, the peers connected to
//                it) and its own connections to other engines, then the
//                allocations its engine imported from peers;
//   2. names     what it published goes (persistent objects stay), and on a
//                crash subscribers hear that a holder died;
//   3. waiters   its requests waiting in the broker are cancelled;
//   4. holdings  every ledger entry is released as if the client had freed it;
//                allocations left without holders are freed;
//   5. host registrations are uncharged;
//   6. the socket closes; the Session is deleted in libuv's close callback.
//
// Engines and names go first because they hold references of their own and
// look at the session's ledger (who held a named object when it died).
#include <utility>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/pidfd.h"

namespace membroker::broker {

const char* Broker::CloseWhyName(CloseWhy why) {
  static const char* kNames[] = {"clean",        "crash",           "protocol_violation",
                                 "slow_reader",  "kicked",          "not_admitted",
                                 "broker_stopping", "io_error", "handshake_timeout",
                                 "refused"};
  static_assert(std::size(kNames) == static_cast<size_t>(CloseWhy::kCount));
  return kNames[static_cast<size_t>(why)];
}

void Broker::CloseSession(Session& s, CloseReason reason, const std::string& detail) {
  if (s.closing) return;
  s.closing = true;
  // A peer whose process is gone crashed, whatever the last read returned
  // (a reset, an error): it is counted and logged as a crash.
  if (reason == CloseReason::kIoError && !s.said_goodbye && !ipc::PidfdAlive(s.pidfd.get()))
    reason = CloseReason::kPeerClosed;
  CloseWhy why = static_cast<CloseWhy>(static_cast<int>(reason) + 1);
  if (reason == CloseReason::kPeerClosed) why = s.said_goodbye ? CloseWhy::kClean : CloseWhy::kCrash;
  ++closes_[static_cast<size_t>(why)];
  // What this frees is given back together, by a worker when it is more than
  // one large allocation's worth: thousands of memfds take tens of
  // milliseconds to close, which the loop's other clients should not wait for.
  ReturnBatch freed;
  ReturnBatch* outer = std::exchange(return_batch_, &freed);

  EndEngineSession(s);                                      // 1
  ReleaseAll(s, Holding::kEngine);
  EndNamesSession(s, /*crashed=*/why == CloseWhy::kCrash);  // 2
  for (Waiter* w : WaitersOf(s.id)) CloseWaiter(w);         // 3
  const size_t released = ReleaseAll(s, Holding::kLedger);  // 4
  counters_.released_on_disconnect += released;
  for (const auto& [addr, size] : s.host_regs)              // 5
    Uncharge(&s, s.cred.uid, Usage{0, size, 0, 0});
  s.host_regs.clear();

  return_batch_ = outer;
  if (freed.bytes > options_.inline_alloc_bytes) ReturnOnWorker(std::move(freed));
  MB_INFO("disconnect", "client=%llu pid=%d name=\"%s\" reason=%s released=%zu%s%s%s",
          static_cast<unsigned long long>(s.id), static_cast<int>(s.cred.pid),
          LogText(s.name).c_str(), CloseWhyName(why), released, detail.empty() ? "" : " detail=\"",
          LogText(detail).c_str(), detail.empty() ? "" : "\"");
  outbound_bytes_ -= s.outbound_bytes;
  s.outbound_bytes = 0;
  s.outbound.clear();
  sessions_.erase(s.id);
  handshaking_.erase(s.id);
  // 6. Work still running for this session finds it gone and releases its result.
  uv_close(reinterpret_cast<uv_handle_t*>(&s.poll),
           [](uv_handle_t* h) { delete static_cast<Session*>(h->data); });
}

}  // namespace membroker::broker
