// The broker's own counters: what no component counts for itself (stats and
// metrics read them with the components' own, admin_records.cc).
#pragma once

#include <cstdint>

namespace membroker::broker {

struct BrokerCounters {
  uint64_t clients_total = 0;
  uint64_t clients_refused = 0;  // not admitted by the uid/gid policy
  uint64_t released_on_disconnect = 0;
  uint64_t requests = 0;
  uint64_t errors_sent = 0;
  uint64_t protocol_errors = 0;
  uint64_t bytes_pending = 0;  // reserved for allocations being created
  uint64_t quota_rejections = 0;
  uint64_t clients_reattached = 0;  // hellos with the reattach feature
  uint64_t handles_reattached = 0;  // handles given back to reattaching clients
  uint64_t handles_adopted = 0;     // of those, memory a previous broker created
  uint64_t reattach_refused = 0;    // handles refused (not ours, wrong id, ...)
  uint64_t exports_restored = 0;
};

}  // namespace membroker::broker
