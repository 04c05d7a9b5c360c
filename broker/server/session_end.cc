// The end of a session. Every way a session ends - the client said goodbye,
// crashed or was SIGKILLed (EOF), broke the protocol, stopped reading, was
// kicked by an operator, was not admitted, or the broker is stopping - comes
// here, and this one function states the order in which each component
// undoes what the session had (each in its OnSessionEnd, or its Release):
//
//   1. engines   its transfer engine (name, regions, the peers connected to
//                it) and its own connections to other engines, then the
//                allocations its engine imported from peers;
//   2. names     what it published goes (persistent objects stay), and on a
//                crash subscribers hear that a holder died;
//   3. waiters   its requests waiting in the broker are cancelled; its KV
//                leases and unsealed reservations end (kv/kv_stores.h);
//   4. holdings  every ledger entry is released as if the client had freed it;
//                allocations left without holders are freed;
//   5. host registrations are uncharged;
//   6. sessions  it leaves Sessions; the socket closes and the Session is
//                deleted in libuv's close callback.
//
// Engines and names go first because they hold references of their own and
// look at the session's ledger (who held a named object when it died).
#include <utility>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/pidfd.h"

namespace membroker::broker {

void Broker::CloseSession(Session& s, CloseReason reason, const std::string& detail) {
  if (s.closing) return;
  s.closing = true;
  // A peer whose process is gone crashed, whatever the last read returned
  // (a reset, an error): it is counted and logged as a crash.
  if (reason == CloseReason::kIoError && !s.said_goodbye && !ipc::PidfdAlive(s.pidfd.get()))
    reason = CloseReason::kCrash;
  sessions_.CountEnd(reason);
  // What this frees is given back together, by a worker when it is more than
  // one large allocation's worth: thousands of memfds take tens of
  // milliseconds to close, which the loop's other clients should not wait for.
  ReturnBatch freed;
  ReturnBatch* outer = holdings_.GatherReturns(&freed);

  engines_.OnSessionEnd(s.id);                                      // 1
  cluster_.SetEngines(engines_.Listening());
  holdings_.ReleaseAll(s, Holding::kEngine);
  if (reason == CloseReason::kCrash)                                // 2
    for (const auto& [name, e] : names_.all())
      if (s.ledger.Holds(e.allocation) || e.publisher_session == s.id)
        PostEvent(ipc::NameEventKind::kHolderDied, name, e.allocation, s.cred.pid);
  for (const std::string& name : names_.OnSessionEnd(s.id)) Unpublish(name, s.cred.pid);
  waiters_.OnSessionEnd(s.id);                                      // 3
  holdings_.Uncharge(&s, s.cred.uid, Usage{.kv_bytes = kv_.HeldBytes(s.id)});
  kv_.OnSessionEnd(s.id);
  const size_t released = holdings_.ReleaseAll(s, Holding::kLedger);  // 4
  counters_.released_on_disconnect += released;
  for (const auto& [addr, size] : s.host_regs)                      // 5
    holdings_.Uncharge(&s, s.cred.uid, Usage{.pinned_bytes = size});
  s.host_regs.clear();

  holdings_.GatherReturns(outer);
  if (freed.bytes > options_.inline_alloc_bytes) workers_.Return(std::move(freed));
  MB_INFO("disconnect", "client=%llu pid=%d name=\"%s\" reason=%s released=%zu%s%s%s",
          static_cast<unsigned long long>(s.id), static_cast<int>(s.cred.pid), LogText(s.name).c_str(),
          CloseReasonName(reason), released, detail.empty() ? "" : " detail=\"", LogText(detail).c_str(),
          detail.empty() ? "" : "\"");
  sessions_.Remove(s);                                              // 6
  // Work still running for this session finds it gone and releases its result.
  uv_close(reinterpret_cast<uv_handle_t*>(&s.poll), [](uv_handle_t* h) { delete static_cast<Session*>(h->data); });
}

}  // namespace membroker::broker
