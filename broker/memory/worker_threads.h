// WorkerThreads: the broker's own worker threads. Work runs on a thread; its
// completion runs on the loop, which an eventfd wakes.
//
// Not libuv's thread pool: libuv 1.44 (Debian's) signals a completion with
// uv_async_send, which marks the loop's async handle busy, writes the eventfd
// and only then marks it done. A worker preempted between the two - the write
// itself wakes the loop - leaves the loop spinning and yielding on the mark
// until that worker runs again. With nice-10 workers on 2 CPUs, in two runs of
// pooled 2 MiB takes outrunning their refills, the loop spent 880-990 us of
// CPU per take, a fifth of its perf samples in libuv's uv__async_spin, and one
// take in a hundred took 47 ms or more (other runs did not hit it). Here a
// worker queues its completion under a mutex and writes the eventfd after
// releasing it, so the loop never waits for a worker to be scheduled.
#pragma once

#include <uv.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "membroker/status.h"

namespace membroker::broker {

class WorkerThreads {
 public:
  explicit WorkerThreads(uv_loop_t* loop) : loop_(loop) {}
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;
  ~WorkerThreads();  // joins the threads if Close() did not

  // Starts `count` threads at `nice`: bulk work such as creating, zeroing and
  // returning memory gets a fraction of a CPU's share against the loop, which
  // serves every client. (It does not make a woken loop or client run at once:
  // on kernel 6.18's EEVDF a woken thread can wait for a worker's slice.)
  Status Start(unsigned count, int nice);
  // Whether Submit takes work: after Start, until Close.
  bool open() const { return open_; }
  // Runs work on a thread, then done on the loop. Only while open(). A free
  // thread takes the oldest work of the first lane before any of the second,
  // so a request's work never waits behind queued background work.
  enum class Lane { kRequest, kBackground };
  void Submit(Lane lane, std::function<void()> work, std::function<void()> done);
  // Takes no more work. The threads finish what is queued and the loop runs
  // its completions; then the threads are joined and the loop's handle closes.
  void Close();

  // Submitted and not yet completed on the loop.
  size_t outstanding() const { return outstanding_; }

 private:
  struct Job {
    std::function<void()> work, done;
  };
  void ThreadMain(int nice);
  void RunCompletions();  // on the loop, when the eventfd is readable
  void Finish();          // on the loop, once closed and nothing is outstanding

  uv_loop_t* loop_;
  uv_poll_t poll_{};
  int event_fd_ = -1;
  std::vector<std::thread> threads_;
  bool open_ = false;            // loop thread only
  size_t outstanding_ = 0;       // loop thread only
  bool handle_closing_ = false;  // loop thread only: Finish has run

  std::mutex mu_;
  std::condition_variable work_ready_;
  std::condition_variable started_cv_;
  size_t started_ = 0;                           // guarded by mu_: threads that set their nice value
  std::deque<Job> queued_[2];                    // guarded by mu_: by Lane
  std::vector<std::function<void()>> finished_;  // guarded by mu_: done callbacks for the loop
  bool closing_ = false;                         // guarded by mu_: a thread with nothing queued exits
};

}  // namespace membroker::broker
