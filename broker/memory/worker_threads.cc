// WorkerThreads (worker_threads.h).
#include "memory/worker_threads.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>

#include "membroker/ipc/syscall.h"
#include "uv_status.h"

namespace membroker::broker {

Status WorkerThreads::Start(unsigned count, int nice) {
  if (count == 0) return Status(ErrorCode::kParamInvalid, "worker threads: at least one");
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return ipc::ErrnoStatus("eventfd", "workers", errno);
  Status st = UvStatus("uv_poll_init", uv_poll_init(loop_, &poll_, event_fd_));
  if (!st.ok()) {
    ::close(event_fd_);
    event_fd_ = -1;
    return st;
  }
  poll_.data = this;
  open_ = true;  // from here on Close() releases the handle
  st = UvStatus("uv_poll_start", uv_poll_start(&poll_, UV_READABLE, [](uv_poll_t* p, int, int) {
                  static_cast<WorkerThreads*>(p->data)->RunCompletions();
                }));
  try {
    for (unsigned i = 0; st.ok() && i < count; ++i) threads_.emplace_back([this, nice] { ThreadMain(nice); });
  } catch (const std::system_error& e) {
    st = Status(ErrorCode::kResourceExhausted, std::string("cannot start a worker thread: ") + e.what());
  }
  if (!st.ok()) {
    Close();
    return st;
  }
  // Each thread sets its own nice value first thing; Start returns once all
  // have, so what the broker reports (and ps shows) is how they will run.
  std::unique_lock<std::mutex> lock(mu_);
  started_cv_.wait(lock, [this] { return started_ == threads_.size(); });
  return st;
}

WorkerThreads::~WorkerThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
  if (event_fd_ >= 0 && !handle_closing_) ::close(event_fd_);  // the loop never ran Close's end
}

void WorkerThreads::Submit(Lane lane, std::function<void()> work, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_[static_cast<int>(lane)].push_back({std::move(work), std::move(done)});
  }
  ++outstanding_;
  work_ready_.notify_one();
}

void WorkerThreads::ThreadMain(int nice) {
  // Linux threads have their own nice value; the loop keeps its own. (Raising
  // it needs no privilege, so this fails only for a broker started at more.)
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++started_;
  }
  started_cv_.notify_one();
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_ready_.wait(lock, [this] { return closing_ || !queued_[0].empty() || !queued_[1].empty(); });
      std::deque<Job>& lane = queued_[0].empty() ? queued_[1] : queued_[0];
      if (lane.empty()) return;  // closing, and nothing left to do
      job = std::move(lane.front());
      lane.pop_front();
    }
    job.work();
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_.push_back(std::move(job.done));
    }
    // After the lock: the write wakes the loop, which may take this CPU at
    // once, and then must find the completion without waiting for us. It
    // fails only with EAGAIN, when the counter is so full that the loop is
    // woken anyway.
    const uint64_t one = 1;
    (void)!::write(event_fd_, &one, sizeof(one));
  }
}

void WorkerThreads::RunCompletions() {
  uint64_t count = 0;
  (void)!::read(event_fd_, &count, sizeof(count));  // EAGAIN: an earlier call took this wake-up's count
  std::vector<std::function<void()>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished.swap(finished_);
  }
  for (auto& done : finished) {
    --outstanding_;
    done();
  }
  if (!open_ && outstanding_ == 0) Finish();
}

void WorkerThreads::Close() {
  if (!open_) return;
  open_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  work_ready_.notify_all();
  if (outstanding_ == 0) Finish();
}

void WorkerThreads::Finish() {
  if (handle_closing_) return;
  handle_closing_ = true;
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();  // each has run its last job and is returning
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), [](uv_handle_t* h) {
    auto* self = static_cast<WorkerThreads*>(h->data);
    ::close(self->event_fd_);
    self->event_fd_ = -1;
  });
}

}  // namespace membroker::broker
