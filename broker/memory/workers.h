// Workers: worker threads (WorkerThreads) create large allocations, refill
// pools and return freed pages to the kernel, so the loop keeps serving. Pool
// refills and single returns wait until takes and frees pause
// (--background-delay-ms), so a burst does not share the CPUs with the workers
// creating and zeroing memory behind it. Each work item is made by the loop, done on a worker and
// completed back on the loop; once the threads are closed (Stop), the loop
// does the work itself.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "memory/backend.h"
#include "memory/pools.h"
#include "memory/memfd.h"
#include "memory/worker_threads.h"
#include "membroker/status.h"

namespace membroker::broker {

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
      : loop_(loop), backend_(backend), pools_(pools), delay_ms_(background_delay_ms), threads_(loop) {}
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  Status Init();
  // Threads (as many as libuv's pool had) at nice 10. Pool refills and
  // deferred returns go in their background lane (WorkerThreads::Lane).
  static constexpr unsigned kThreads = 4;
  static constexpr int kNice = 10;

  using Created = std::function<void(Result<PhysicalMemory>)>;
  // Creates spec's memory on a worker; done() runs on the loop.
  void Create(MemorySpec spec, Created done);
  // Runs work on a worker, then done on the loop (both on the loop, at once,
  // after Stop). RunInBackground: in the background lane.
  void Run(std::function<void()> work, std::function<void()> done);
  void RunInBackground(std::function<void()> work, std::function<void()> done);
  // Closes the batch's memory on a worker now, counted in bytes_returning meanwhile.
  void Return(ReturnBatch batch);
  // Returns this memory with the next background run.
  void ReturnLater(PhysicalMemory&& m);
  // Schedules the background run - pool refills and deferred returns - once
  // takes and frees pause (at most ten pauses later).
  void Defer();
  void RunBackground();
  // Deferred returns go now; nothing runs in the background after this, and
  // work queued from here on runs on the loop.
  void Stop();

  // Freed bytes not yet back with the kernel: on a worker, or waiting for a pause.
  uint64_t bytes_returning() const { return returning_ + deferred_.bytes; }

 private:
  void RunIn(WorkerThreads::Lane lane, std::function<void()> work, std::function<void()> done);
  void ReturnIn(WorkerThreads::Lane lane, ReturnBatch batch);

  uv_loop_t* loop_;
  PhysicalBackend& backend_;
  Pools& pools_;
  const uint32_t delay_ms_;
  uv_timer_t timer_{};
  bool stopping_ = false;
  ReturnBatch deferred_;   // frees waiting for a pause
  uint64_t deadline_ = 0;  // uv_now() by which they start; valid while the timer runs
  uint64_t returning_ = 0;  // bytes a worker is returning now
  WorkerThreads threads_;
};

}  // namespace membroker::broker
