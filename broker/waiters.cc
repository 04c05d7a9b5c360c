// Waiters (waiters.h): one libuv timer each, closed when the waiter is
// answered, times out or its session ends.
#include "waiters.h"

#include <algorithm>

#include "uv_status.h"

namespace membroker::broker {

struct Waiters::Entry {
  uv_timer_t timer{};
  Waiters* owner = nullptr;
  Waiter waiter;
};

Waiters::~Waiters() { CloseAll(); }

Status Waiters::Add(Waiter w, uint32_t timeout_ms) {
  if (timeout_ms > kMaxWaitMs) return Status(ErrorCode::kParamInvalid, "timeout above 10 minutes");
  if (CountFor(w.session_id) >= kMaxWaitersPerClient)
    return Status(ErrorCode::kResourceExhausted,
                  "this client already has " + std::to_string(kMaxWaitersPerClient) +
                      " requests waiting in the broker");
  auto* e = new Entry();
  e->owner = this;
  e->waiter = std::move(w);
  e->timer.data = e;
  if (Status st = UvStatus("uv_timer_init", uv_timer_init(loop_, &e->timer)); !st.ok()) {
    delete e;  // never initialised: nothing for libuv to close
    return st;
  }
  if (Status st = UvStatus("uv_timer_start", uv_timer_start(&e->timer, &Waiters::OnTimer, timeout_ms, 0));
      !st.ok()) {
    Close(e);
    return st;  // a wait without its timeout would be unbounded
  }
  entries_.push_back(e);
  return Status::Ok();
}

void Waiters::OnTimer(uv_timer_t* t) {
  auto* e = static_cast<Entry*>(t->data);
  Waiters* self = e->owner;
  auto it = std::find(self->entries_.begin(), self->entries_.end(), e);
  if (it == self->entries_.end()) return;
  self->entries_.erase(it);
  const Waiter w = std::move(e->waiter);
  Close(e);
  self->on_timeout_(w);
}

void Waiters::Close(Entry* e) {
  uv_timer_stop(&e->timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&e->timer), [](uv_handle_t* h) { delete static_cast<Entry*>(h->data); });
}

std::vector<Waiter> Waiters::TakeIf(const std::function<bool(const Waiter&)>& pick) {
  std::vector<Waiter> out;
  std::vector<Entry*> kept;
  for (Entry* e : entries_) {
    if (pick(e->waiter)) {
      out.push_back(e->waiter);
      Close(e);
    } else {
      kept.push_back(e);
    }
  }
  entries_ = std::move(kept);
  return out;
}

std::vector<Waiter> Waiters::Take(Waiter::Kind kind, const std::string& key) {
  return TakeIf([&](const Waiter& w) { return w.kind == kind && w.key == key; });
}

std::vector<std::string> Waiters::Keys(Waiter::Kind kind) const {
  std::vector<std::string> keys;
  for (const Entry* e : entries_)
    if (e->waiter.kind == kind && std::find(keys.begin(), keys.end(), e->waiter.key) == keys.end())
      keys.push_back(e->waiter.key);
  return keys;
}

std::vector<Waiter> Waiters::TakeEvents(uint64_t session_id) {
  return TakeIf([&](const Waiter& w) { return w.kind == Waiter::Kind::kEvents && w.session_id == session_id; });
}

void Waiters::OnSessionEnd(uint64_t session_id) {
  (void)TakeIf([&](const Waiter& w) { return w.session_id == session_id; });
}

void Waiters::CloseAll() {
  (void)TakeIf([](const Waiter&) { return true; });
}

size_t Waiters::CountFor(uint64_t session_id) const {
  return static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(), [&](const Entry* e) { return e->waiter.session_id == session_id; }));
}

Status Waiters::Check(const std::function<bool(uint64_t)>& session_alive) const {
  for (const Entry* e : entries_)
    if (!session_alive(e->waiter.session_id))
      return Status(ErrorCode::kInternal,
                    "tables disagree: a waiter outlived client " + std::to_string(e->waiter.session_id));
  return Status::Ok();
}

}  // namespace membroker::broker
