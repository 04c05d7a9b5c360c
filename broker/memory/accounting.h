// Accounting: what each client and each uid uses, checked against the
// broker-wide budgets (RESOURCE_EXHAUSTED) and the per-client and per-uid
// quotas (QUOTA_EXCEEDED) before anything is created.
//
// Charging rules:
//  1. An allocation is charged to its creator client while the creator holds
//     it, and to the creator's uid (and the broker totals) while it lives.
//  2. An import is charged to the importing client and its uid while held.
//  3. A host registration is pinned bytes of its client and uid while it lasts.
//  4. Device memory is device_bytes, not bytes: the host budgets do not see
//     it; each device has its own budget (max_device_bytes), and the quotas'
//     "device" key limits a client's or uid's device bytes on all devices.
//  5. KV-cache blocks a client holds - leased or reserved, each block once,
//     at its store's block size - are kv_bytes of the client and its uid
//     (the quotas' "kv" key). The store's memory is its creator's bytes;
//     kv_bytes is what a client keeps from being evicted or written.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "membroker/status.h"

namespace membroker::broker {

struct Usage {
  uint64_t bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t allocations = 0;
  uint64_t imports = 0;
  uint64_t device_bytes = 0;
  uint64_t kv_bytes = 0;
  int device = -1;  // whose budget device_bytes is charged to (one allocation's charge)

  // What an allocation of `bytes` costs: host bytes (pinned ones too), or
  // device bytes on `device`.
  static Usage For(uint64_t bytes, bool pinned, int device);
  Usage& operator+=(const Usage& o);
  Usage& operator-=(const Usage& o);  // saturates at zero
};

struct QuotaLimits {
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
  uint64_t bytes = kUnlimited;
  uint64_t pinned_bytes = kUnlimited;
  uint64_t allocations = kUnlimited;
  uint64_t imports = kUnlimited;
  uint64_t device_bytes = kUnlimited;
  uint64_t kv_bytes = kUnlimited;

  // Parses "bytes=1G,pinned=64M,allocations=100,imports=50,device=8G,kv=1G" onto *this.
  Status Parse(const std::string& spec);
  std::string ToString() const;
};

class Accounting {
 public:
  uint64_t max_bytes = 0;                    // broker-wide budget
  uint64_t max_pinned_bytes = 0;             // broker-wide pinned budget
  std::string budget_source;                 // where max_bytes came from (a flag, or the memory it is a share of)
  std::string pinned_budget_source;          // and max_pinned_bytes
  std::map<int, uint64_t> max_device_bytes;  // per CUDA device (none: unlimited)
  QuotaLimits client_limits;                 // every client
  QuotaLimits uid_default;                   // every uid without an override
  std::map<uid_t, QuotaLimits> uid_limits;

  // Whether adding delta for this client and uid stays within every limit.
  Status Check(const Usage& client, uid_t uid, const Usage& delta) const;

  void ChargeUid(uid_t uid, const Usage& delta);
  void ReleaseUid(uid_t uid, const Usage& delta);
  const Usage& total() const { return total_; }
  const std::map<uid_t, Usage>& by_uid() const { return by_uid_; }
  uint64_t device_total(int device) const;
  const QuotaLimits& LimitsFor(uid_t uid) const;

 private:
  Usage total_;
  std::map<uid_t, Usage> by_uid_;
  std::map<int, uint64_t> device_total_;
};

}  // namespace membroker::broker
