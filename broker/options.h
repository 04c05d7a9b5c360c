// membrokerd's settings: command-line flags and the config file (same keys).
#pragma once

#include <cstdint>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "cluster/cluster_options.h"
#include "memory/accounting.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"

namespace membroker::broker {

struct PoolSpec {
  uint64_t size = 0;  // size class, rounded to the policy's page size
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  uint32_t count = 0;  // allocations kept ready
};

// A KV store the broker makes at its start (--kv-store), owned by the
// broker's uid: clients open it by name, and only root or that uid drops it.
struct KvStoreOption {
  std::string name;
  uint64_t block_size = 0;
  uint64_t capacity = 0;  // bytes
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  uint8_t eviction = 0;  // EvictionKind (kv/eviction.h): 0 S3-FIFO, 1 LRU
};

struct Options {
  std::string socket_path;
  std::string admin_socket_path;
  // The key that tags the broker's memory and how far its ids have gone
  // (identity.h), for the next broker on this socket; default: PATH.state.
  std::string state_file;
  // Start by taking over the broker serving socket_path (restart/takeover.h): its
  // listening socket, memory and state, through socket_path + ".takeover".
  bool take_over = false;
  // Keep memory and state in systemd's fd store (FileDescriptorStoreMax=);
  // also on when systemd announces a store ($FDSTORE, systemd 254 and later).
  bool fd_store = false;
  // Command line only: run as the keeper of a broker (keeper/keeper.h).
  bool supervise = false;
  // After a take-over: how long memory and names nobody has reattached to are kept.
  uint32_t reattach_grace_ms = 10000;
  int ready_fd = -1;                         // "READY <pid>\n" is written here once serving
  uint64_t max_bytes = 0;                    // broker-wide byte budget; 0 = half of RAM
  uint64_t max_pinned_bytes = 0;             // broker-wide pinned budget; 0 = an eighth of RAM
  std::map<int, uint64_t> max_device_bytes;  // per CUDA device; default: the device's memory
  size_t max_clients = 1024;                 // clients past their handshake
  // Connections that have not sent their hello: at most max_clients of them
  // at once, each closed if it has not within this time.
  uint32_t handshake_timeout_ms = 5000;
  size_t max_outbound_frames = 1024;    // a client that does not read is dropped...
  uint64_t max_outbound_bytes = 4ull << 20;          // ...or when this many bytes wait for it
  uint64_t max_outbound_total_bytes = 256ull << 20;  // replies waiting for all slow readers
  size_t max_inflight_per_client = 64;  // concurrent slow requests per client
  uint64_t inline_alloc_bytes = 1ull << 20;  // larger allocations and KV seal batches use the worker pool
  // Pool refills and returns of freed pages wait until takes and frees have
  // paused this long (and at most ten times as long); 0 starts them at once.
  uint32_t background_delay_ms = 1;
  QuotaLimits quota_client;
  QuotaLimits quota_uid_default;
  std::vector<std::pair<uid_t, QuotaLimits>> quota_uid;
  std::vector<PoolSpec> pools;
  std::vector<KvStoreOption> kv_stores;
  uint64_t va_window_base = 0x400000000000ull;  // same-address allocations live here
  uint64_t va_window_size = 1ull << 42;         // 4 TiB
  // Admission: the broker's own uid and root always; these uids and groups too.
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  std::string socket_group;  // group owning the client socket (name or number)
  int log_level = 2;         // 0 error, 1 warn, 2 info, 3 debug
  bool log_json = false;     // --log-format json
  std::string metrics_listen;  // "PORT" or "IPV4:PORT": GET /metrics there (admin/metrics_http.h)
  // The KV stores' disk tier (kv/disk_tier.h): evicted blocks go there; off when empty.
  std::string kv_disk;
  uint64_t kv_disk_bytes = 4ull << 30;
  ClusterOptions cluster;  // --cluster and its settings; off without it
};

// Parses flags (and any --config FILE they name) into *out. On a usage error
// the Status message says what was wrong; --help sets *help.
Status ParseArgs(int argc, char** argv, Options* out, bool* help);

// Applies one "key = value" setting (the config file's and the flags' keys).
Status ApplySetting(const std::string& key, const std::string& value, Options* out);

// Reads a config file: "key = value" lines, '#' comments.
Status LoadConfig(const std::string& path, Options* out);

extern const char kUsage[];

}  // namespace membroker::broker
