// Waiters: requests that wait in the broker - without polling - for something
// to happen: a Connect for its remote engine to appear, a Resolve for an
// engine to appear on any host of the cluster, a Lookup for its name to be
// published (here, or on any host of the cluster), a WaitEvents for an event. Each has a timer for its
// timeout; the session's end cancels it. The component owns the list and the
// timers; what a waiter is answered with is its caller's business (the
// answer callbacks), so a Waiter knows nothing of the Broker.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "membroker/status.h"

namespace membroker::broker {

inline constexpr size_t kMaxWaitersPerClient = 16;
inline constexpr uint32_t kMaxWaitMs = 10 * 60 * 1000;

struct Waiter {
  enum class Kind { kConnect, kResolve, kLookup, kClusterLookup, kEvents };
  Kind kind = Kind::kConnect;
  uint64_t session_id = 0;
  uint64_t request_id = 0;
  std::string key;  // the remote engine or the name; empty for events
};

class Waiters {
 public:
  // on_timeout answers a waiter whose time ran out (it is closed after).
  Waiters(uv_loop_t* loop, std::function<void(const Waiter&)> on_timeout)
      : loop_(loop), on_timeout_(std::move(on_timeout)) {}
  ~Waiters();
  Waiters(const Waiters&) = delete;
  Waiters& operator=(const Waiters&) = delete;

  // Adds a waiter with its timer; PARAM_INVALID past kMaxWaitMs,
  // RESOURCE_EXHAUSTED past kMaxWaitersPerClient.
  Status Add(Waiter w, uint32_t timeout_ms);
  // Removes and returns every waiter of kind for key, in the order they came.
  std::vector<Waiter> Take(Waiter::Kind kind, const std::string& key);
  // The keys waited for by waiters of kind, each once.
  std::vector<std::string> Keys(Waiter::Kind kind) const;
  // Removes and returns the events waiters of one session.
  std::vector<Waiter> TakeEvents(uint64_t session_id);
  // At a session's end: its waiters go unanswered.
  void OnSessionEnd(uint64_t session_id);
  // Closes every timer (the broker is stopping).
  void CloseAll();

  size_t size() const { return entries_.size(); }
  size_t CountFor(uint64_t session_id) const;
  bool empty() const { return entries_.empty(); }
  // Every waiter belongs to a live session.
  Status Check(const std::function<bool(uint64_t)>& session_alive) const;

 private:
  struct Entry;
  static void OnTimer(uv_timer_t* t);
  // Removes the entries for which pick is true, closing their timers.
  std::vector<Waiter> TakeIf(const std::function<bool(const Waiter&)>& pick);
  static void Close(Entry* e);

  uv_loop_t* loop_;
  std::function<void(const Waiter&)> on_timeout_;
  std::vector<Entry*> entries_;  // in the order they came
};

}  // namespace membroker::broker
