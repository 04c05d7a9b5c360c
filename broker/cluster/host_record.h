// One host's record in etcd (KEY = /membroker/NAMESPACE/hosts/NAME): who
// serves there, the listen addresses of its transfer engines and the names its
// clients published for the cluster, as JSON. One key per host keeps a host's
// view whole (one watch event changes it) and lets it go with one lease; the
// price is a rewrite of the record per change, so names are few (at most 128).
// Its generation is the key's create_revision: every registration creates the
// key anew, so a host that comes back is told apart from its old records.
// Records are read from an etcd other software shares: DecodeHostRecord checks
// every field and bound before anything uses one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "membroker/status.h"

namespace membroker::broker {

inline constexpr size_t kHostNameMax = 64;
inline constexpr size_t kHostEnginesMax = 256;
inline constexpr size_t kHostNamesMax = 128;
// 128 names with 4 KiB of metadata each (base64) fit, under etcd's default
// request limit of 1.5 MiB.
inline constexpr size_t kHostRecordMaxBytes = 1u << 20;

struct HostEngine {
  std::string name;     // the engine's name on its host (UTF-8, no control bytes, <= 128 bytes)
  std::string address;  // where it listens: "IPV4:PORT" or "[IPV6]:PORT"
};

// A named object published with kPublishCluster: where it lives is the host.
struct HostName {
  std::string name;      // as ipc::CheckName allows (UTF-8, no control bytes)
  uint64_t size = 0;     // the allocation's bytes
  bool read_only = false;
  std::string metadata;  // the publisher's bytes (base64 in the record), <= 4 KiB
  uint64_t allocation = 0;  // the broker's id of the object: a replace changes it (0 in older records)
  bool operator==(const HostName&) const = default;
};

struct HostRecord {
  std::string host;
  int32_t pid = 0;       // the broker's pid on that host
  std::string boot_id;   // that host's /proc/sys/kernel/random/boot_id: a pid means something only with it...
  uint64_t pid_ns = 0;   // ...and the inode of its pid namespace
  int64_t started_s = 0;  // when that broker registered, seconds since the epoch
  std::vector<HostEngine> engines;
  std::vector<HostName> names;  // absent in records of brokers before names: none
};

// Host names: 1-64 of [A-Za-z0-9._-], starting with a letter or digit (they are etcd key parts).
Status CheckHostName(std::string_view name);
// "IPV4:PORT" or "[IPV6]:PORT", port 1-65535.
bool ValidListenAddress(std::string_view address);

std::string EncodeHostRecord(const HostRecord& r);
// The record stored under host name `host` (from its key), checked whole.
Result<HostRecord> DecodeHostRecord(std::string_view host, std::string_view value);

}  // namespace membroker::broker
