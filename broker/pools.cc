// Pools (pool.h): filled before the broker reports ready, taken from on the
// request path, refilled on workers once takes pause.
#include <algorithm>
#include <memory>
#include <vector>

#include "broker.h"
#include "log.h"
#include "workers.h"

namespace membroker::broker {

bool Broker::TakeFromPool(PendingMalloc& p, uint64_t size) {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    if (!pool.Matches(size, p.policy, p.flags)) continue;
    if (pool.ready.empty()) {
      ++pool.misses;
      return false;
    }
    ++pool.hits;
    ipc::PhysicalMemory mem = std::move(pool.ready.front());
    pool.ready.pop_front();
    p.pool = static_cast<int>(i);
    FinishMalloc(p, std::move(mem));
    DeferBackground();  // the refill
    return true;
  }
  return false;
}

void Broker::FillPools() {
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = pools_[i];
    while (pool.ready.size() < pool.spec.count) {
      auto mem = backend_.Create({MemoryName("membroker:pool"), pool.spec.size, pool.spec.policy, false});
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

void Broker::RefillPool(size_t index) {
  Pool& pool = pools_[index];
  while (!stopping_ && pool.NeedsRefill()) {
    auto* w = new RefillWork();
    w->req.data = w;
    w->broker = this;
    w->pool = index;
    const uint64_t needed = pool.spec.count - pool.ready.size() - pool.refilling;
    w->count = static_cast<uint32_t>(
        std::clamp<uint64_t>(RefillWork::kBatchBytes / pool.spec.size, 1, needed));
    pool.refilling += w->count;
    int rc = uv_queue_work(
        &loop_, &w->req,
        [](uv_work_t* r) {
          LowerWorkerPriority();
          auto* w = static_cast<RefillWork*>(r->data);
          const PoolSpec& spec = w->broker->pools_[w->pool].spec;
          for (uint32_t i = 0; i < w->count; ++i) {
            auto mem = w->broker->backend_.Create({w->broker->MemoryName("membroker:pool"), spec.size, spec.policy, false});
            if (!mem.ok()) {
              w->failures = w->count - i;
              break;
            }
            w->created.push_back(std::move(*mem));
          }
        },
        [](uv_work_t* r, int) {
          std::unique_ptr<RefillWork> w(static_cast<RefillWork*>(r->data));
          Pool& pool = w->broker->pools_[w->pool];
          pool.refilling -= w->count;
          pool.refill_failures += w->failures;  // retried on the next refill
          if (w->broker->stopping_) return;
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

}  // namespace membroker::broker
