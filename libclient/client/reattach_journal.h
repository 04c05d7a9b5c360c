// What a client presents again to a new broker when it reattaches
// (reattach.cc), beyond its handles: the tokens it exported, the names it
// published, the prefixes it subscribed to, its transfer engine, and the
// frees it could not send while no broker was there. Written by the calls
// that made them (client.cc, client_names.cc, the transfer engine), read
// whole by a reattach. Its own lock, never held across a call to the broker.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "membroker/ipc/protocol.h"

namespace membroker::detail {

struct ExportRecord {
  uint64_t handle = 0;
  uint32_t flags = 0;
  std::vector<ipc::AllowedPid> pids;
};
struct PublicationRecord {
  uint64_t handle = 0;
  uint32_t flags = 0;
  std::string metadata;
};

class ReattachJournal {
 public:
  struct Entries {
    std::map<std::string, ExportRecord> exports;            // by token
    std::map<std::string, PublicationRecord> publications;  // by name
    std::set<std::pair<std::string, bool>> subscriptions;  // prefixes, and whether for the cluster
    std::string engine_name;                                // "" without an engine
    uint64_t engine_control = 0;                            // its control block's handle
  };

  void RecordExport(const std::string& token, uint64_t handle, uint32_t flags) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.exports[token] = ExportRecord{handle, flags, {}};
  }
  void RecordPids(const std::string& token, std::vector<ipc::AllowedPid> pids) {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = entries_.exports.find(token); it != entries_.exports.end()) it->second.pids = std::move(pids);
  }
  void RecordPublication(const std::string& name, uint64_t handle, uint32_t flags, std::string metadata) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.publications[name] = PublicationRecord{handle, flags, std::move(metadata)};
  }
  void ForgetPublication(const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.publications.erase(name);
  }
  void RecordSubscription(const std::string& prefix, bool cluster) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.subscriptions.insert({prefix, cluster});
  }
  // The transfer engine of this client (one at most), registered again at a
  // reattach with its ranges.
  void RecordEngine(const std::string& name, uint64_t control_allocation) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.engine_name = name;
    entries_.engine_control = control_allocation;
  }
  void ForgetEngine() { RecordEngine("", 0); }
  // A handle freed while no broker was there: the next one hears of it if it
  // takes the handle back.
  void AddLostFree(uint64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    lost_frees_.push_back(handle);
  }
  std::vector<uint64_t> TakeLostFrees() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(lost_frees_, {});
  }
  Entries entries() const {
    std::lock_guard<std::mutex> lk(mu_);
    return entries_;
  }

 private:
  mutable std::mutex mu_;
  Entries entries_;
  std::vector<uint64_t> lost_frees_;
};

}  // namespace membroker::detail
