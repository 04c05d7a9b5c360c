// Workers (workers.h).
#include "memory/workers.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "log.h"
#include "uv_status.h"

namespace membroker::broker {

void LowerWorkerPriority() {
  thread_local bool lowered = false;
  if (!lowered) {
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    lowered = true;
  }
}

struct Workers::MallocWork {
  uv_work_t req{};
  Workers* workers = nullptr;
  MemorySpec spec;
  Created done;
  std::optional<Result<PhysicalMemory>> result;
};

// Freed allocations whose memory a worker gives back: closing the last fd of
// 4 KiB pages frees them one by one, which takes milliseconds for a large
// allocation or for the thousands a crashed client may leave.
struct Workers::ReturnWork {
  uv_work_t req{};
  Workers* workers = nullptr;
  ReturnBatch batch;
};

struct Workers::RunWork {
  uv_work_t req{};
  std::function<void()> work;
  std::function<void()> done;
};

void Workers::Run(std::function<void()> work, std::function<void()> done) {
  auto* w = new RunWork();
  w->req.data = w;
  w->work = std::move(work);
  w->done = std::move(done);
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        static_cast<RunWork*>(r->data)->work();
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<RunWork> w(static_cast<RunWork*>(r->data));
        w->done();
      });
  if (rc != 0) {  // not queued: here, rather than never
    std::unique_ptr<RunWork> owned(w);
    MB_WARN("worker_refused", "work=run error=\"%s\"", uv_strerror(rc));
    owned->work();
    owned->done();
  }
}

Status Workers::Init() {
  MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(loop_, &timer_)));
  timer_.data = this;
  return Status::Ok();
}

void Workers::Create(MemorySpec spec, Created done) {
  auto* w = new MallocWork();
  w->req.data = w;
  w->workers = this;
  w->spec = std::move(spec);
  w->done = std::move(done);
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<MallocWork*>(r->data);
        w->result = BackendFor(w->spec, w->workers->backend_).Create(w->spec);
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<MallocWork> w(static_cast<MallocWork*>(r->data));
        if (!w->result) w->result = Status(ErrorCode::kInternal, "allocation was cancelled");
        w->done(std::move(*w->result));
      });
  if (rc != 0) {  // not queued: create it here rather than lose the request
    std::unique_ptr<MallocWork> owned(w);
    MB_WARN("worker_refused", "work=malloc error=\"%s\"", uv_strerror(rc));
    owned->done(BackendFor(owned->spec, backend_).Create(owned->spec));
  }
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
  pools_.Refill();
  if (!deferred_.empty()) Return(std::exchange(deferred_, ReturnBatch{}));
}

void Workers::Stop() {
  if (stopping_) return;
  stopping_ = true;
  pools_.Stop();
  RunBackground();  // deferred returns go now; refills do not (stopping)
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

void Workers::Return(ReturnBatch batch) {
  auto* w = new ReturnWork();
  w->req.data = w;
  w->workers = this;
  w->batch = std::move(batch);
  returning_ += w->batch.bytes;
  int rc = uv_queue_work(
      loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<ReturnWork*>(r->data);
        for (auto& mem : w->batch.memories) BackendOf(mem, w->workers->backend_).Release(std::move(mem));
        w->batch.memories.clear();
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<ReturnWork> w(static_cast<ReturnWork*>(r->data));
        w->workers->returning_ -= w->batch.bytes;
      });
  if (rc != 0) {  // not queued: give it back here
    std::unique_ptr<ReturnWork> owned(w);
    MB_WARN("worker_refused", "work=return error=\"%s\"", uv_strerror(rc));
    returning_ -= owned->batch.bytes;
    for (auto& mem : owned->batch.memories) BackendOf(mem, backend_).Release(std::move(mem));
  }
}

}  // namespace membroker::broker
