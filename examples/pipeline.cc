// A four-process inference pipeline over broker memory:
//   source -> preprocess -> model -> sink
// The source makes synthetic 1 MiB "images", preprocess normalises each into a
// 4 MiB float tensor, the model multiplies it (as a 1024 x 1024 matrix) by a
// vector, and the sink checks every result against a reference it computes
// itself in double precision. Stages hand tensors over through TensorRings in
// published broker regions: zero copies. Shared counters and the sink's frame
// ledger live in a RegionHeap, so a restarted stage carries on where the dead
// one stopped. Beside the sink, a fifth process, the monitor, taps the model's
// results: the model also publishes each result on a channel
// (pipeline/results, drop-oldest), so a monitor that is slower than the
// pipeline (it checks every result it gets against the reference) sees the
// latest results and never holds the pipeline up; when the model is killed
// and restarted, the monitor joins the new model's channel. (--compare leaves
// the monitor out: the copy run has no counterpart of it.)
//   pipeline --socket PATH [--frames N] [--kill-stage K] [--copy | --compare]
// --kill-stage K (0-3) SIGKILLs stage K a third of the way through, waits for
// the broker to report the death, restarts it, and the run still accounts for
// every frame. --copy sends the same tensors through Unix sockets instead;
// --compare runs both and prints the speed-up.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <boost/interprocess/containers/vector.hpp>

#include "membroker/channel.h"
#include "membroker/client.h"
#include "membroker/region_heap.h"
#include "membroker/tensor_ring.h"

using namespace membroker;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kDim = 1024;
constexpr size_t kImageBytes = kDim * kDim;              // uint8
constexpr size_t kTensorBytes = kDim * kDim * 4;         // float
constexpr size_t kOutputBytes = kDim * 4;                // float
constexpr size_t kSlotBytes[3] = {kImageBytes, kTensorBytes, kOutputBytes};
constexpr uint32_t kSlots = 4;
constexpr const char* kStageNames[4] = {"source", "preprocess", "model", "sink"};
constexpr int kWaitMs = 20000;
constexpr const char* kResultsChannel = "pipeline/results";
// A result on the channel: the frame id, then the model's output.
struct TappedResult {
  uint64_t frame;
  float y[kDim];
};

struct StageStats {
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> restarts{0};
};
struct PipelineStats {
  StageStats stage[4];
};
using FrameLedger = boost::interprocess::vector<uint8_t, RegionHeap::Allocator<uint8_t>>;
struct SinkTotals {
  std::atomic<uint64_t> checked{0};
  std::atomic<uint64_t> mismatched{0};
  std::atomic<uint64_t> redelivered{0};  // frames seen again after a restart (not reprocessed)
};

uint8_t Pixel(uint64_t frame, size_t i) { return static_cast<uint8_t>(frame * 31 + i * 7 + (i >> 10) * 13); }
float Weight(size_t c) { return (static_cast<float>(c % 17) - 8.0f) / 8.0f; }

void MakeImage(uint64_t frame, uint8_t* out) {
  for (size_t i = 0; i < kImageBytes; ++i) out[i] = Pixel(frame, i);
}
void Normalise(const uint8_t* in, float* out) {
  for (size_t i = 0; i < kImageBytes; ++i) out[i] = (static_cast<float>(in[i]) - 127.5f) / 127.5f;
}
void MatVec(const float* m, float* y) {
  for (size_t r = 0; r < kDim; ++r) {
    float acc = 0;
    for (size_t c = 0; c < kDim; ++c) acc += m[r * kDim + c] * Weight(c);
    y[r] = acc;
  }
}
// The sink's reference: the same maths from the frame id, in double precision.
bool Check(uint64_t frame, const float* y) {
  for (size_t r = 0; r < kDim; ++r) {
    double acc = 0;
    for (size_t c = 0; c < kDim; ++c)
      acc += (static_cast<double>(Pixel(frame, r * kDim + c)) - 127.5) / 127.5 * ((double(c % 17) - 8.0) / 8.0);
    if (std::fabs(acc - y[r]) > 1e-2 + 1e-4 * std::fabs(acc)) return false;
  }
  return true;
}

// A published region mapped here.
struct Region {
  PhysicalHandle handle;
  Reservation range;
  Mapping map;
};
std::string RingName(int i) { return "pipeline/ring" + std::to_string(i); }
size_t RingBytes(int i) { return (TensorRing::BytesFor(kSlots, kSlotBytes[i]) + 4095) / 4096 * 4096; }
constexpr size_t kStatsBytes = 1 << 20;

Result<Region> MapNamed(Client& c, const std::string& name) {
  Region r;
  MB_ASSIGN_OR_RETURN(r.handle, c.Lookup(name, kWaitMs));
  MB_ASSIGN_OR_RETURN(r.range, c.ReserveMemAddress(r.handle.size()));
  MB_ASSIGN_OR_RETURN(r.map, c.MapMem(r.range.base(), r.handle.size(), 0, r.handle, kMapPopulate));
  return r;
}

int Die(const char* stage, const char* what, const Status& st) {
  std::fprintf(stderr, "%s: %s: %s\n", stage, what, st.ToString().c_str());
  return 1;
}

// One stage of the zero-copy pipeline, in its own process.
int RunStage(const std::string& socket, int stage, uint64_t frames) {
  const char* name = kStageNames[stage];
  auto c = Client::Connect({socket, std::string("pipeline-") + name});
  if (!c.ok()) return Die(name, "connect", c.status());
  auto stats_region = MapNamed(*c, "pipeline/stats");
  if (!stats_region.ok()) return Die(name, "lookup stats", stats_region.status());
  auto heap = RegionHeap::Open(stats_region->map.data(), kStatsBytes);
  if (!heap.ok()) return Die(name, "open heap", heap.status());
  auto all_stats = heap->Find<PipelineStats>("stages");
  if (!all_stats.ok()) return Die(name, "find stats", all_stats.status());
  StageStats* stats = all_stats->object->stage;
  Region in_region, out_region;
  TensorRing in, out;
  if (stage > 0) {
    auto r = MapNamed(*c, RingName(stage - 1));
    if (!r.ok()) return Die(name, "lookup input ring", r.status());
    in_region = std::move(*r);
    in = *TensorRing::Attach(in_region.map.data(), in_region.handle.size());
  }
  if (stage < 3) {
    auto r = MapNamed(*c, RingName(stage));
    if (!r.ok()) return Die(name, "lookup output ring", r.status());
    out_region = std::move(*r);
    out = *TensorRing::Attach(out_region.map.data(), out_region.handle.size());
  }
  // The model's results also go to the monitor, on a channel that never
  // makes the model wait: the monitor's oldest unread result is dropped.
  ChannelPublisher tap;
  if (stage == 2) {
    ChannelOptions o;
    o.chunks = 8;
    o.chunk_bytes = sizeof(TappedResult);
    o.queue_depth = 4;
    o.when_full = WhenFull::kDropOldest;
    auto p = ChannelPublisher::Create(*c, kResultsChannel, o);
    if (!p.ok()) return Die(name, "create the results channel", p.status());
    tap = std::move(*p);
  }
  auto t0 = Clock::now();
  uint64_t done_here = 0;
  if (stage == 0) {
    for (uint64_t f = out.last_published_frame() + 1; f <= frames; ++f) {  // resumes after a restart
      auto slot = out.AcquireForWrite(kWaitMs);
      if (!slot.ok()) return Die(name, "acquire", slot.status());
      MakeImage(f, static_cast<uint8_t*>(slot->data));
      (void)out.Publish(*slot, f, kImageBytes);
      stats[0].frames++;
      stats[0].bytes_out += kImageBytes;
      ++done_here;
    }
  } else {
    FrameLedger* ledger = nullptr;
    SinkTotals* totals = nullptr;
    if (stage == 3) {
      auto l = heap->Find<FrameLedger>("sink_ledger");
      auto t = heap->Find<SinkTotals>("sink_totals");
      if (!l.ok()) return Die(name, "find ledger", l.status());
      if (!t.ok()) return Die(name, "find totals", t.status());
      ledger = l->object;
      totals = t->object;
    }
    for (;;) {
      auto slot = in.AcquireForRead(kWaitMs);
      if (!slot.ok()) return Die(name, "acquire input", slot.status());
      const uint64_t f = slot->frame_id;
      bool already = stage < 3 ? f <= out.last_published_frame() : (*ledger)[f] != 0;
      if (already) {
        if (stage == 3) totals->redelivered++;
      } else if (stage < 3) {
        auto o = out.AcquireForWrite(kWaitMs);
        if (!o.ok()) return Die(name, "acquire output", o.status());
        if (stage == 1)
          Normalise(static_cast<const uint8_t*>(slot->data), static_cast<float*>(o->data));
        else
          MatVec(static_cast<const float*>(slot->data), static_cast<float*>(o->data));
        if (stage == 2) {
          // Every chunk free or queued to the monitor (at most 5 of 8): a loan never waits long.
          auto chunk = tap.Loan(sizeof(TappedResult), kWaitMs);
          if (!chunk.ok()) return Die(name, "loan a results chunk", chunk.status());
          auto* r = static_cast<TappedResult*>(chunk->data);
          r->frame = f;
          std::memcpy(r->y, o->data, kOutputBytes);
          chunk->size = sizeof(TappedResult);
          if (Status st = tap.Publish(*chunk); !st.ok()) return Die(name, "publish a result", st);
        }
        (void)out.Publish(*o, f, kSlotBytes[stage]);
        stats[stage].frames++;
        stats[stage].bytes_out += kSlotBytes[stage];
        ++done_here;
      } else {
        if (!Check(f, static_cast<const float*>(slot->data))) totals->mismatched++;
        totals->checked++;
        (*ledger)[f] = 1;
        stats[3].frames++;
        ++done_here;
      }
      (void)in.Release(*slot);
      if (f == frames) break;
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("  %-10s pid %-7d %4llu frames here, %6.1f frames/s\n", name, static_cast<int>(::getpid()),
              static_cast<unsigned long long>(done_here), done_here / secs);
  std::fflush(stdout);
  return 0;
}

// The monitor: takes the model's results off the channel, checks each one
// against the reference, and rejoins when the model's channel goes (the model
// was killed, or finished). It ends with the last frame, or once `done` (the
// pipeline's end of a pipe) closes; it succeeds when it checked some results
// and none was wrong (which ones it sees depends on its speed).
int RunMonitor(const std::string& socket, uint64_t frames, int done) {
  auto c = Client::Connect({socket, "pipeline-monitor"});
  if (!c.ok()) return Die("monitor", "connect", c.status());
  auto pipeline_done = [&] {
    pollfd p{done, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  };
  uint64_t checked = 0, mismatched = 0, joins = 0, last = 0;
  std::vector<bool> seen(frames + 1);  // a restarted model may publish a frame again
  ChannelSubscriber sub;
  bool joined = false;
  while (last != frames) {
    if (!joined) {
      auto j = ChannelSubscriber::Join(*c, kResultsChannel, {.lookup_timeout_ms = 100});
      if (!j.ok()) {
        if (j.code() != ErrorCode::kTimeout && j.code() != ErrorCode::kNotFound &&
            j.code() != ErrorCode::kNotConnected)
          return Die("monitor", "join", j.status());
        if (pipeline_done()) break;
        // NOT_CONNECTED: the name is still the dead model's; the broker drops it shortly.
        if (j.code() == ErrorCode::kNotConnected) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      sub = std::move(*j);
      joined = true;
      ++joins;
    }
    auto got = sub.Receive(100);
    if (got.ok()) {
      const auto* r = static_cast<const TappedResult*>(got->data);
      const uint64_t f = r->frame;
      if (got->size != sizeof(TappedResult) || f == 0 || f > frames)
        return Die("monitor", "a result", Status(ErrorCode::kProtocolError, "a result of a wrong size or frame id"));
      mismatched += !Check(f, r->y);
      checked += !seen[f];
      seen[f] = true;
      last = f;
      (void)sub.Release(*got);
    } else if (got.code() == ErrorCode::kNotConnected) {
      sub = ChannelSubscriber();  // the model went: join its successor's channel
      joined = false;
    } else if (got.code() != ErrorCode::kTimeout) {
      return Die("monitor", "receive", got.status());
    } else if (pipeline_done()) {
      break;
    }
  }
  std::printf("  monitor    pid %-7d %4llu results from channel %s, every byte checked: %llu mismatched; "
              "%llu frames not seen (dropped while it checked, or published before it joined); joined %llu time(s)\n",
              static_cast<int>(::getpid()), static_cast<unsigned long long>(checked), kResultsChannel,
              static_cast<unsigned long long>(mismatched), static_cast<unsigned long long>(frames - checked),
              static_cast<unsigned long long>(joins));
  std::fflush(stdout);
  return mismatched == 0 && checked > 0 ? 0 : 1;
}

pid_t StartStage(const std::string& socket, int stage, uint64_t frames) {
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(RunStage(socket, stage, frames));
  return pid;
}

// The zero-copy run: creates and publishes the regions, starts the stages,
// optionally kills and restarts one, and reports.
int RunZeroCopy(const std::string& socket, uint64_t frames, int kill_stage, bool monitor_on, double* fps) {
  auto c = Client::Connect({socket, "pipeline"});
  if (!c.ok()) return Die("pipeline", "connect", c.status());
  if (Status st = c->Subscribe("pipeline/"); !st.ok()) return Die("pipeline", "subscribe", st);
  std::vector<Region> regions(4);
  std::vector<TensorRing> rings(3);
  for (int i = 0; i < 4; ++i) {
    size_t bytes = i < 3 ? RingBytes(i) : kStatsBytes;
    auto h = c->MallocPhysical(bytes);
    if (!h.ok()) return Die("pipeline", "MallocPhysical", h.status());
    regions[i].handle = std::move(*h);
    regions[i].range = *c->ReserveMemAddress(regions[i].handle.size());
    regions[i].map = *c->MapMem(regions[i].range.base(), regions[i].handle.size(), 0, regions[i].handle);
    if (i < 3) rings[i] = *TensorRing::Create(regions[i].map.data(), regions[i].handle.size(), kSlots, kSlotBytes[i]);
  }
  auto heap = RegionHeap::Create(regions[3].map.data(), kStatsBytes);
  if (!heap.ok()) return Die("pipeline", "heap", heap.status());
  auto all_stats = heap->Construct<PipelineStats>("stages");
  auto made_ledger = heap->Construct<FrameLedger>("sink_ledger", frames + 1, uint8_t{0}, heap->allocator<uint8_t>());
  auto made_totals = heap->Construct<SinkTotals>("sink_totals");
  if (!all_stats.ok()) return Die("pipeline", "heap objects", all_stats.status());
  if (!made_ledger.ok()) return Die("pipeline", "heap objects", made_ledger.status());
  if (!made_totals.ok()) return Die("pipeline", "heap objects", made_totals.status());
  StageStats* stats = all_stats->object->stage;
  FrameLedger* ledger = made_ledger->object;
  SinkTotals* totals = made_totals->object;
  for (int i = 0; i < 3; ++i) (void)c->Publish(RingName(i), regions[i].handle);
  (void)c->Publish("pipeline/stats", regions[3].handle);

  auto t0 = Clock::now();
  int done_pipe[2];
  if (::pipe2(done_pipe, O_CLOEXEC) != 0) return Die("pipeline", "pipe", Status(ErrorCode::kInternal, "pipe2"));
  std::fflush(stdout);
  const pid_t monitor = monitor_on ? ::fork() : -1;
  if (monitor == 0) {
    ::close(done_pipe[1]);
    ::_exit(RunMonitor(socket, frames, done_pipe[0]));
  }
  ::close(done_pipe[0]);
  if (monitor_on && monitor < 0) return Die("pipeline", "fork the monitor", Status(ErrorCode::kInternal, "fork"));
  pid_t pids[4];
  for (int s = 0; s < 4; ++s) pids[s] = StartStage(socket, s, frames);
  if (kill_stage >= 0) {
    // Wait until the stage is a third of the way through, then SIGKILL it.
    const TensorRing& watch = rings[kill_stage < 3 ? kill_stage : 2];
    while ((kill_stage < 3 ? watch.published() : watch.released()) < frames / 3)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::kill(pids[kill_stage], SIGKILL);
    ::waitpid(pids[kill_stage], nullptr, 0);
    std::printf("  killed %s (pid %d) with SIGKILL after %llu of its frames\n", kStageNames[kill_stage],
                static_cast<int>(pids[kill_stage]),
                static_cast<unsigned long long>(stats[kill_stage].frames.load()));
    // The broker reports the death to subscribers of "pipeline/".
    for (bool reported = false; !reported;) {
      auto ev = c->WaitEvents(kWaitMs);
      if (!ev.ok() || ev->events.empty()) return Die("pipeline", "waiting for the death report", ev.status());
      for (const auto& e : ev->events)
        if (e.kind == NameEventKind::kHolderDied && e.pid == pids[kill_stage]) {
          std::printf("  broker: holder of %s died (pid %d); restarting %s\n", e.name.c_str(),
                      static_cast<int>(e.pid), kStageNames[kill_stage]);
          reported = true;
          break;
        }
    }
    stats[kill_stage].restarts++;
    pids[kill_stage] = StartStage(socket, kill_stage, frames);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *fps = frames / secs;
  ::close(done_pipe[1]);  // the monitor stops waiting for results
  if (monitor > 0) {
    int monitor_status = 0;
    ::waitpid(monitor, &monitor_status, 0);
    failed += !(WIFEXITED(monitor_status) && WEXITSTATUS(monitor_status) == 0);
  }
  uint64_t lost = 0;
  std::string lost_ids;
  for (uint64_t f = 1; f <= frames; ++f)
    if ((*ledger)[f] == 0) {
      ++lost;
      if (lost <= 10) lost_ids += " " + std::to_string(f);
    }
  uint64_t moved = 0;
  for (int s = 0; s < 3; ++s) moved += stats[s].bytes_out.load();
  std::printf("  %llu frames in %.2f s: %.1f frames/s; %.1f MiB of tensors handed over with zero copies\n",
              static_cast<unsigned long long>(frames), secs, *fps, moved / 1048576.0);
  std::printf("  sink: %llu checked once, %llu mismatched, %llu lost%s, %llu redelivered after a restart (skipped)\n",
              static_cast<unsigned long long>(totals->checked.load()),
              static_cast<unsigned long long>(totals->mismatched.load()), static_cast<unsigned long long>(lost),
              lost_ids.empty() ? "" : (" (ids" + lost_ids + ")").c_str(),
              static_cast<unsigned long long>(totals->redelivered.load()));
  for (int i = 0; i < 3; ++i) (void)c->Unpublish(RingName(i));
  (void)c->Unpublish("pipeline/stats");
  const bool ok = failed == 0 && lost == 0 && totals->mismatched == 0 && totals->checked == frames;
  return ok ? 0 : 1;
}

// --copy: the same stages, tensors copied through Unix stream sockets.
bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= r;
  }
  return true;
}
bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = ::write(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= r;
  }
  return true;
}

int CopyStage(int stage, uint64_t frames, int in_fd, int out_fd) {
  std::vector<char> in(stage > 0 ? kSlotBytes[stage - 1] : 0), out(stage < 3 ? kSlotBytes[stage] : 0);
  uint64_t bad = 0;
  for (uint64_t f = 1; f <= frames; ++f) {
    if (stage > 0 && !ReadAll(in_fd, in.data(), in.size())) return 1;
    if (stage == 0) MakeImage(f, reinterpret_cast<uint8_t*>(out.data()));
    if (stage == 1) Normalise(reinterpret_cast<uint8_t*>(in.data()), reinterpret_cast<float*>(out.data()));
    if (stage == 2) MatVec(reinterpret_cast<float*>(in.data()), reinterpret_cast<float*>(out.data()));
    if (stage == 3) bad += !Check(f, reinterpret_cast<float*>(in.data()));
    if (stage < 3 && !WriteAll(out_fd, out.data(), out.size())) return 1;
  }
  return bad == 0 ? 0 : 1;
}

int RunCopy(uint64_t frames, double* fps) {
  int links[3][2];
  for (auto& l : links)
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, l) != 0) return 1;
  auto t0 = Clock::now();
  std::vector<pid_t> pids;
  std::fflush(stdout);
  for (int s = 0; s < 4; ++s) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(CopyStage(s, frames, s > 0 ? links[s - 1][1] : -1, s < 3 ? links[s][0] : -1));
    pids.push_back(pid);
  }
  for (auto& l : links) {
    ::close(l[0]);
    ::close(l[1]);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  *fps = frames / std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("  %llu frames through Unix sockets: %.1f frames/s, %.1f MiB copied%s\n",
              static_cast<unsigned long long>(frames), *fps,
              frames * (kImageBytes + kTensorBytes + kOutputBytes) / 1048576.0,
              failed ? " - A STAGE FAILED" : "");
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  uint64_t frames = 120;
  int kill_stage = -1;
  bool copy = false, compare = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) socket = argv[++i];
    else if (a == "--frames" && i + 1 < argc) frames = std::stoull(argv[++i]);
    else if (a == "--kill-stage" && i + 1 < argc) kill_stage = std::stoi(argv[++i]);
    else if (a == "--copy") copy = true;
    else if (a == "--compare") compare = true;
  }
  if ((socket.empty() && !copy) || frames < 3 || kill_stage < -1 || kill_stage > 3 || (copy && kill_stage >= 0)) {
    std::fprintf(stderr,
                 "usage: pipeline --socket PATH [--frames N>=3] [--kill-stage 0-3] [--copy | --compare]\n");
    return 2;
  }
  double zero_copy_fps = 0, copy_fps = 0;
  int rc = 0;
  if (!copy) {
    std::printf("pipeline: %llu frames, zero-copy through broker memory%s\n",
                static_cast<unsigned long long>(frames),
                kill_stage >= 0 ? (std::string(", killing ") + kStageNames[kill_stage]).c_str() : "");
    // --compare: without the monitor, which the copy run has no counterpart of.
    rc |= RunZeroCopy(socket, frames, kill_stage, /*monitor_on=*/!compare, &zero_copy_fps);
  }
  if (copy || compare) {
    std::printf("pipeline: %llu frames, copied through Unix sockets\n", static_cast<unsigned long long>(frames));
    rc |= RunCopy(frames, &copy_fps);
  }
  if (compare && copy_fps > 0)
    std::printf("pipeline: zero-copy %.1f frames/s vs copy %.1f frames/s: %.2fx\n", zero_copy_fps, copy_fps,
                zero_copy_fps / copy_fps);
  std::printf("pipeline: %s\n", rc == 0 ? "ok" : "FAILED");
  return rc;
}
