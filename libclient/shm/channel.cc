// Channels (membroker/channel.h): the publisher and the subscribers over the
// shared control block whose layout membroker/ipc/channel_layout.h describes. A chunk is
// free when its `waiting` word is 0; each release clears one bit, so whoever
// cleans up after a dead subscriber clears that subscriber's bit on every
// chunk and gets back exactly what it held, wherever it died.
#include "membroker/channel.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "shm/channel_view.h"
#include "shm/channel_wake.h"
#include "shm/futex.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/unique_fd.h"

namespace membroker {

namespace {

using namespace detail::channel;  // the shared layout (ipc/channel_layout.h, shm/channel_view.h)
using Clock = std::chrono::steady_clock;
// A publisher waiting for chunks or room re-checks its subscribers' pidfds
// this often, so a dead subscriber's chunks come back while it waits.
constexpr auto kReapSlice = std::chrono::milliseconds(2);
// A subscriber waiting on an empty queue re-checks the publisher this often.
constexpr auto kPublisherCheck = std::chrono::milliseconds(10);
// A queue whose head moves under us is looked at again; past the caller's
// deadline at most this many more times.
constexpr uint32_t kLooksPastDeadline = 64;

// One allocation of a channel, mapped here whole and populated (so no
// hand-off pays a page fault).
struct Mapped {
  PhysicalHandle handle;
  Reservation range;
  Mapping map;
  Status MapAll(Client& client) {
    MB_ASSIGN_OR_RETURN(range, client.ReserveMemAddress(handle.size()));
    MB_ASSIGN_OR_RETURN(map, client.MapMem(range.base(), handle.size(), 0, handle, kMapPopulate));
    return Status::Ok();
  }
};

// A channel's two allocations. Shared: KeepMapped hands out owners, so a
// view of a chunk (a binding's) keeps them mapped past Leave or destruction.
struct Mappings {
  Mapped control, data;
};

void Wake(std::atomic<uint32_t>* word) {
  word->fetch_add(1);
  detail::FutexWakeAll(word);
}

// Who waits on a signal word: nobody, a sleeper (futex), a spinner, which
// only needs the word to move (no system call), or an event loop polling a
// subscriber's wake fd (a datagram to it: channel_wake.h).
enum Waiting : uint32_t { kNobody = 0, kSleeper = 1, kSpinner = 2, kWakeFd = 3 };
uint32_t WaiterFor(WakeMode wake) { return wake == WakeMode::kFutex ? kSleeper : kSpinner; }

// Takes the waiter's mark from `waiting`: who waited, or kNobody (nobody
// did, or an earlier signal took the mark). The first signal takes it, so the
// signals that follow while the waiter wakes up (microseconds, when its CPU
// was idle) cost no more system calls: a waiter marks itself again before it
// next sleeps or spins. Each mark has one waiter.
uint32_t TakeWaiter(std::atomic<uint32_t>& waiting) {
  if (waiting.load() == kNobody) return kNobody;  // the common case: a plain read
  return waiting.exchange(kNobody);
}

// Moves *word for the waiter `who` (TakeWaiter's): a sleeper needs the futex
// wake too, a spinner only the word to move.
void Nudge(std::atomic<uint32_t>* word, uint32_t who) {
  if (who == kNobody) return;
  word->fetch_add(1);
  if (who == kSleeper) detail::FutexWakeAll(word);
}

// Tells whoever waits on *word that something changed.
void Signal(std::atomic<uint32_t>* word, std::atomic<uint32_t>& waiting) { Nudge(word, TakeWaiter(waiting)); }

// Tells the subscribers in `targets` that their queues have more. The
// sleepers of a broadcast channel share one word, so a single system call
// wakes every one, before the first woken can take the publisher's CPU
// (with one FUTEX_WAKE per sleeper it could, mid-loop). With 8 sleeping
// subscribers on 2 CPUs, 1 MiB hand-offs took a median 0.93x as long as with
// a word each (10 paired runs; docs/PIPELINE.md).
void SignalSubscribers(const View& v, uint64_t targets) {
  bool wake_sleepers = false;
  for (uint64_t rest = targets; rest != 0; rest &= rest - 1) {
    SlotHeader& q = v.slot(static_cast<uint32_t>(std::countr_zero(rest)));
    const uint32_t who = TakeWaiter(q.subscriber_waiting);
    if (who == kWakeFd) detail::SendChannelWake(q.pid.load(), q.wake_nonce.load());
    else if (who == kSleeper && v.broadcast) wake_sleepers = true;
    else Nudge(&q.data_signal, who);
  }
  if (wake_sleepers) Wake(&v.header()->sleepers_signal);
}

// Waits for *word to move from `seen` (futex) or spins a little (poll), at
// most until deadline.
void WaitFor(WakeMode wake, std::atomic<uint32_t>* word, uint32_t seen, Clock::time_point deadline,
             Clock::duration slice) {
  const auto until = std::min(deadline, Clock::now() + slice);
  if (wake == WakeMode::kFutex) {
    detail::FutexWait(word, seen, until - Clock::now());
    return;
  }
  // Spinning, with a yield about every microsecond (16 turns) so a waiter
  // never starves the process it waits for when there are more of them than
  // CPUs: with 8 polling subscribers on 2 CPUs a yield every 256 turns made
  // the last one see a 4 KiB chunk 60-76 us after it was published, every 16
  // turns 21 us (bench_channel). With a CPU of its own, a yield finds nothing
  // else to run and returns.
  for (uint32_t spins = 1; word->load(std::memory_order_acquire) == seen && Clock::now() < until; ++spins) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (spins % 16 == 0) sched_yield();
  }
}

// Clears slot s's bit on every chunk; how many chunks it was on. Wakes a
// publisher waiting for chunks if any came free.
size_t ClearBit(const View& v, uint32_t s) {
  const uint64_t bit = uint64_t{1} << s;
  size_t cleared = 0;
  bool freed = false;
  for (uint32_t i = 0; i < v.layout.chunks; ++i) {
    std::atomic<uint64_t>& w = v.meta(i).waiting;
    if ((w.load(std::memory_order_relaxed) & bit) == 0) continue;
    const uint64_t before = w.fetch_and(~bit);
    if (before & bit) {
      ++cleared;
      freed |= (before & ~bit) == 0;
    }
  }
  if (freed) Signal(&v.header()->free_signal, v.header()->publisher_waiting);
  return cleared;
}

}  // namespace

// ---- the publisher ---------------------------------------------------------------

class ChannelPublisher::Impl {
 public:
  Client client;  // shares the caller's connection
  std::string name;
  ChannelOptions options;
  std::shared_ptr<Mappings> maps = std::make_shared<Mappings>();
  Mapped& control = maps->control;
  Mapped& data = maps->data;
  View v;
  bool published = false;  // both names are ours to take back
  uint32_t next_worker = 0;  // work sharing's round robin
  uint32_t cursor = 0;          // where Loan looks next, after the chunk published last
  uint32_t last_published = 0;
  uint64_t sequence = 0;
  std::set<uint32_t> loaned;
  ChannelStats counts;
  // A count goes up here, and its copy in the header (for `membrokerctl list
  // channels`) follows.
  void Count(uint64_t ChannelStats::*field, std::atomic<uint64_t> Header::*shared, uint64_t n = 1) {
    counts.*field += n;
    (v.header()->*shared).store(counts.*field, std::memory_order_relaxed);
  }
  // What this publisher knows of each slot's process, to notice its death.
  struct Known {
    uint32_t generation = UINT32_MAX;
    pid_t pid = 0;
    ipc::UniqueFd pidfd;
  };
  Known known[kMaxChannelSubscribers];

  ~Impl() {
    if (!published) return;
    v.header()->closed.store(1);
    for (uint32_t s = 0; s < kMaxChannelSubscribers; ++s) {
      Wake(&v.slot(s).data_signal);
      if (v.slot(s).state.load() == kActive) detail::SendChannelWake(v.slot(s).pid.load(), v.slot(s).wake_nonce.load());
    }
    Wake(&v.header()->sleepers_signal);
    (void)client.Unpublish(name + "/chunks");
    (void)client.Unpublish(name);
  }

  bool Dead(uint32_t s) {
    SlotHeader& slot = v.slot(s);
    Known& k = known[s];
    const uint32_t generation = slot.generation.load();
    const pid_t pid = slot.pid.load();
    if (k.generation != generation || k.pid != pid) {
      k.generation = generation;
      k.pid = pid;
      k.pidfd.reset();
      if (pid <= 0) return false;  // still joining: its pid comes next
      auto fd = ipc::PidfdOpenIfSupported(pid);
      if (fd.code() == ErrorCode::kNotFound) return true;  // no such process
      if (fd.ok()) k.pidfd = std::move(*fd);
      // (Out of fds, or no pidfds: the pid itself is checked each time.)
    }
    if (k.pidfd.valid()) return !ipc::PidfdAlive(k.pidfd.get());
    return ::kill(pid, 0) != 0 && errno == ESRCH;
  }

  size_t Reap() {
    size_t reaped = 0;
    for (uint32_t s = 0; s < kMaxChannelSubscribers; ++s) {
      SlotHeader& slot = v.slot(s);
      const uint32_t state = slot.state.load();
      if (state == kFree || !Dead(s)) continue;
      // Gone: no more chunks for it, and back what it held or had queued.
      v.header()->active.fetch_and(~(uint64_t{1} << s));
      if (options.mode == ChannelMode::kWorkSharing) Redeliver(s);
      Count(&ChannelStats::reclaimed, &Header::reclaimed, ClearBit(v, s));
      slot.head.store(0);
      slot.tail.store(0);
      slot.pid.store(0);
      slot.wake_nonce.store(0);
      slot.generation.fetch_add(1);
      slot.state.store(kFree);
      Count(&ChannelStats::reaped, &Header::reaped);
      ++reaped;
    }
    return reaped;
  }

  // Work sharing: what a dead subscriber had queued but not taken goes to the
  // live ones with room (the new bit is set before the dead one is cleared,
  // so the chunk is never free in between); what finds no room is given back.
  void Redeliver(uint32_t dead) {
    SlotHeader& from = v.slot(dead);
    const uint64_t tail = from.tail.load();
    for (uint64_t head = from.head.load(); head != tail && tail - head <= v.layout.queue_depth;) {
      const uint32_t i = v.entry(from, head).load();
      if (!from.head.compare_exchange_strong(head, head + 1)) continue;
      ++head;
      if (i >= v.layout.chunks) continue;  // not a chunk: nothing to pass on
      const uint64_t target = LeastLoaded(v.active());
      if (target == 0) return;
      SlotHeader& to = v.slot(static_cast<uint32_t>(std::countr_zero(target)));
      const uint64_t to_tail = to.tail.load();
      if (to_tail - to.head.load() >= v.layout.queue_depth) continue;
      v.meta(i).waiting.fetch_or(target);
      v.entry(to, to_tail).store(i);
      to.tail.store(to_tail + 1);
      SignalSubscribers(v, target);
      Count(&ChannelStats::redelivered, &Header::redelivered);
    }
  }

  Result<Chunk> Loan(size_t bytes, int timeout_ms) {
    if (bytes > v.layout.chunk_bytes)
      return Status(ErrorCode::kParamInvalid, "a chunk holds at most " + std::to_string(v.layout.chunk_bytes) +
                                                  " bytes; " + std::to_string(bytes) + " asked");
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
    Header* h = v.header();
    for (;;) {
      // The chunk published last first: when it has come back (one chunk in
      // flight, as in a stage-by-stage pipeline) it is still in both sides'
      // caches and TLBs, as a pool's free list hands out the last one freed.
      // (Only taking chunks in turn made every 1 MiB hand-off read a chunk
      // last touched 16 hand-offs ago.) Otherwise the next free one in turn.
      for (uint32_t n = 0; n <= v.layout.chunks; ++n) {
        const uint32_t i = n == 0 ? last_published : (cursor + n - 1) % v.layout.chunks;
        uint64_t expected = 0;
        if (v.meta(i).waiting.load(std::memory_order_relaxed) == 0 &&
            v.meta(i).waiting.compare_exchange_strong(expected, kLoaned)) {
          if (n != 0) cursor = i + 1;
          loaned.insert(i);
          return Chunk{i, v.chunk(i), v.layout.chunk_bytes, bytes, 0};
        }
      }
      if (Reap() > 0) continue;
      if (Clock::now() >= deadline)
        return Status(ErrorCode::kTimeout, "every chunk of channel \"" + name + "\" is still in use after " +
                                               std::to_string(timeout_ms) + " ms");
      h->publisher_waiting.store(WaiterFor(options.wake));
      const uint32_t seen = h->free_signal.load();
      bool any_free = false;
      for (uint32_t i = 0; i < v.layout.chunks && !any_free; ++i) any_free = v.meta(i).waiting.load() == 0;
      if (!any_free) WaitFor(options.wake, &h->free_signal, seen, deadline, kReapSlice);
      h->publisher_waiting.store(0);
    }
  }

  // Makes room in slot s's queue (kWait: waits; kDropOldest: drops its
  // oldest). *gone when it died (reaped) or left meanwhile; TIMEOUT at the
  // deadline, whatever the block says; PROTOCOL_ERROR when its queue is
  // damaged.
  Status Room(uint32_t s, Clock::time_point deadline, bool* gone) {
    SlotHeader& q = v.slot(s);
    const uint64_t bit = uint64_t{1} << s;
    auto full = [&] {
      return Status(ErrorCode::kTimeout, "subscriber " + std::to_string(s) + " of channel \"" + name +
                                             "\" has a full queue (" + std::to_string(v.layout.queue_depth) +
                                             " chunks unread)");
    };
    // Past the deadline a few more looks, then TIMEOUT whatever the block says.
    for (uint32_t looks = 0;; ++looks) {
      if (looks > kLooksPastDeadline && Clock::now() >= deadline) return full();
      uint64_t head = 0, tail = 0;
      if (!QueueSnapshot(q, &head, &tail)) continue;  // it took one meanwhile: look again
      if (tail - head < v.layout.queue_depth) return Status::Ok();
      if (tail - head > v.layout.queue_depth) {
        // A subscriber leaving or joining resets its queue: not damage, and
        // not a target any more.
        if ((v.active() & bit) == 0 || q.state.load() != kActive) {
          *gone = true;
          return Status::Ok();
        }
        return Status(ErrorCode::kProtocolError, "channel \"" + name + "\": subscriber " + std::to_string(s) +
                                                     "'s queue holds more than its depth (its control block is "
                                                     "damaged)");
      }
      if (options.when_full == WhenFull::kDropOldest) {
        const uint32_t oldest = v.entry(q, head).load();
        if (q.head.compare_exchange_strong(head, head + 1)) {
          Count(&ChannelStats::dropped, &Header::dropped);
          if (oldest < v.layout.chunks) {
            const uint64_t before = v.meta(oldest).waiting.fetch_and(~bit);
            if ((before & ~bit) == 0 && (before & bit))
              Signal(&v.header()->free_signal, v.header()->publisher_waiting);
          }
        }
        continue;
      }
      if (Dead(s)) {
        Reap();
        *gone = true;
        return Status::Ok();
      }
      if (Clock::now() >= deadline) return full();
      q.publisher_waiting.store(WaiterFor(options.wake));
      const uint32_t seen = q.space_signal.load();
      if (q.tail.load() - q.head.load() >= v.layout.queue_depth)
        WaitFor(options.wake, &q.space_signal, seen, deadline, kReapSlice);
      q.publisher_waiting.store(0);
    }
  }

  // Work sharing: the active subscriber with the fewest chunks waiting;
  // among equals, the next one after the last chosen (round robin).
  uint64_t LeastLoaded(uint64_t active) {
    uint64_t best = 0, best_depth = UINT64_MAX;
    for (uint32_t n = 0; n < kMaxChannelSubscribers; ++n) {
      const uint32_t s = (next_worker + n) % kMaxChannelSubscribers;
      if ((active & (uint64_t{1} << s)) == 0) continue;
      const uint64_t depth = v.slot(s).tail.load() - v.slot(s).head.load();
      if (depth < best_depth) {
        best_depth = depth;
        best = uint64_t{1} << s;
      }
    }
    if (best != 0) next_worker = (static_cast<uint32_t>(std::countr_zero(best)) + 1) % kMaxChannelSubscribers;
    return best;
  }

  Status Publish(Chunk& c, int timeout_ms) {
    if (c.index >= v.layout.chunks || !loaned.count(c.index) || c.data != v.chunk(c.index))
      return Status(ErrorCode::kParamInvalid, "not a chunk this publisher has loaned");
    if (c.size > v.layout.chunk_bytes)
      return Status(ErrorCode::kParamInvalid, "chunk.size " + std::to_string(c.size) + " is past its capacity");
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
    Header* h = v.header();
    uint64_t targets = v.active();
    if (options.mode == ChannelMode::kWorkSharing) targets = LeastLoaded(targets);
    // Room first: a publish that times out has published nothing.
    for (uint64_t rest = targets; rest != 0; rest &= rest - 1) {
      const uint32_t s = static_cast<uint32_t>(std::countr_zero(rest));
      bool gone = false;
      MB_RETURN_IF_ERROR(Room(s, deadline, &gone));
      if (gone) targets &= ~(uint64_t{1} << s);
    }
    ChunkMeta& m = v.meta(c.index);
    m.size = c.size;
    m.sequence = ++sequence;
    h->publishing.fetch_add(1);  // odd: a leaving subscriber waits for us
    // Subscribers that left since `targets` was read are not given it.
    targets &= v.active();
    m.waiting.store(targets | kLoaned);
    for (uint64_t rest = targets; rest != 0; rest &= rest - 1) {
      SlotHeader& q = v.slot(static_cast<uint32_t>(std::countr_zero(rest)));
      const uint64_t tail = q.tail.load();
      v.entry(q, tail).store(c.index);
      q.tail.store(tail + 1);
    }
    // Queued everywhere first, then woken: a subscriber woken early cannot
    // take the CPU from the publisher before the others have it too.
    SignalSubscribers(v, targets);
    m.waiting.fetch_and(~kLoaned);  // 0 now when nobody was given it: free again
    h->publishing.fetch_add(1);
    loaned.erase(c.index);
    last_published = c.index;
    Count(&ChannelStats::published, &Header::published);
    if (targets == 0) Count(&ChannelStats::unreceived, &Header::unreceived);
    c.sequence = m.sequence;
    return Status::Ok();
  }

  Status Discard(Chunk& c) {
    if (c.index >= v.layout.chunks || !loaned.erase(c.index))
      return Status(ErrorCode::kParamInvalid, "not a chunk this publisher has loaned");
    v.meta(c.index).waiting.fetch_and(~kLoaned);
    return Status::Ok();
  }
};

Result<ChannelPublisher> ChannelPublisher::Create(Client& client, const std::string& name,
                                                  const ChannelOptions& options) {
  if (!Valid(options.chunks, options.chunk_bytes, options.queue_depth))
    return Status(ErrorCode::kParamInvalid,
                  "a channel has 1 to 65536 chunks of 1 byte to 1 TiB, and a queue depth that is a power of "
                  "two from 1 to 4096");
  auto impl = std::make_unique<Impl>();
  impl->client = client;
  impl->name = name;
  impl->options = options;
  const Layout l = Layout::For(options.chunks, options.chunk_bytes, options.queue_depth);
  MB_ASSIGN_OR_RETURN(impl->control.handle, client.MallocPhysical(l.control_bytes));
  AllocationProp chunk_pages;
  chunk_pages.page_policy = options.page_policy;
  MB_ASSIGN_OR_RETURN(impl->data.handle, client.MallocPhysical(l.data_bytes, chunk_pages));
  MB_RETURN_IF_ERROR(impl->control.MapAll(client));
  MB_RETURN_IF_ERROR(impl->data.MapAll(client));
  View& v = impl->v;
  v.layout = l;
  v.broadcast = options.mode == ChannelMode::kBroadcast;
  v.control = impl->control.map.as<char>();
  v.data = impl->data.map.as<char>();
  // Fresh broker memory is zero: every chunk free, every slot free.
  Header* h = v.header();
  h->chunks = l.chunks;
  h->queue_depth = l.queue_depth;
  h->chunk_bytes = l.chunk_bytes;
  h->mode = static_cast<uint32_t>(options.mode);
  h->when_full = static_cast<uint32_t>(options.when_full);
  h->publisher_pid = static_cast<int32_t>(::getpid());
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h->magic.store(kMagic);
  // The chunks first: a subscriber that finds the name finds both.
  MB_RETURN_IF_ERROR(client.Publish(name + "/chunks", impl->data.handle, options.read_only_chunks ? kPublishReadOnly : 0));
  Status st = client.Publish(name, impl->control.handle);
  if (!st.ok()) {
    (void)client.Unpublish(name + "/chunks");
    return st;
  }
  impl->published = true;
  return ChannelPublisher(std::move(impl));
}

ChannelPublisher::ChannelPublisher() = default;
ChannelPublisher::ChannelPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChannelPublisher::~ChannelPublisher() = default;
ChannelPublisher::ChannelPublisher(ChannelPublisher&&) noexcept = default;
ChannelPublisher& ChannelPublisher::operator=(ChannelPublisher&&) noexcept = default;

namespace {
Status NoChannel() { return Status(ErrorCode::kNotConnected, "not a channel (default-constructed or moved from)"); }
}  // namespace

Result<Chunk> ChannelPublisher::Loan(size_t bytes, int timeout_ms) {
  if (!impl_) return NoChannel();
  return impl_->Loan(bytes, timeout_ms);
}
Status ChannelPublisher::Publish(Chunk& chunk, int timeout_ms) {
  if (!impl_) return NoChannel();
  return impl_->Publish(chunk, timeout_ms);
}
Status ChannelPublisher::Discard(Chunk& chunk) {
  if (!impl_) return NoChannel();
  return impl_->Discard(chunk);
}
size_t ChannelPublisher::Reap() { return impl_ ? impl_->Reap() : 0; }

Status ChannelPublisher::WaitForSubscribers(uint32_t n, int timeout_ms) {
  if (!impl_) return NoChannel();
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  // Dead subscribers are reaped before each count: one SIGKILLed must not be
  // counted (frames published to it go to nobody).
  for (;;) {
    impl_->Reap();
    if (static_cast<uint32_t>(std::popcount(impl_->v.active())) >= n) break;
    if (Clock::now() >= deadline)
      return Status(ErrorCode::kTimeout, std::to_string(n) + " subscribers did not join channel \"" + impl_->name +
                                             "\" within " + std::to_string(timeout_ms) + " ms");
    std::this_thread::yield();
  }
  return Status::Ok();
}

ChannelStats ChannelPublisher::stats() const {
  if (!impl_) return {};
  ChannelStats s = impl_->counts;
  s.subscribers = static_cast<uint32_t>(std::popcount(impl_->v.active()));
  return s;
}

std::shared_ptr<const void> ChannelPublisher::KeepMapped() const { return impl_ ? impl_->maps : nullptr; }

// ---- a subscriber ----------------------------------------------------------------

class ChannelSubscriber::Impl {
 public:
  std::string name;
  SubscribeOptions options;
  std::shared_ptr<Mappings> maps = std::make_shared<Mappings>();
  View v;
  uint32_t s = 0;
  bool joined = false;
  ipc::UniqueFd publisher;  // pidfd
  std::set<uint32_t> held;
  std::optional<detail::ChannelWakeFd> wake;  // made by WakeFd

  Result<int> WakeFd() {
    if (!joined) return Status(ErrorCode::kNotConnected, "this subscriber has left channel \"" + name + "\"");
    if (!wake) {
      MB_ASSIGN_OR_RETURN(wake, detail::ChannelWakeFd::Open(publisher.valid() ? publisher.get() : -1));
      v.slot(s).wake_nonce.store(wake->nonce());
    }
    return wake->fd();
  }

  ~Impl() { Leave(); }

  bool PublisherGone() {
    return v.header()->closed.load() != 0 || (publisher.valid() && !ipc::PidfdAlive(publisher.get()));
  }

  Status Corrupt(const std::string& what) {
    return Status(ErrorCode::kProtocolError, "channel \"" + name + "\": " + what + " (its control block is damaged)");
  }

  Result<Chunk> Receive(int timeout_ms) {
    if (!joined) return Status(ErrorCode::kNotConnected, "this subscriber has left channel \"" + name + "\"");
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
    SlotHeader& q = v.slot(s);
    const uint64_t bit = uint64_t{1} << s;
    auto timeout = [&] {
      if (wake) {
        // An event loop polls the wake fd next: the publisher sends it a byte
        // for the next chunk, and one that came before the mark sends it now.
        q.subscriber_waiting.store(kWakeFd);
        if (q.tail.load() != q.head.load()) detail::SendChannelWake(static_cast<int32_t>(::getpid()), wake->nonce());
      }
      return Status(ErrorCode::kTimeout, "nothing published on channel \"" + name + "\" within " +
                                             std::to_string(timeout_ms) + " ms");
    };
    // Past the deadline a few more looks (Receive(0) still takes what is
    // there), then TIMEOUT whatever the block says (a head that keeps moving).
    for (uint32_t looks = 0;; ++looks) {
      if (looks > kLooksPastDeadline && Clock::now() >= deadline) return timeout();
      uint64_t head = 0, tail = 0;
      if (!QueueSnapshot(q, &head, &tail)) continue;  // the publisher dropped one meanwhile
      if (tail - head > v.layout.queue_depth) return Corrupt("a queue holds more than its depth");
      if (head != tail) {
        const uint32_t i = v.entry(q, head).load();
        if (!q.head.compare_exchange_strong(head, head + 1)) continue;  // dropped by the publisher meanwhile
        Signal(&q.space_signal, q.publisher_waiting);
        if (i >= v.layout.chunks) return Corrupt("a queued chunk index is out of range");
        ChunkMeta& m = v.meta(i);
        const uint64_t size = m.size;
        if ((m.waiting.load() & bit) == 0 || size > v.layout.chunk_bytes || held.count(i))
          return Corrupt("a queued chunk is not this subscriber's");
        held.insert(i);
        return Chunk{i, v.chunk(i), v.layout.chunk_bytes, static_cast<size_t>(size), m.sequence};
      }
      if (PublisherGone())
        return Status(ErrorCode::kNotConnected, "the publisher of channel \"" + name + "\" has gone");
      if (Clock::now() >= deadline) return timeout();
      q.subscriber_waiting.store(WaiterFor(options.wake));
      std::atomic<uint32_t>* word = v.data_word(q, options.wake);
      const uint32_t seen = word->load();
      if (q.tail.load() == q.head.load()) WaitFor(options.wake, word, seen, deadline, kPublisherCheck);
      q.subscriber_waiting.store(0);
    }
  }

  Status Release(const Chunk& c) {
    if (!joined || !held.erase(c.index))
      return Status(ErrorCode::kParamInvalid, "chunk " + std::to_string(c.index) + " is not held by this subscriber");
    const uint64_t bit = uint64_t{1} << s;
    const uint64_t before = v.meta(c.index).waiting.fetch_and(~bit);
    if ((before & ~bit) == 0) Signal(&v.header()->free_signal, v.header()->publisher_waiting);
    return Status::Ok();
  }

  void Leave() {
    if (!joined) return;
    joined = false;
    Header* h = v.header();
    SlotHeader& q = v.slot(s);
    q.state.store(kLeaving);
    h->active.fetch_and(~(uint64_t{1} << s));
    // A Publish under way may still give us a chunk: let it finish (bounded;
    // a dead publisher publishes nothing more).
    const uint64_t publishing = h->publishing.load();
    const auto deadline = Clock::now() + std::chrono::milliseconds(100);
    while ((publishing & 1) && h->publishing.load() == publishing && Clock::now() < deadline && !PublisherGone())
      std::this_thread::yield();
    ClearBit(v, s);
    held.clear();
    q.head.store(0);
    q.tail.store(0);
    q.pid.store(0);
    q.wake_nonce.store(0);
    q.generation.fetch_add(1);
    q.state.store(kFree);
    // Unmapped and given back now (unless KeepMapped owners still need
    // them), not when this object goes: the Client holds one handle per
    // allocation, so joining again needs them gone.
    maps.reset();
    v.control = v.data = nullptr;
  }
};

Result<ChannelSubscriber> ChannelSubscriber::Join(Client& client, const std::string& name,
                                                  const SubscribeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->options = options;
  Mapped& control = impl->maps->control;
  Mapped& data = impl->maps->data;
  MB_ASSIGN_OR_RETURN(control.handle, client.Lookup(name, options.lookup_timeout_ms));
  MB_ASSIGN_OR_RETURN(data.handle, client.Lookup(name + "/chunks", options.lookup_timeout_ms));
  if (control.handle.size() < sizeof(Header)) return Status(ErrorCode::kProtocolError, "\"" + name + "\" is not a channel");
  MB_RETURN_IF_ERROR(control.MapAll(client));
  const auto* h = control.map.as<Header>();
  // The geometry, checked against what was mapped, and kept here.
  const uint64_t magic = h->magic.load();
  const uint32_t chunks = h->chunks, depth = h->queue_depth, mode = h->mode;
  const uint64_t chunk_bytes = h->chunk_bytes;
  if (magic != kMagic || !Valid(chunks, chunk_bytes, depth) || chunk_bytes % kLine != 0 ||
      mode > static_cast<uint32_t>(ChannelMode::kWorkSharing))
    return Status(ErrorCode::kProtocolError, "\"" + name + "\" is not a channel (or not one this library reads)");
  const Layout l = Layout::For(chunks, chunk_bytes, depth);
  if (l.control_bytes > control.handle.size() || l.data_bytes > data.handle.size())
    return Status(ErrorCode::kProtocolError, "channel \"" + name + "\" is smaller than its geometry says");
  MB_RETURN_IF_ERROR(data.MapAll(client));
  View& v = impl->v;
  v.layout = l;
  v.broadcast = mode == static_cast<uint32_t>(ChannelMode::kBroadcast);
  v.control = control.map.as<char>();
  v.data = data.map.as<char>();
  // A publisher that died (a zombie still has a pid to open) or closed the
  // channel is gone: its name may outlive it until the broker has seen it go.
  auto publisher = ipc::PidfdOpenIfSupported(h->publisher_pid);  // none where pidfds are not supported
  if (publisher.ok()) impl->publisher = std::move(*publisher);
  if (!publisher.ok() || impl->PublisherGone())
    return Status(ErrorCode::kNotConnected, "the publisher of channel \"" + name + "\" has gone");
  for (uint32_t s = 0; s < kMaxChannelSubscribers; ++s) {
    SlotHeader& q = v.slot(s);
    uint32_t free_state = kFree;
    if (!q.state.compare_exchange_strong(free_state, kJoining)) continue;
    q.head.store(0);
    q.tail.store(0);
    q.subscriber_waiting.store(0);
    q.publisher_waiting.store(0);
    q.wake_nonce.store(0);
    q.generation.fetch_add(1);
    q.pid.store(static_cast<int32_t>(::getpid()));
    q.state.store(kActive);
    impl->s = s;
    impl->joined = true;
    v.header()->active.fetch_or(uint64_t{1} << s);
    return ChannelSubscriber(std::move(impl));
  }
  return Status(ErrorCode::kResourceExhausted, "channel \"" + name + "\" has " +
                                                   std::to_string(kMaxChannelSubscribers) + " subscribers already");
}

ChannelSubscriber::ChannelSubscriber() = default;
ChannelSubscriber::ChannelSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChannelSubscriber::~ChannelSubscriber() = default;
ChannelSubscriber::ChannelSubscriber(ChannelSubscriber&&) noexcept = default;
ChannelSubscriber& ChannelSubscriber::operator=(ChannelSubscriber&&) noexcept = default;

Result<Chunk> ChannelSubscriber::Receive(int timeout_ms) {
  if (!impl_) return NoChannel();
  return impl_->Receive(timeout_ms);
}
Result<int> ChannelSubscriber::WakeFd() {
  if (!impl_) return NoChannel();
  return impl_->WakeFd();
}
void ChannelSubscriber::DrainWakeFd() {
  if (impl_ && impl_->wake) impl_->wake->Drain();
}
Status ChannelSubscriber::Release(const Chunk& chunk) {
  if (!impl_) return NoChannel();
  return impl_->Release(chunk);
}
void ChannelSubscriber::Leave() {
  if (impl_) impl_->Leave();
}
uint32_t ChannelSubscriber::slot() const { return impl_ ? impl_->s : 0; }
std::shared_ptr<const void> ChannelSubscriber::KeepMapped() const { return impl_ ? impl_->maps : nullptr; }

}  // namespace membroker
