// Requests that wait in the broker (waiter.h): one timer each, answered when
// what they wait for happens or when the timer fires.
#include <algorithm>

#include "broker.h"
#include "uv_status.h"

namespace membroker::broker {

Status Broker::AddWaiter(Session& s, uint64_t rid, Waiter::Kind kind, const std::string& key,
                         uint32_t timeout_ms) {
  if (timeout_ms > kMaxWaitMs) return Status(ErrorCode::kParamInvalid, "timeout above 10 minutes");
  if (WaitersOf(s.id).size() >= kMaxWaitersPerClient)
    return Status(ErrorCode::kResourceExhausted,
                  "this client already has " + std::to_string(kMaxWaitersPerClient) +
                      " requests waiting in the broker");
  auto* w = new Waiter();
  w->broker = this;
  w->kind = kind;
  w->session_id = s.id;
  w->request_id = rid;
  w->key = key;
  w->timer.data = w;
  if (Status st = UvStatus("uv_timer_init", uv_timer_init(&loop_, &w->timer)); !st.ok()) {
    delete w;  // never initialised: nothing for libuv to close
    return st;
  }
  if (Status st = UvStatus("uv_timer_start", uv_timer_start(&w->timer, &Broker::OnWaiterTimeout,
                                                           timeout_ms, 0));
      !st.ok()) {
    uv_close(reinterpret_cast<uv_handle_t*>(&w->timer),
             [](uv_handle_t* h) { delete static_cast<Waiter*>(h->data); });
    return st;  // a wait without its timeout would be unbounded
  }
  waiters_.push_back(w);
  return Status::Ok();
}

void Broker::OnWaiterTimeout(uv_timer_t* t) {
  auto* w = static_cast<Waiter*>(t->data);
  Broker* b = w->broker;
  if (Session* s = b->FindSession(w->session_id)) {
    switch (w->kind) {
      case Waiter::Kind::kConnect:
        b->SendError(*s, w->request_id,
                     Status(ErrorCode::kTimeout, "no engine named \"" + w->key + "\" appeared in time"));
        break;
      case Waiter::Kind::kLookup:
        b->SendError(*s, w->request_id,
                     Status(ErrorCode::kTimeout, "nothing was published as \"" + w->key + "\" in time"));
        break;
      case Waiter::Kind::kEvents:
        b->SendEvents(*s, w->request_id);  // an empty list: the wait ended
        break;
    }
  }
  b->CloseWaiter(w);
}

std::vector<Waiter*> Broker::WaitersFor(Waiter::Kind kind, const std::string& key) {
  std::vector<Waiter*> out;
  for (Waiter* w : waiters_)
    if (w->kind == kind && w->key == key) out.push_back(w);
  return out;
}

void Broker::AnswerWaiters(Waiter::Kind kind, const std::string& key,
                           const std::function<Status(Session&, uint64_t)>& answer) {
  for (Waiter* w : WaitersFor(kind, key)) {
    if (Session* s = FindSession(w->session_id)) {
      Status st = answer(*s, w->request_id);
      if (!st.ok()) SendError(*s, w->request_id, st);
    }
    CloseWaiter(w);
  }
}

std::vector<Waiter*> Broker::WaitersOf(uint64_t session_id) {
  std::vector<Waiter*> out;
  for (Waiter* w : waiters_)
    if (w->session_id == session_id) out.push_back(w);
  return out;
}

void Broker::CloseWaiter(Waiter* w) {
  // Idempotent: answering a waiter can close its session (a slow reader),
  // which closes the session's waiters, this one included.
  auto it = std::find(waiters_.begin(), waiters_.end(), w);
  if (it == waiters_.end()) return;
  waiters_.erase(it);
  uv_timer_stop(&w->timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&w->timer),
           [](uv_handle_t* h) { delete static_cast<Waiter*>(h->data); });
}

}  // namespace membroker::broker
