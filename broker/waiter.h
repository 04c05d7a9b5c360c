// A request that waits in the broker - without polling - for something to
// happen: a Connect for its remote engine to appear, a Lookup for its name to
// be published, a WaitEvents for an event. Each has a timer for its timeout;
// the session's closing cancels it.
#pragma once

#include <uv.h>

#include <cstdint>
#include <string>

namespace membroker::broker {

class Broker;

inline constexpr size_t kMaxWaitersPerClient = 16;
inline constexpr uint32_t kMaxWaitMs = 10 * 60 * 1000;

struct Waiter {
  enum class Kind { kConnect, kLookup, kEvents };
  uv_timer_t timer{};
  Broker* broker = nullptr;
  Kind kind = Kind::kConnect;
  uint64_t session_id = 0;
  uint64_t request_id = 0;
  std::string key;  // the remote engine or the name; empty for events
};

}  // namespace membroker::broker
