// Where membroker's hand-off time goes: the same producer -> consumer flow as
// bench_handoff's "membroker" method, with each step timed on its own side
// (median over the iterations): the producer's export (local: it exported
// each buffer when it made it); the
// consumer's wake-up, import round trip, reserve, map, first read of every
// page, and teardown (unmap, release, one-way free). Beside it, the same
// read of a hand-rolled memfd mapping, so the fault cost is visible.
//   bench_handoff_steps --socket BROKER_SOCKET [--quick]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "membroker/client.h"
#include "payload.h"

using namespace membroker;
using bench::Median;

namespace {

using bench::NowNs;
using bench::Sum;
constexpr int kSteps = 7;
const char* kStepNames[kSteps] = {"export_us", "wakeup_us", "import_us", "reserve_us", "map_us", "read_us", "teardown_us"};

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--socket") && i + 1 < argc) socket = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  if (socket.empty()) return 2;
  for (size_t size : {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20}) {
    const int iterations = size >= (64u << 20) ? (quick ? 5 : 30) : (quick ? 40 : 400);
    int ctl[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl);
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {  // consumer: reports its step times per iteration
      ::close(ctl[0]);
      auto c = *Client::Connect({socket, "steps-consumer"});
      char buf[256];
      for (;;) {
        ssize_t n = ::recv(ctl[1], buf, sizeof(buf) - 1, 0);
        if (n <= 0) ::_exit(0);
        buf[n] = 0;
        unsigned long long sent = 0;
        char token[160] = {0};
        std::sscanf(buf, "%llu %159s", &sent, token);
        uint64_t t0 = NowNs();
        auto h = c.ImportFromShareableHandle(token);
        uint64_t t1 = NowNs();
        auto r = c.ReserveMemAddress(h->size());
        uint64_t t2 = NowNs();
        auto m = c.MapMem(r->base(), h->size(), 0, *h);
        uint64_t t3 = NowNs();
        uint64_t sum = Sum(m->data(), size);
        uint64_t t4 = NowNs();
        m = Mapping();
        r = Reservation();
        *h = PhysicalHandle();
        uint64_t t5 = NowNs();
        std::string line = std::to_string(t0 - sent) + " " + std::to_string(t1 - t0) + " " +
                           std::to_string(t2 - t1) + " " + std::to_string(t3 - t2) + " " +
                           std::to_string(t4 - t3) + " " + std::to_string(t5 - t4) + " " + std::to_string(sum);
        (void)!::send(ctl[1], line.data(), line.size(), 0);
      }
    }
    ::close(ctl[1]);
    auto producer = *Client::Connect({socket, "steps-producer"});
    std::vector<double> steps[kSteps];
    std::vector<double> memfd_read;
    for (int i = 0; i < iterations; ++i) {
      AllocationProp prop;
      prop.exported = true;  // as bench_handoff's producer: the export step is local
      prop.export_flags = kExportNoPidCheck;
      auto h = *producer.MallocPhysical(size, prop);
      auto r = *producer.ReserveMemAddress(h.size());
      auto m = *producer.MapMem(r.base(), h.size(), 0, h);
      std::memset(m.data(), i + 1, size);
      uint64_t t0 = NowNs();
      std::string token = *producer.ExportToShareableHandle(h, kExportNoPidCheck);
      uint64_t t1 = NowNs();
      std::string msg = std::to_string(t1) + " " + token;
      (void)!::send(ctl[0], msg.data(), msg.size(), 0);
      char buf[256];
      ssize_t n = ::recv(ctl[0], buf, sizeof(buf) - 1, 0);
      if (n <= 0) return 1;
      buf[n] = 0;
      unsigned long long v[7] = {0};
      std::sscanf(buf, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
      steps[0].push_back((t1 - t0) / 1e3);
      for (int k = 0; k < 6; ++k) steps[k + 1].push_back(v[k] / 1e3);
      // The floor for the read: a fresh memfd mapping of the same size, read once.
      int fd = ::memfd_create("steps", MFD_CLOEXEC);
      (void)!::ftruncate(fd, size);
      (void)!::fallocate(fd, 0, 0, size);
      void* w = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      std::memset(w, 1, size);
      ::munmap(w, size);
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      uint64_t r0 = NowNs();
      volatile uint64_t s = Sum(p, size);
      (void)s;
      memfd_read.push_back((NowNs() - r0) / 1e3);
      ::munmap(p, size);
      ::close(fd);
    }
    ::close(ctl[0]);
    ::waitpid(pid, nullptr, 0);
    std::printf("{\"bench\": \"handoff_steps\", \"size\": %zu, \"iterations\": %d", size, iterations);
    for (int k = 0; k < kSteps; ++k) std::printf(", \"%s\": %.1f", kStepNames[k], Median(steps[k]));
    std::printf(", \"memfd_read_us\": %.1f}\n", Median(memfd_read));
    std::fflush(stdout);
  }
  return 0;
}
