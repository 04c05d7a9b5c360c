// The broker's part in a cluster (--cluster etcd://HOST:PORT): it registers its
// host in etcd under a lease it keeps alive, so the record vanishes within the
// lease's TTL when the broker dies or is cut off, and it watches every host's
// record to keep the cluster's table. Two threads do the talking (etcd calls
// block): the registrar (lease, claim of the host name, keep-alive, updates of
// the engines it lists) and the watcher (a read of all hosts, then a watch
// stream from there). The loop only reads View() and calls SetEngines; nothing
// etcd does can stop local work. docs/CLUSTER.md says it all for users.
#pragma once

#include <uv.h>

#include <condition_variable>
#include <functional>
#include <optional>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/cluster_options.h"
#include "cluster/host_record.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"

namespace membroker::broker {

class EtcdClient;
struct EtcdConfig;

enum class ClusterState { kOff, kConnecting, kWaiting, kRegistered, kUnreachable };
const char* ClusterStateName(ClusterState s);

struct ClusterHost {
  HostRecord record;
  int64_t generation = 0;  // the key's create_revision: new at each registration
  bool self = false;  // this broker's own registration
};

struct ClusterView {
  ClusterState state = ClusterState::kOff;
  bool watching = false;      // the table below is current (the watch stream is up)
  std::string error;          // the last failure, while it lasts
  std::string endpoint;       // the etcd endpoint in use
  int64_t generation = 0;     // this broker's, while registered
  std::vector<ClusterHost> hosts;
  uint64_t registrations = 0, errors = 0, invalid_records = 0, hosts_gone = 0;
};

// An engine on another host of the cluster, as that host's record lists it.
struct EngineLocation {
  std::string host;
  int64_t generation = 0;
  std::string address;
};

// A name published on a host of the cluster, as that host's record lists it.
struct NameLocation {
  std::string host;
  int64_t generation = 0;
  HostName name;
  ipc::ClusterLookupReply Reply() const {
    return {host, static_cast<uint64_t>(generation), name.size, name.read_only, name.metadata, name.allocation};
  }
};

// A change to another host's names for the cluster, as the watcher saw it:
// published, unpublished (its record changed), or kHostGone (its record went,
// or another broker of that host registered), one per name it listed.
struct ClusterNameEvent {
  ipc::NameEventKind kind = ipc::NameEventKind::kPublished;
  std::string host;
  std::string name;
};

class Cluster {
 public:
  Cluster() = default;
  ~Cluster() { Stop(); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Checks the options (host name, password file, TLS files) and reads the
  // password, before the broker makes anything: a bad setting is a failed
  // start that leaves nothing behind. Nothing without --cluster.
  Status Configure(const ClusterOptions& options, int32_t pid);
  // Starts the two threads, once the broker serves. etcd being unreachable is
  // no error here: they keep trying. on_change runs on loop's thread after the
  // table of hosts changed.
  Status Start(uv_loop_t* loop, std::function<void()> on_change);
  bool started() const { return started_; }
  const ClusterOptions& options() const { return options_; }  // as in effect (the host name filled in)
  // The engines this host lists (those that listen for other hosts); the
  // record is updated when they change.
  void SetEngines(std::vector<HostEngine> engines);
  // The names this host's clients published for the cluster; the record is
  // updated when they change.
  void SetNames(std::vector<HostName> names);
  // Revokes the lease (its records go at once) and joins the threads; bounded
  // by the etcd client's timeout.
  void Stop();
  ClusterView View() const;
  // The engine named so on another host (the first host by name that lists it).
  std::optional<EngineLocation> FindEngine(const std::string& name) const;
  // The name published on another host (the first host by name that lists it).
  std::optional<NameLocation> FindName(const std::string& name) const;
  // A name of this host's, as FindName answers for another host's.
  NameLocation Here(HostName name) const;
  // The name events since the last call, oldest first (on_change says when).
  std::vector<ClusterNameEvent> TakeNameEvents();

 private:
  EtcdConfig EtcdSettings() const;  // what each thread's client is made with
  void RunRegistrar();
  void RunWatcher();
  Status Register(EtcdClient& etcd, int64_t* lease);
  void KeepRegistered(EtcdClient& etcd, int64_t lease);
  void ApplyRecord(const std::string& key, const std::string& value, int64_t generation);  // mu_ held
  void HostGone(const std::string& name);  // mu_ held: its names' events; it leaves the table
  // Counts and logs a failure (mu_ held); the registrar's also set the state.
  void Failed(ClusterState state, const Status& why, bool registrar);
  // Waits up to ms, or until stopping (or, for the registrar, the record
  // changed); false once stopping.
  bool Pause(std::unique_lock<std::mutex>& lock, uint32_t ms, bool registrar);

  ClusterOptions options_;
  std::string password_;
  std::string prefix_, self_key_;  // /membroker/NS/hosts/ and that + our name
  bool configured_ = false, started_ = false;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool record_changed_ = false;  // engines changed, or the watcher saw our record go
  HostRecord self_;
  ClusterView view_;
  std::map<std::string, ClusterHost> hosts_;
  std::vector<ClusterNameEvent> name_events_;  // for the loop to take
  uint64_t pid_ns_ = 0;  // ours: a pid in a record of this boot means something only in the same namespace
  std::thread registrar_, watcher_;
  uv_async_t changed_{};  // the watcher's word to the loop: the table changed
  std::function<void()> on_change_;
};

}  // namespace membroker::broker
