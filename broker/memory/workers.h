// Workers: libuv's thread pool creates large allocations, refills pools and
// returns freed pages to the kernel, so the loop keeps serving. Pool refills
// and single returns wait until takes and frees pause (--background-delay-ms),
// so a burst does not share the CPUs with the workers creating and zeroing
// memory behind it. Each work item is allocated by the loop, filled in on a
// worker, and completed back on the loop; if libuv refuses to queue one, the
// loop does the work itself rather than lose it.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "memory/backend.h"
#include "memory/pools.h"
#include "memory/memfd.h"
#include "membroker/status.h"

namespace membroker::broker {

// Worker threads create, zero and return memory: bulk work that must not take
// a CPU from the loop thread, which serves every client. Nice 10 per thread
// (Linux threads have their own nice value) gives them a tenth of a CPU's
// share against the loop; it does not make a woken loop or client run at
// once: on kernel 6.18 (EEVDF) a woken thread waited up to 2 ms for a
// worker's slice to end (docs/BENCHMARKS.md, the pooled 2 MiB row).
void LowerWorkerPriority();

// Freed allocations' memory, to be given back to the backend together on a worker.
struct ReturnBatch {
  uint64_t bytes = 0;
  std::vector<PhysicalMemory> memories;
  void Add(PhysicalMemory&& m) {
    bytes += m.size;
    memories.push_back(std::move(m));
  }
  bool empty() const { return memories.empty(); }
};

class Workers {
 public:
  Workers(uv_loop_t* loop, PhysicalBackend& backend, Pools& pools, uint32_t background_delay_ms)
      : loop_(loop), backend_(backend), pools_(pools), delay_ms_(background_delay_ms) {}
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  Status Init();

  using Created = std::function<void(Result<PhysicalMemory>)>;
  // Creates spec's memory on a worker; done() runs on the loop.
  void Create(MemorySpec spec, Created done);
  // Runs work on a worker, then done on the loop (both on the loop if libuv
  // refuses to queue it).
  void Run(std::function<void()> work, std::function<void()> done);
  // Closes the batch's memory on a worker now, counted in bytes_returning meanwhile.
  void Return(ReturnBatch batch);
  // Returns this memory with the next background run.
  void ReturnLater(PhysicalMemory&& m);
  // Schedules the background run - pool refills and deferred returns - once
  // takes and frees pause (at most ten pauses later).
  void Defer();
  void RunBackground();
  // Deferred returns go now; nothing runs in the background after this.
  void Stop();

  // Freed bytes not yet back with the kernel: on a worker, or waiting for a pause.
  uint64_t bytes_returning() const { return returning_ + deferred_.bytes; }

 private:
  struct MallocWork;
  struct ReturnWork;
  struct RunWork;

  uv_loop_t* loop_;
  PhysicalBackend& backend_;
  Pools& pools_;
  const uint32_t delay_ms_;
  uv_timer_t timer_{};
  bool stopping_ = false;
  ReturnBatch deferred_;   // frees waiting for a pause
  uint64_t deadline_ = 0;  // uv_now() by which they start; valid while the timer runs
  uint64_t returning_ = 0;  // bytes a worker is returning now
};

}  // namespace membroker::broker
