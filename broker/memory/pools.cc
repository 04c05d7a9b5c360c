// Pools (pools.h).
#include "memory/pools.h"

#include <algorithm>
#include <memory>

#include "log.h"
#include "memory/workers.h"

namespace membroker::broker {

// Creates `count` allocations for one pool: up to 64 MiB of them per work
// item, so refilling a pool of small allocations costs one worker wake-up and
// one completion per batch rather than per allocation.
struct Pools::RefillWork {
  static constexpr uint64_t kBatchBytes = 64ull << 20;
  uv_work_t req{};
  Pools* pools = nullptr;
  size_t pool = 0;
  uint32_t count = 0;
  MemorySpec spec;
  std::vector<PhysicalMemory> created;
  uint32_t failures = 0;
};

Pools::Pools(uv_loop_t* loop, PhysicalBackend& backend, const std::vector<PoolSpec>& specs,
             std::function<std::string(const std::string&)> name)
    : loop_(loop), backend_(backend), name_(std::move(name)) {
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

void Pools::Refill() {
  for (size_t i = 0; i < pools_.size(); ++i) RefillPool(i);
}

void Pools::RefillPool(size_t index) {
  Pool& pool = pools_[index];
  while (!stopping_ && pool.NeedsRefill()) {
    auto* w = new RefillWork();
    w->req.data = w;
    w->pools = this;
    w->pool = index;
    w->spec = {"", pool.spec.size, pool.spec.policy, false};
    const uint64_t needed = pool.spec.count - pool.ready.size() - pool.refilling;
    w->count = static_cast<uint32_t>(std::clamp<uint64_t>(RefillWork::kBatchBytes / pool.spec.size, 1, needed));
    pool.refilling += w->count;
    int rc = uv_queue_work(
        loop_, &w->req,
        [](uv_work_t* r) {
          LowerWorkerPriority();
          auto* w = static_cast<RefillWork*>(r->data);
          for (uint32_t i = 0; i < w->count; ++i) {
            MemorySpec spec = w->spec;
            spec.name = w->pools->name_("membroker:pool");  // thread-safe; a nonce each
            auto mem = w->pools->backend_.Create(spec);
            if (!mem.ok()) {
              w->failures = w->count - i;
              break;
            }
            w->created.push_back(std::move(*mem));
          }
        },
        [](uv_work_t* r, int) {
          std::unique_ptr<RefillWork> w(static_cast<RefillWork*>(r->data));
          Pool& pool = w->pools->pools_[w->pool];
          pool.refilling -= w->count;
          pool.refill_failures += w->failures;  // retried on the next refill
          if (w->pools->stopping_) return;
          pool.refills += w->created.size();
          for (auto& mem : w->created) pool.ready.push_back(std::move(mem));
        });
    if (rc != 0) {  // not queued: the next pause retries
      pool.refilling -= w->count;
      ++pool.refill_failures;
      delete w;
      MB_WARN("worker_refused", "work=refill error=\"%s\"", uv_strerror(rc));
      return;
    }
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
