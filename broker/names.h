// Named objects: an allocation published under a name, found by Lookup, with
// events for subscribers (published, unpublished, a holder died). A
// publication holds its own reference to the allocation, so a persistent one
// outlives its publisher (and stays charged to the publisher's uid).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "membroker/ipc/unique_fd.h"

namespace membroker::broker {

inline constexpr size_t kMaxQueuedEvents = 1024;  // per subscriber
inline constexpr size_t kMaxSubscriptionsPerClient = 64;

struct NamedEntry {
  std::string name;
  uint64_t allocation = 0;
  uint64_t publisher_session = 0;  // 0 once a persistent object's publisher left
  pid_t publisher_pid = 0;
  uid_t uid = 0;
  bool read_only = false;
  bool persist = false;
  ipc::UniqueFd read_only_fd;  // what lookups of a read-only object get
  std::string metadata;        // the publisher's, given to every lookup
  // Handed over, not persistent: goes when the reattach grace ends unless its
  // publisher reattaches and publishes it again.
  bool awaiting_publisher = false;
};

}  // namespace membroker::broker
