// Work items that run on libuv's thread pool (workers.cc, pools.cc). Each is
// allocated by the loop, filled in on a worker, and completed (and freed)
// back on the loop; if libuv refuses to queue one, the loop does the work
// itself rather than lose it.
#pragma once

#include <uv.h>

#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "broker.h"

namespace membroker::broker {

// Worker threads create, zero and return memory: bulk work that must not take
// a CPU from the loop thread, which serves every client. Nice 10 per thread
// (Linux threads have their own nice value) lets the loop preempt them.
void LowerWorkerPriority();

// One large MallocRequest's memory, created on a worker.
struct MallocWork {
  uv_work_t req{};
  Broker* broker = nullptr;
  Broker::PendingMalloc pending;
  MemorySpec spec;
  std::optional<Result<ipc::PhysicalMemory>> result;
};

// Creates `count` allocations for one pool: up to 64 MiB of them per work
// item, so refilling a pool of small allocations costs one worker wake-up and
// one completion per batch rather than per allocation.
struct RefillWork {
  static constexpr uint64_t kBatchBytes = 64ull << 20;
  uv_work_t req{};
  Broker* broker = nullptr;
  size_t pool = 0;
  uint32_t count = 0;
  std::vector<ipc::PhysicalMemory> created;
  uint32_t failures = 0;
};

// Freed allocations whose memory a worker gives back: closing the last fd of
// 4 KiB pages frees them one by one, which takes milliseconds for a large
// allocation or for the thousands a crashed client may leave.
struct ReturnWork {
  uv_work_t req{};
  Broker* broker = nullptr;
  ReturnBatch batch;
};

}  // namespace membroker::broker
