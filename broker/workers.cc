// Workers: libuv's thread pool creates large allocations, refills pools and
// returns freed pages to the kernel, so the loop keeps serving. Pool refills
// and single returns wait until takes and frees pause (--background-delay-ms).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "broker.h"
#include "log.h"
#include "workers.h"

namespace membroker::broker {

void LowerWorkerPriority() {
  thread_local bool lowered = false;
  if (!lowered) {
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    lowered = true;
  }
}

void Broker::CreateOnWorker(PendingMalloc pending, MemorySpec spec) {
  auto* w = new MallocWork();
  w->req.data = w;
  w->broker = this;
  w->pending = pending;
  w->spec = std::move(spec);
  if (Session* s = FindSession(pending.session_id)) ++s->inflight;
  int rc = uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<MallocWork*>(r->data);
        w->result = w->broker->backend_.Create(w->spec);
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<MallocWork> w(static_cast<MallocWork*>(r->data));
        if (Session* s = w->broker->FindSession(w->pending.session_id)) --s->inflight;
        if (!w->result) w->result = Status(ErrorCode::kInternal, "allocation was cancelled");
        w->broker->FinishMalloc(w->pending, std::move(*w->result));
      });
  if (rc != 0) {  // not queued: create it here rather than lose the request
    std::unique_ptr<MallocWork> owned(w);
    MB_WARN("worker_refused", "work=malloc error=\"%s\"", uv_strerror(rc));
    if (Session* s = FindSession(pending.session_id)) --s->inflight;
    FinishMalloc(pending, backend_.Create(owned->spec));
  }
}

void Broker::DeferBackground() {
  const uint64_t delay = options_.background_delay_ms;
  if (delay == 0 || stopping_) {
    RunBackground();
    return;
  }
  const uint64_t now = uv_now(&loop_);
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&background_timer_)))
    background_deadline_ = now + 10 * delay;
  const uint64_t left = background_deadline_ > now ? background_deadline_ - now : 0;
  int rc = uv_timer_start(
      &background_timer_, [](uv_timer_t* t) { static_cast<Broker*>(t->data)->RunBackground(); },
      std::min(left, delay), 0);
  if (rc != 0) RunBackground();  // no timer: do it now rather than never
}

void Broker::RunBackground() {
  uv_timer_stop(&background_timer_);
  for (size_t i = 0; i < pools_.size(); ++i) RefillPool(i);
  if (!deferred_returns_.empty()) {
    ReturnOnWorker(std::exchange(deferred_returns_, ReturnBatch{}));
  }
}

void Broker::ReturnOnWorker(ReturnBatch batch) {
  auto* w = new ReturnWork();
  w->req.data = w;
  w->broker = this;
  w->batch = std::move(batch);
  counters_.bytes_returning += w->batch.bytes;
  int rc = uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        LowerWorkerPriority();
        auto* w = static_cast<ReturnWork*>(r->data);
        for (auto& mem : w->batch.memories) w->broker->backend_.Release(std::move(mem));
        w->batch.memories.clear();
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<ReturnWork> w(static_cast<ReturnWork*>(r->data));
        w->broker->counters_.bytes_returning -= w->batch.bytes;
      });
  if (rc != 0) {  // not queued: give it back here
    std::unique_ptr<ReturnWork> owned(w);
    MB_WARN("worker_refused", "work=return error=\"%s\"", uv_strerror(rc));
    counters_.bytes_returning -= owned->batch.bytes;
    for (auto& mem : owned->batch.memories) backend_.Release(std::move(mem));
  }
}

}  // namespace membroker::broker
