// Ledger: what one client holds, recorded in broker-private memory so that a
// client's exit - clean, crash or SIGKILL - can be undone exactly.
// Each client holds at most one reference to an allocation: creating it or
// importing it adds the reference, freeing the handle drops it.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace membroker::broker {

class Ledger {
 public:
  // False if the client already holds id.
  bool Add(uint64_t id) { return held_.insert(id).second; }
  // False if the client does not hold id.
  bool Remove(uint64_t id) { return held_.erase(id) == 1; }
  bool Holds(uint64_t id) const { return held_.count(id) == 1; }
  size_t size() const { return held_.size(); }
  const std::unordered_set<uint64_t>& ids() const { return held_; }
  // Empties the ledger and returns what it held, for release on disconnect.
  std::vector<uint64_t> TakeAll() {
    std::vector<uint64_t> ids(held_.begin(), held_.end());
    held_.clear();
    return ids;
  }

 private:
  std::unordered_set<uint64_t> held_;
};

}  // namespace membroker::broker
