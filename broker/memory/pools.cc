// Pools (pools.h).
#include "memory/pools.h"

#include <algorithm>
#include <memory>

#include "log.h"
#include "memory/workers.h"

namespace membroker::broker {

// What one refill made for a pool on a worker: up to 8 MiB of allocations
// per work item, so refilling a pool of small allocations costs one worker
// wake-up and one completion per batch rather than per allocation, and a
// request's work waits for at most one batch on a busy thread.
struct Pools::Refilled {
  static constexpr uint64_t kBatchBytes = 8ull << 20;
  std::vector<PhysicalMemory> created;
  uint32_t failures = 0;
};

Pools::Pools(PhysicalBackend& backend, const std::vector<PoolSpec>& specs,
             std::function<std::string(const std::string&)> name)
    : backend_(backend), name_(std::move(name)) {
  for (const PoolSpec& spec : specs) pools_.emplace_back().spec = spec;
}

std::optional<Pools::Taken> Pools::Take(uint64_t size, ipc::PagePolicy policy, uint32_t flags) {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    if (!pool.Matches(size, policy, flags)) continue;
    if (pool.ready.empty()) {
      ++pool.misses;
      return std::nullopt;
    }
    ++pool.hits;
    Taken taken{static_cast<int>(i), std::move(pool.ready.front())};
    pool.ready.pop_front();
    return taken;
  }
  return std::nullopt;
}

void Pools::Fill() {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    while (pool.ready.size() < pool.spec.count) {
      auto mem = backend_.Create({name_("membroker:pool"), pool.spec.size, pool.spec.policy, false});
      if (!mem.ok()) {
        ++pool.refill_failures;
        MB_WARN("pool_fill_failed", "pool=%zu size=%llu filled=%zu capacity=%u error=\"%s\"", i,
                static_cast<unsigned long long>(pool.spec.size), pool.ready.size(), pool.spec.count,
                LogText(mem.status().ToString()).c_str());
        break;
      }
      pool.ready.push_back(std::move(*mem));
    }
  }
}

void Pools::Refill(Workers& workers) {
  for (size_t i = 0; i < pools_.size(); ++i) RefillPool(i, workers);
}

void Pools::RefillPool(size_t index, Workers& workers) {
  Pool& pool = pools_[index];
  while (!stopping_ && pool.NeedsRefill()) {
    const MemorySpec spec{"", pool.spec.size, pool.spec.policy, false};
    const uint64_t needed = pool.spec.count - pool.ready.size() - pool.refilling;
    const auto count = static_cast<uint32_t>(std::clamp<uint64_t>(Refilled::kBatchBytes / spec.size, 1, needed));
    pool.refilling += count;
    auto refilled = std::make_shared<Refilled>();
    workers.RunInBackground(
        [this, spec, count, refilled] {
          for (uint32_t i = 0; i < count; ++i) {
            MemorySpec one = spec;
            one.name = name_("membroker:pool");  // thread-safe; a nonce each
            auto mem = backend_.Create(one);
            if (!mem.ok()) {
              refilled->failures = count - i;
              break;
            }
            refilled->created.push_back(std::move(*mem));
          }
        },
        [this, index, count, refilled] {
          Pool& pool = pools_[index];
          pool.refilling -= count;
          pool.refill_failures += refilled->failures;  // retried on the next refill
          if (stopping_) return;
          pool.refills += refilled->created.size();
          for (auto& mem : refilled->created) pool.ready.push_back(std::move(mem));
        });
  }
}

Status Pools::Check(const std::vector<int>& live_pool_indexes) const {
  std::vector<uint64_t> counted(pools_.size(), 0);
  for (int i : live_pool_indexes) {
    if (i < 0) continue;
    if (static_cast<size_t>(i) >= pools_.size())
      return Status(ErrorCode::kInternal, "tables disagree: an allocation names pool " + std::to_string(i));
    ++counted[static_cast<size_t>(i)];
  }
  for (size_t i = 0; i < pools_.size(); ++i)
    if (counted[i] != pools_[i].in_use)
      return Status(ErrorCode::kInternal, "tables disagree: pool " + std::to_string(i) + " counts " +
                                              std::to_string(pools_[i].in_use) + " in use, the table " +
                                              std::to_string(counted[i]));
  return Status::Ok();
}

}  // namespace membroker::broker
