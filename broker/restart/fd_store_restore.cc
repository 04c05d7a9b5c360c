// Restoring from systemd's file descriptor store (fd_store.h, kept by
// FdStoreSync): when systemd restarts a broker that crashed, it passes back
// every stored memfd and the last state memfd, and the new broker adopts them
// as a take-over's receiver does: held by nobody until clients reattach, for
// --reattach-grace-ms.
#include "broker.h"
#include "log.h"
#include "restart/fd_store.h"
#include "restart/kv_stores_restart.h"
#include "restart/systemd.h"

namespace membroker::broker {

Status Broker::RestoreFromFdStore(std::vector<std::pair<std::string, ipc::UniqueFd>> stored) {
  size_t allocations = 0, exports = 0, names = 0, skipped = 0;
  ipc::UniqueFd state;
  uint64_t state_generation = 0;
  KvStoreParts stores;
  std::map<uint64_t, std::vector<std::string>> kv_names;  // store -> its parts' names
  auto skip = [&](const std::string& name, const std::string& why) {
    ++skipped;
    MB_WARN("fd_store_skipped", "fdname=\"%s\" reason=\"%s\"", LogText(name).c_str(), LogText(why).c_str());
    systemd::RemoveStoredFds(name);  // it would come back at every start
  };
  for (auto& [name, fd] : stored) {
    if (auto x = ParseStoredMemoryName(name)) {
      auto adopted = AdoptHandedOver(*x, std::move(fd), name);  // systemd keeps it stored across restarts
      if (!adopted.ok()) {
        skip(name, adopted.status().message());
        continue;
      }
      ++allocations;
    } else if (auto p = ParseStoredKvName(name)) {
      // Removed once the store is made again in new memory, stored under new names.
      kv_names[p->store].push_back(name);
      if (Status st = stores.Add(p->store, p->generation, p->part, std::move(fd)); !st.ok()) skip(name, st.message());
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
  if (state.valid()) {
    auto records = ReadStoredState(state.get());
    if (!records.ok()) {
      skip(StoredStateName(state_generation), records.status().message());
      state_generation = 0;
    } else {
      for (const ipc::Message& m : *records) {
        if (auto* e = std::get_if<ipc::TakeOverExport>(&m)) {
          Status st = holdings_.RestoreExport(e->token, e->allocation, 0, e->exporter_uid, e->flags, e->pids);
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
  fd_store_.Continue(state_generation);
  fd_store_.CountRestored(allocations);
  const size_t kv_stores =
      stores.RestoreInto(kv_, holdings_.limits(), workers_, [names = std::move(kv_names)](uint64_t store) {
        if (auto it = names.find(store); it != names.end())
          for (const std::string& name : it->second) systemd::RemoveStoredFds(name);
      });
  MB_INFO("restored_from_fd_store", "allocations=%zu exports=%zu names=%zu kv_stores=%zu skipped=%zu grace_ms=%u",
          allocations, exports, names, kv_stores, skipped, options_.reattach_grace_ms);
  return StartReattachGrace();
}

}  // namespace membroker::broker
