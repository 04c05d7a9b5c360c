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

Result<ChannelCensus> ReadChannel(int fd, uint64_t size, uint64_t page_size) {
  if (size < sizeof(Header) || page_size == 0 || size % page_size != 0)
    return Status(ErrorCode::kParamInvalid, "smaller than a channel header");
  // Mappings in whole pages of the memory's size (huge pages want that).
  auto map = [&](uint64_t bytes) -> Result<const char*> {
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ipc::ErrnoStatus("mmap", "a channel's control block, read-only", errno);
    return static_cast<const char*>(p);
  };
  // The geometry first, from the first page alone (read once into locals:
  // the block may change under us); then the whole control block (never the
  // chunks), or as much of it as the memory has, read and checked again.
  MB_ASSIGN_OR_RETURN(const char* first, map(page_size));
  const auto* h = reinterpret_cast<const Header*>(first);
  const uint64_t magic = h->magic.load();
  const uint32_t chunks = h->chunks, depth = h->queue_depth;
  const uint64_t chunk_bytes = h->chunk_bytes;
  (void)::munmap(const_cast<char*>(first), page_size);
  if (magic != kMagic || !Valid(chunks, chunk_bytes, depth))
    return Status(ErrorCode::kParamInvalid, "not a channel of this layout");
  const uint64_t control = std::min(Layout::For(chunks, chunk_bytes, depth).control_bytes, size);
  const uint64_t bytes = (control + page_size - 1) / page_size * page_size;
  MB_ASSIGN_OR_RETURN(const char* block, map(bytes));
  Result<ChannelCensus> c = ReadChannel(block, control);
  (void)::munmap(const_cast<char*>(block), bytes);
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
                                  : ReadChannel(a->memory.fd.get(), a->size, a->page_size);
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
