// Ledger: what one client holds, recorded in broker-private memory so that a
// client's exit - clean, crash or SIGKILL - can be undone exactly.
// Each client holds at most one reference to an allocation: creating it or
// importing it adds the reference, freeing the handle drops it.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace membroker::broker {

// At most this many holdings per client (ledger), so one cannot grow the
// broker's tables without bound.
inline constexpr uint64_t kMaxHoldingsPerClient = 1u << 20;

class Ledger {
 public:
  // False if the client already holds id. read_only: held through a read-only
  // export or named object, so whoever it is shared with onward may only read.
  bool Add(uint64_t id, bool read_only = false) { return held_.emplace(id, read_only).second; }
  // False if the client does not hold id.
  bool Remove(uint64_t id) { return held_.erase(id) == 1; }
  bool Holds(uint64_t id) const { return held_.count(id) == 1; }
  bool ReadOnly(uint64_t id) const {
    auto it = held_.find(id);
    return it != held_.end() && it->second;
  }
  size_t size() const { return held_.size(); }
  std::vector<uint64_t> Ids() const {
    std::vector<uint64_t> ids;
    for (const auto& [id, read_only] : held_) ids.push_back(id);
    return ids;
  }
  // Empties the ledger and returns what it held, for release on disconnect.
  std::vector<uint64_t> TakeAll() {
    std::vector<uint64_t> ids = Ids();
    held_.clear();
    return ids;
  }

 private:
  std::unordered_map<uint64_t, bool> held_;  // allocation id -> read-only
};

}  // namespace membroker::broker
