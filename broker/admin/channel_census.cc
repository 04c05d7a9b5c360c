#include "admin/channel_census.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>

#include "membroker/ipc/channel_layout.h"
#include "membroker/ipc/syscall.h"

namespace membroker::broker {

namespace {
using namespace detail::channel;  // the shared layout (ipc/channel_layout.h)

// A queue whose ends keep moving is read a few times, then left out.
constexpr int kSnapshotTries = 4;
}  // namespace

Result<ChannelCensus> ReadChannel(const char* block, uint64_t size) {
  if (size < sizeof(Header)) return Status(ErrorCode::kParamInvalid, "smaller than a channel header");
  const auto* h = reinterpret_cast<const Header*>(block);
  if (h->magic.load() != kMagic) return Status(ErrorCode::kParamInvalid, "not a channel of this layout");
  ChannelCensus c;
  c.chunks = h->chunks;
  c.chunk_bytes = h->chunk_bytes;
  c.queue_depth = h->queue_depth;
  if (!Valid(c.chunks, c.chunk_bytes, c.queue_depth))
    return Status(ErrorCode::kParamInvalid, "its geometry is out of range");
  const Layout l = Layout::For(c.chunks, c.chunk_bytes, c.queue_depth);
  if (l.control_bytes > size) return Status(ErrorCode::kParamInvalid, "smaller than its geometry says");
  c.work_sharing = h->mode == 1;
  c.drop_oldest = h->when_full == 1;
  c.publisher_pid = h->publisher_pid;
  c.closed = h->closed.load() != 0;
  c.published = h->published.load(std::memory_order_relaxed);
  c.dropped = h->dropped.load(std::memory_order_relaxed);
  c.unreceived = h->unreceived.load(std::memory_order_relaxed);
  c.reaped = h->reaped.load(std::memory_order_relaxed);
  c.redelivered = h->redelivered.load(std::memory_order_relaxed);

  const uint64_t active = h->active.load() & kSlotMask;
  c.subscribers = static_cast<uint32_t>(std::popcount(active));
  for (uint32_t s = 0; s < kSlots; ++s) {
    if ((active & (uint64_t{1} << s)) == 0) continue;
    const auto& q = *reinterpret_cast<const SlotHeader*>(block + l.slots + l.slot_stride * s);
    uint64_t head = 0, tail = 0;
    bool held = false;
    for (int i = 0; i < kSnapshotTries && !held; ++i) held = QueueSnapshot(q, &head, &tail);
    if (!held) continue;
    // A damaged queue (tail behind head, or more than its depth) counts as full.
    const uint64_t fill = tail - head <= c.queue_depth ? tail - head : c.queue_depth;
    c.queued += fill;
    c.fullest_queue = std::max(c.fullest_queue, static_cast<uint32_t>(fill));
  }
  const auto* metas = reinterpret_cast<const ChunkMeta*>(block + l.metas);
  for (uint32_t i = 0; i < c.chunks; ++i)
    if (metas[i].waiting.load(std::memory_order_relaxed) != 0) ++c.chunks_in_use;
  return c;
}

Result<ChannelCensus> ReadChannel(int fd, uint64_t size) {
  if (size < sizeof(Header)) return Status(ErrorCode::kParamInvalid, "smaller than a channel header");
  // The whole memory, read-only, in one mapping (whole pages of any page
  // size): only address space until read, and ReadChannel reads no further
  // than the geometry it has checked allows.
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ipc::ErrnoStatus("mmap", "a channel's control block, read-only", errno);
  Result<ChannelCensus> c = ReadChannel(static_cast<const char*>(p), size);
  (void)::munmap(p, size);
  return c;
}

std::vector<Record> ChannelRecords(const NameRegistry& names, const Holdings& holdings) {
  std::vector<Record> rows;
  for (const auto& [name, e] : names.all()) {
    if (names.Find(name + "/chunks") == nullptr) continue;
    const Allocation* a = holdings.Find(e.allocation);
    if (a == nullptr) continue;
    Result<ChannelCensus> c = a->memory.device >= 0
                                  ? Result<ChannelCensus>(Status(ErrorCode::kParamInvalid, "device memory"))
                                  : ReadChannel(a->memory.fd.get(), a->size);
    const ChannelCensus none;
    const ChannelCensus& v = c.ok() ? *c : none;
    Record r;
    r.Str("name", name)
        .Num("publisher_pid", static_cast<uint64_t>(std::max(v.publisher_pid, 0)))
        .Str("state", !c.ok()    ? "unreadable: " + c.status().message()
                      : v.closed ? "closed"
                                 : "open")
        .Str("mode", !c.ok()          ? "-"
                     : v.work_sharing ? "work-sharing"
                                      : "broadcast")
        .Str("when_full", !c.ok()         ? "-"
                          : v.drop_oldest ? "drop-oldest"
                                          : "wait")
        .Num("chunks", v.chunks)
        .Num("chunk_bytes", v.chunk_bytes)
        .Num("queue_depth", v.queue_depth)
        .Num("subscribers", v.subscribers)
        .Num("queued", v.queued)
        .Num("fullest_queue", v.fullest_queue)
        .Num("chunks_in_use", v.chunks_in_use)
        .Num("published", v.published)
        .Num("dropped", v.dropped)
        .Num("unreceived", v.unreceived)
        .Num("reaped", v.reaped)
        .Num("redelivered", v.redelivered);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace membroker::broker
