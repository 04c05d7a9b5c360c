// Workers (workers.h).
#include "memory/workers.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "uv_status.h"

namespace membroker::broker {

// The loop runs work itself once the threads are closed (Stop): freed
// memory then goes back at once.
void Workers::RunIn(WorkerThreads::Lane lane, std::function<void()> work, std::function<void()> done) {
  if (!threads_.open()) {
    work();
    done();
    return;
  }
  threads_.Submit(lane, std::move(work), std::move(done));
}

void Workers::Run(std::function<void()> work, std::function<void()> done) {
  RunIn(WorkerThreads::Lane::kRequest, std::move(work), std::move(done));
}

void Workers::RunInBackground(std::function<void()> work, std::function<void()> done) {
  RunIn(WorkerThreads::Lane::kBackground, std::move(work), std::move(done));
}

Status Workers::Init() {
  MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(loop_, &timer_)));
  timer_.data = this;
  return threads_.Start(kThreads, kNice);
}

void Workers::Create(MemorySpec spec, Created done) {
  auto result = std::make_shared<std::optional<Result<PhysicalMemory>>>();
  Run([this, spec = std::move(spec), result] { *result = BackendFor(spec, backend_).Create(spec); },
      [result, done = std::move(done)] { done(std::move(**result)); });
}

void Workers::ReturnLater(PhysicalMemory&& m) {
  deferred_.Add(std::move(m));
  Defer();
}

void Workers::Defer() {
  if (delay_ms_ == 0 || stopping_) {
    RunBackground();
    return;
  }
  const uint64_t now = uv_now(loop_);
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&timer_))) deadline_ = now + 10 * uint64_t{delay_ms_};
  const uint64_t left = deadline_ > now ? deadline_ - now : 0;
  int rc = uv_timer_start(
      &timer_, [](uv_timer_t* t) { static_cast<Workers*>(t->data)->RunBackground(); },
      std::min<uint64_t>(left, delay_ms_), 0);
  if (rc != 0) RunBackground();  // no timer: do it now rather than never
}

void Workers::RunBackground() {
  uv_timer_stop(&timer_);
  pools_.Refill(*this);
  if (!deferred_.empty()) ReturnIn(WorkerThreads::Lane::kBackground, std::exchange(deferred_, ReturnBatch{}));
}

void Workers::Stop() {
  if (stopping_) return;
  stopping_ = true;
  pools_.Stop();
  RunBackground();  // deferred returns go now; refills do not (stopping)
  threads_.Close();  // what is queued still runs; the loop runs its completions
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

// Closing the last fd of 4 KiB pages frees them one by one, which takes
// milliseconds for a large allocation or for the thousands a crashed client
// may leave.
void Workers::Return(ReturnBatch batch) { ReturnIn(WorkerThreads::Lane::kRequest, std::move(batch)); }

void Workers::ReturnIn(WorkerThreads::Lane lane, ReturnBatch batch) {
  const uint64_t bytes = batch.bytes;
  returning_ += bytes;
  auto memories = std::make_shared<std::vector<PhysicalMemory>>(std::move(batch.memories));
  RunIn(
      lane,
      [this, memories] {
        for (auto& mem : *memories) BackendOf(mem, backend_).Release(std::move(mem));
        memories->clear();
      },
      [this, bytes] { returning_ -= bytes; });
}

}  // namespace membroker::broker
