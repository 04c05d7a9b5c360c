// FdStoreSync (fd_store_sync.h).
#include "restart/fd_store_sync.h"

#include "log.h"
#include "restart/fd_store.h"
#include "restart/systemd.h"
#include "uv_status.h"

namespace membroker::broker {

Status FdStoreSync::Init() {
  MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(loop_, &timer_)));
  timer_.data = this;
  return Status::Ok();
}

void FdStoreSync::Close() {
  if (closed_) return;
  closed_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

void FdStoreSync::Entered(Allocation& a) {
  if (!enabled_ || !a.stored_as.empty() || !KeptOverRestart(a.memory)) return;
  const std::string name = StoredMemoryName({a.id, a.page_size, a.policy, a.pinned, a.fell_back, a.fixed_address,
                                             static_cast<uint32_t>(a.creator_uid)});
  if (systemd::StoreFd(name, a.memory.fd.get())) {
    a.stored_as = name;
    ++counters_.stored;
    return;
  }
  ++counters_.failures;
  MB_WARN("fd_store_failed", "id=%llu (a crash would lose this allocation unless a client reattaches it)",
          static_cast<unsigned long long>(a.id));
}

void FdStoreSync::Left(const Allocation& a) {
  if (!a.stored_as.empty()) systemd::RemoveStoredFds(a.stored_as);
  if (!a.tokens.empty()) StateChanged();  // its exports went with it
}

void FdStoreSync::StoreAdded(const BlockStore& store) {
  if (!enabled_) return;
  bool stored = systemd::StoreFd(StoredKvName({store.id(), store.generation(), 0}), store.index_fd());
  for (uint32_t i = 0; stored && i < store.slab_count(); ++i)
    stored = systemd::StoreFd(StoredKvName({store.id(), store.generation(), i + 1}), *store.SlabFd(i));
  if (stored) {
    counters_.stored += 1 + store.slab_count();
    return;
  }
  ++counters_.failures;
  MB_WARN("fd_store_failed", "store=%llu (a crash would lose this KV-cache store)",
          static_cast<unsigned long long>(store.id()));
}

void FdStoreSync::StoreRemoved(const BlockStore& store) {
  if (!enabled_) return;
  for (uint32_t part = 0; part <= store.slab_count(); ++part)
    systemd::RemoveStoredFds(StoredKvName({store.id(), store.generation(), part}));
}

void FdStoreSync::StateChanged() {
  if (!enabled_ || pending_ || closed_) return;
  pending_ = true;
  const int rc = uv_timer_start(&timer_, [](uv_timer_t* t) { static_cast<FdStoreSync*>(t->data)->StoreState(); }, 0, 0);
  if (rc != 0) {
    pending_ = false;
    MB_ERROR("fd_store_failed", "what=state reason=\"uv_timer_start: %s\"", uv_strerror(rc));
  }
}

void FdStoreSync::StoreState() {
  pending_ = false;
  auto fd = WriteStoredState(records_());
  // The new one first: a crash in between leaves both, and the newer wins.
  if (fd.ok() && systemd::StoreFd(StoredStateName(generation_ + 1), fd->get())) {
    if (generation_ != 0) systemd::RemoveStoredFds(StoredStateName(generation_));
    ++generation_;
    ++counters_.states;
    return;
  }
  ++counters_.failures;
  MB_WARN("fd_store_failed", "what=state reason=\"%s\"",
          LogText(fd.ok() ? std::string("sd_notify refused it") : fd.status().message()).c_str());
}

}  // namespace membroker::broker
