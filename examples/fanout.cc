// Fan-out through channels (docs/PIPELINE.md): a scheduler broadcasts every
// step's output to all its workers, as vLLM's shared-memory message queue
// does, then shares a batch of jobs among them (each job to exactly one).
// Workers are separate processes that read the chunks in place; every byte
// is checked.
//   fanout --socket PATH [--workers N] [--steps S] [--jobs J] [--kill-worker]
// --kill-worker: worker 0 stops after its third step, holding that step's
// chunk, and is SIGKILLed; the scheduler gets back what it held and had
// queued, and a replacement joins and takes the steps from there on.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "membroker/channel.h"
#include "membroker/client.h"

using namespace membroker;

namespace {

constexpr size_t kStepBytes = 256 << 10;
constexpr size_t kJobBytes = 4096;
std::string g_socket;

uint8_t Byte(uint64_t n, size_t i) { return static_cast<uint8_t>(n * 131 + i * 7); }
void Fill(void* p, size_t size, uint64_t n) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < size; ++i) b[i] = Byte(n, i);
}
bool Holds(const Chunk& c, uint64_t n) {
  const auto* b = static_cast<const uint8_t*>(c.data);
  for (size_t i = 0; i < c.size; ++i)
    if (b[i] != Byte(n, i)) return false;
  return true;
}

void Say(int fd, const std::string& line) { (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL); }
std::string Hear(int fd) {
  char buf[4096];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A worker: the steps (broadcast), then jobs (shared) until the scheduler
// closes that channel. Exit codes name the failed step.
int Worker(int ctl, int index, bool hold_and_wait) {
  auto c = Client::Connect({g_socket, "worker-" + std::to_string(index)});
  if (!c.ok()) return 10;
  SubscribeOptions o;
  o.lookup_timeout_ms = 10000;
  auto steps = ChannelSubscriber::Join(*c, "fanout/steps", o);
  auto jobs = ChannelSubscriber::Join(*c, "fanout/jobs", o);
  if (!steps.ok() || !jobs.ok()) return 11;
  Say(ctl, "joined");
  uint64_t got_steps = 0, first = 0;
  for (;;) {
    auto chunk = steps->Receive(30000);
    if (chunk.code() == ErrorCode::kNotConnected) break;
    if (!chunk.ok()) return 12;
    // The step number is the chunk's first 8 bytes; the rest is its pattern.
    uint64_t n = 0;
    std::memcpy(&n, chunk->data, sizeof(n));
    Chunk body = *chunk;
    body.data = static_cast<char*>(chunk->data) + 8;
    body.size -= 8;
    if (n == 0 || !Holds(body, n)) return 13;
    if (first == 0) first = n;
    ++got_steps;
    if (hold_and_wait && got_steps == 3) {
      Say(ctl, "holding");  // killed here, holding this step's chunk
      for (;;) ::pause();
    }
    if (!steps->Release(*chunk).ok()) return 14;
    if (n == UINT64_MAX) break;
  }
  uint64_t got_jobs = 0;
  for (;;) {
    auto chunk = jobs->Receive(30000);
    if (chunk.code() == ErrorCode::kNotConnected) break;
    if (!chunk.ok() || !Holds(*chunk, chunk->sequence)) return 15;
    ++got_jobs;
    (void)jobs->Release(*chunk);
  }
  Say(ctl, std::to_string(first) + " " + std::to_string(got_steps) + " " + std::to_string(got_jobs));
  return 0;
}

struct Proc {
  pid_t pid = 0;
  int ctl = -1;
};

Proc Spawn(int index, bool hold) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) std::exit(2);
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    ::_exit(Worker(sv[1], index, hold));
  }
  ::close(sv[1]);
  if (Hear(sv[0]) != "joined") {
    std::fprintf(stderr, "fanout: worker %d did not join\n", index);
    std::exit(3);
  }
  return {pid, sv[0]};
}

int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "fanout: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 3, steps = 60, jobs = 300;
  bool kill_worker = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) g_socket = argv[++i];
    else if (a == "--workers" && i + 1 < argc) workers = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--jobs" && i + 1 < argc) jobs = std::atoi(argv[++i]);
    else if (a == "--kill-worker") kill_worker = true;
  }
  if (g_socket.empty() || workers < 1 || workers > 16 || steps < 6 || jobs < 1) {
    std::fprintf(stderr, "usage: fanout --socket PATH [--workers 1-16] [--steps >=6] [--jobs N] [--kill-worker]\n");
    return 2;
  }
  auto c = Client::Connect({g_socket, "scheduler"});
  if (!c.ok()) return Fail("connect", c.status());
  ChannelOptions bo;
  bo.chunks = 8;
  bo.chunk_bytes = kStepBytes + 8;
  bo.queue_depth = 4;
  auto step_channel = ChannelPublisher::Create(*c, "fanout/steps", bo);
  ChannelOptions wo;
  wo.chunks = 16;
  wo.chunk_bytes = kJobBytes;
  wo.queue_depth = 4;
  wo.mode = ChannelMode::kWorkSharing;
  auto job_channel = ChannelPublisher::Create(*c, "fanout/jobs", wo);
  if (!step_channel.ok()) return Fail("create fanout/steps", step_channel.status());
  if (!job_channel.ok()) return Fail("create fanout/jobs", job_channel.status());

  std::vector<Proc> procs;
  for (int i = 0; i < workers; ++i) procs.push_back(Spawn(i, kill_worker && i == 0));
  if (Status st = step_channel->WaitForSubscribers(workers, 10000); !st.ok()) return Fail("workers", st);

  // Broadcast: every step's output to every worker, the step number first.
  int replacement_from = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t n = 1; n <= static_cast<uint64_t>(steps); ++n) {
    // (Before its queue of 4 fills: it reads no more after its third step.)
    if (kill_worker && n == 5) {
      if (Hear(procs[0].ctl) != "holding") return Fail("worker 0", Status(ErrorCode::kInternal, "did not hold"));
      ::kill(procs[0].pid, SIGKILL);
      ::waitpid(procs[0].pid, nullptr, 0);
      ::close(procs[0].ctl);
      const auto k0 = std::chrono::steady_clock::now();
      const size_t reaped = step_channel->Reap();
      (void)job_channel->Reap();  // no jobs for it either
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - k0).count();
      std::printf("fanout: worker 0 SIGKILLed holding a chunk: reaped %zu subscriber, %llu chunk references back "
                  "(held and queued) in %.2f ms\n", reaped,
                  static_cast<unsigned long long>(step_channel->stats().reclaimed), ms);
      procs[0] = Spawn(0, false);
      replacement_from = static_cast<int>(n);
      if (Status st = step_channel->WaitForSubscribers(workers, 10000); !st.ok()) return Fail("replacement", st);
    }
    auto chunk = step_channel->Loan(kStepBytes + 8, 10000);
    if (!chunk.ok()) return Fail("loan a step", chunk.status());
    std::memcpy(chunk->data, &n, sizeof(n));
    Fill(static_cast<char*>(chunk->data) + 8, kStepBytes, n);
    chunk->size = kStepBytes + 8;
    if (Status st = step_channel->Publish(*chunk, 10000); !st.ok()) return Fail("publish a step", st);
  }
  // The last step says the steps are over.
  {
    auto chunk = step_channel->Loan(8, 10000);
    if (!chunk.ok()) return Fail("loan the end", chunk.status());
    const uint64_t end = UINT64_MAX;
    std::memcpy(chunk->data, &end, sizeof(end));
    chunk->size = 8;
    if (Status st = step_channel->Publish(*chunk, 10000); !st.ok()) return Fail("publish the end", st);
  }
  const double broadcast_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Work sharing: each job to the least-loaded worker.
  for (int j = 0; j < jobs; ++j) {
    auto chunk = job_channel->Loan(kJobBytes, 10000);
    if (!chunk.ok()) return Fail("loan a job", chunk.status());
    Fill(chunk->data, kJobBytes, static_cast<uint64_t>(j) + 1);  // the channel numbers them from 1
    chunk->size = kJobBytes;
    if (Status st = job_channel->Publish(*chunk, 10000); !st.ok()) return Fail("publish a job", st);
  }
  *job_channel = ChannelPublisher();  // workers drain, then see it gone
  *step_channel = ChannelPublisher();

  int bad = 0;
  uint64_t jobs_done = 0;
  std::string split;
  for (int i = 0; i < workers; ++i) {
    unsigned long long first = 0, got_steps = 0, got_jobs = 0;
    std::sscanf(Hear(procs[i].ctl).c_str(), "%llu %llu %llu", &first, &got_steps, &got_jobs);
    int status = 0;
    ::waitpid(procs[i].pid, &status, 0);
    ::close(procs[i].ctl);
    // Everyone got every step from the one it joined at, through the end marker.
    const uint64_t from = (i == 0 && replacement_from) ? static_cast<uint64_t>(replacement_from) : 1;
    const uint64_t want = static_cast<uint64_t>(steps) - from + 2;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || first != from || got_steps != want) {
      std::fprintf(stderr, "fanout: worker %d: exit %d, steps %llu from %llu (want %llu from %llu)\n", i,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1, got_steps, first,
                   static_cast<unsigned long long>(want), static_cast<unsigned long long>(from));
      ++bad;
    }
    jobs_done += got_jobs;
    split += (i ? " " : "") + std::to_string(got_jobs);
  }
  std::printf("fanout: broadcast %d steps of %zu KiB to %d workers in %.1f ms, every byte checked%s\n", steps,
              kStepBytes >> 10, workers, broadcast_s * 1e3,
              replacement_from ? (" (worker 0's replacement from step " + std::to_string(replacement_from) + ")").c_str()
                               : "");
  std::printf("fanout: work sharing: %llu of %d jobs done, each once (per worker: %s)\n",
              static_cast<unsigned long long>(jobs_done), jobs, split.c_str());
  return bad == 0 && jobs_done == static_cast<uint64_t>(jobs) ? 0 : 1;
}
