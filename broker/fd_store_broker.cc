// The broker's side of systemd's file descriptor store (fd_store.h): every
// allocation's memfd is stored when it enters the table and removed when it
// leaves; the exports and names are stored as a sealed memfd after every
// turn of the loop that changed them. When systemd restarts a broker that
// crashed, it passes them all back, and the new broker adopts them as a
// take-over's receiver does: held by nobody until clients reattach, for
// --reattach-grace-ms.
#include "broker.h"
#include "fd_store.h"
#include "log.h"
#include "systemd.h"

namespace membroker::broker {

void Broker::StoreMemory(Allocation& a) {
  if (!fd_store_ || !a.stored_as.empty()) return;
  const std::string name = StoredMemoryName({a.id, a.page_size, a.policy, a.pinned, a.fell_back, a.fixed_address,
                                             static_cast<uint32_t>(a.creator_uid)});
  if (systemd::StoreFd(name, a.memory.fd.get())) {
    a.stored_as = name;
    ++counters_.fd_store_stored;
    return;
  }
  ++counters_.fd_store_failures;
  MB_WARN("fd_store_failed", "id=%llu (a crash would lose this allocation unless a client reattaches it)",
          static_cast<unsigned long long>(a.id));
}

void Broker::StateChanged() {
  if (!fd_store_ || state_pending_ || stopping_) return;
  state_pending_ = true;
  const int rc = uv_timer_start(&state_timer_, [](uv_timer_t* t) { static_cast<Broker*>(t->data)->StoreState(); }, 0, 0);
  if (rc != 0) {
    state_pending_ = false;
    MB_ERROR("fd_store_failed", "what=state reason=\"uv_timer_start: %s\"", uv_strerror(rc));
  }
}

void Broker::StoreState() {
  state_pending_ = false;
  auto fd = WriteStoredState(StateRecords());
  // The new one first: a crash in between leaves both, and the newer wins.
  if (fd.ok() && systemd::StoreFd(StoredStateName(state_generation_ + 1), fd->get())) {
    if (state_generation_ != 0) systemd::RemoveStoredFds(StoredStateName(state_generation_));
    ++state_generation_;
    ++counters_.fd_store_states;
    return;
  }
  ++counters_.fd_store_failures;
  MB_WARN("fd_store_failed", "what=state reason=\"%s\"",
          LogText(fd.ok() ? std::string("sd_notify refused it") : fd.status().message()).c_str());
}

Status Broker::RestoreFromFdStore(std::vector<std::pair<std::string, ipc::UniqueFd>> stored) {
  size_t allocations = 0, exports = 0, names = 0, skipped = 0;
  ipc::UniqueFd state;
  uint64_t state_generation = 0;
  auto skip = [&](const std::string& name, const std::string& why) {
    ++skipped;
    MB_WARN("fd_store_skipped", "fdname=\"%s\" reason=\"%s\"", LogText(name).c_str(), LogText(why).c_str());
    systemd::RemoveStoredFds(name);  // it would come back at every start
  };
  for (auto& [name, fd] : stored) {
    if (auto x = ParseStoredMemoryName(name)) {
      auto adopted = AdoptHandedOver(*x, std::move(fd));
      if (!adopted.ok()) {
        skip(name, adopted.status().message());
        continue;
      }
      (*adopted)->stored_as = name;  // systemd keeps it stored across restarts
      ++allocations;
    } else if (auto g = ParseStoredStateName(name)) {
      if (*g < state_generation) {
        systemd::RemoveStoredFds(name);
        continue;
      }
      if (state.valid()) systemd::RemoveStoredFds(StoredStateName(state_generation));
      state = std::move(fd);
      state_generation = *g;
    } else {
      MB_WARN("fd_store_unknown", "fdname=\"%s\" (passed by systemd; not the broker's)", LogText(name).c_str());
    }
  }
  state_generation_ = state_generation;
  if (state.valid()) {
    auto records = ReadStoredState(state.get());
    if (!records.ok()) {
      skip(StoredStateName(state_generation), records.status().message());
      state_generation_ = 0;
    } else {
      for (const ipc::Message& m : *records) {
        if (auto* e = std::get_if<ipc::TakeOverExport>(&m)) {
          Status st = table_.RestoreExport(e->token, e->allocation, 0, e->exporter_uid, e->flags, e->pids);
          if (st.ok()) ++exports;
          else MB_WARN("fd_store_skipped", "what=export reason=\"%s\"", LogText(st.message()).c_str());
        } else if (auto* n = std::get_if<ipc::TakeOverName>(&m)) {
          Status st = RestoreName(*n);
          if (st.ok()) ++names;
          else MB_WARN("fd_store_skipped", "what=name reason=\"%s\"", LogText(st.message()).c_str());
        }
      }
    }
  }
  counters_.fd_store_restored += allocations;
  MB_INFO("restored_from_fd_store", "allocations=%zu exports=%zu names=%zu skipped=%zu grace_ms=%u", allocations,
          exports, names, skipped, options_.reattach_grace_ms);
  return StartReattachGrace();
}

}  // namespace membroker::broker
