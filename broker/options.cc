#include "options.h"

#include <algorithm>
#include <cerrno>
#include <sstream>
#include <cstdint>
#include <cstdlib>
#include <fstream>

#include "admin/metrics_http.h"
#include "cluster/cluster.h"
#include "log.h"
#include "memory/memfd.h"
#include "server/socket_path.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/page_policy.h"
#include "size_text.h"

namespace membroker::broker {

const char kUsage[] =
    "usage: membrokerd --socket PATH [options]\n"
    "  --socket PATH            client socket (SOCK_SEQPACKET, mode 0660)\n"
    "  --admin-socket PATH      admin socket (mode 0600); default: PATH.admin\n"
    "  --state-file FILE        key and id counter kept for the next broker on this socket, so\n"
    "                           clients reattach after a restart (mode 0600); default: PATH.state\n"
    "  --take-over              take over the broker serving --socket (its listening socket, memory,\n"
    "                           exports and names) through PATH.takeover; it exits 0, clients reattach\n"
    "  --reattach-grace-ms MS   after a take-over or a restart from the fd store, keep memory and\n"
    "                           names no client has reattached to for MS (default 10000)\n"
    "  --fd-store               under systemd: keep every memfd and the exports and names in the\n"
    "                           unit's file descriptor store (FileDescriptorStoreMax=), so a crash\n"
    "                           loses nothing (on by itself where systemd sets $FDSTORE)\n"
    "  --supervise              run under a keeper process that holds the fd store (as systemd's)\n"
    "                           and starts the broker again when it dies; for containers, CI and\n"
    "                           shells (docs/RESTART.md); --ready-fd then gets a line per start\n"
    "  --config FILE            settings file: 'key = value' lines with the flags' names\n"
    "  --ready-fd N             write \"READY <pid>\\n\" to fd N once serving, then close it\n"
    "  --max-bytes SIZE         budget for all allocations (K, M, G, T); default: half of RAM\n"
    "  --max-pinned-bytes SIZE  budget for pinned memory; default: an eighth of RAM\n"
    "  --max-device-bytes DEV=SIZE[,DEV=SIZE]  budget for CUDA device DEV's memory; default: all of it\n"
    "  --max-clients N          clients connected at once, past their handshake (default 1024);\n"
    "                           as many more may wait for their handshake\n"
    "  --handshake-timeout-ms MS close connections that send no hello within MS (default 5000)\n"
    "  --max-outbound-bytes SIZE replies waiting for one client that does not read (default 4M)\n"
    "  --max-outbound-total SIZE replies waiting for all such clients together (default 256M)\n"
    "  --quota-client SPEC      per-client quota, e.g. bytes=1G,pinned=64M,allocations=1000,imports=100,kv=1G\n"
    "  --quota-uid UID:SPEC     per-uid quota for UID, or 'default:SPEC' for every other uid\n"
    "  --pool SIZE:POLICY:COUNT keep COUNT allocations of SIZE ready (POLICY: normal, huge-first,\n"
    "                           huge, huge1g); repeatable\n"
    "  --background-delay-ms MS pool refills and returns of freed pages wait until takes and\n"
    "                           frees pause for MS (at most 10*MS); 0: at once (default 1)\n"
    "  --va-window BASE:SIZE    address window for same-address allocations (hex BASE)\n"
    "  --socket-group GROUP     group owning the client socket (mode 0660), name or number\n"
    "  --allow-uid UID          also admit clients of this uid (repeatable; the broker's own\n"
    "                           uid and root are always admitted)\n"
    "  --allow-gid GROUP        also admit clients in this group, by name or number (primary or\n"
    "                           supplementary)\n"
    "  --log-level LEVEL        error, warn, info (default) or debug\n"
    "  --metrics-listen ADDR    serve the metrics over HTTP at GET /metrics (Prometheus); PORT alone\n"
    "                           means 127.0.0.1:PORT\n"
    "  --kv-disk DIR            the KV stores' disk tier: blocks evicted from memory are written\n"
    "                           there and read back by a get (docs/KV.md); the broker's own\n"
    "                           directory, made mode 0700 if absent\n"
    "  --kv-disk-bytes SIZE     the disk tier's capacity; past it the oldest blocks go (default 4G)\n"
    "  --kv-store NAME:BLOCK:CAPACITY[:PAGES[:EVICTION]]  make this KV store at the start (kept if a\n"
    "                           restart brought it back), e.g. llama-70b/kv:16K:8G:huge-first:s3fifo;\n"
    "                           PAGES normal (default), huge-first, huge or huge1g; EVICTION s3fifo\n"
    "                           (default) or lru; repeatable\n"
    "  --cluster etcd://HOST:PORT[,HOST:PORT]  join a cluster kept in etcd: register this host and\n"
    "                           see the others (docs/CLUSTER.md); off by default; etcds:// for TLS\n"
    "  --cluster-ca FILE        etcds://: the CA that signed etcd's certificate (default: the system's)\n"
    "  --cluster-cert FILE      etcds://: this broker's client certificate, with its key in\n"
    "  --cluster-key FILE       (mode 0600)\n"
    "  --cluster-namespace NS   the cluster's name in etcd: keys under /membroker/NS/ (default membroker)\n"
    "  --host-name NAME         this host's name in the cluster; default: the machine's host name\n"
    "  --cluster-ttl-s N        the lease on this host's records: how long they outlive a dead\n"
    "                           broker, 2 to 60 seconds (default 5)\n"
    "  --cluster-user USER      authenticate to etcd as USER, with the password read from\n"
    "  --cluster-password-file FILE  (its first line; mode 0600: never a secret on a command line)\n"
    "  --log-format FORMAT      text (default) or json: one JSON object per line on stderr\n"
    "  --verbose                the same as --log-level debug\n";

namespace {

Status Bad(const std::string& key, const std::string& value, const std::string& want) {
  return Status(ErrorCode::kParamInvalid, "bad value '" + value + "' for " + key + " (" + want + ")");
}

std::vector<std::string> SplitColons(const std::string& s) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t colon; (colon = s.find(':', at)) != std::string::npos; at = colon + 1)
    parts.push_back(s.substr(at, colon - at));
  parts.push_back(s.substr(at));
  return parts;
}

bool ParsePolicy(const std::string& s, ipc::PagePolicy* out) {
  const std::optional<ipc::PagePolicy> p = ipc::PagePolicyFromName(s);
  if (p) *out = *p;
  return p.has_value();
}

// NAME:BLOCK:CAPACITY[:PAGES[:EVICTION]] (the name is what comes before the
// first colon: a store whose name has one is made by a client, not here).
Status ParseKvStore(const std::string& key, const std::string& value, Options* o) {
  const std::vector<std::string> f = SplitColons(value);
  const std::string want = "NAME:BLOCK:CAPACITY[:PAGES[:EVICTION]], e.g. llama-70b/kv:16K:8G:huge-first:s3fifo";
  KvStoreOption kv;
  if (f.size() < 3 || f.size() > 5 || !ParseSize(f[1], &kv.block_size) || !ParseSize(f[2], &kv.capacity) ||
      kv.block_size == 0)
    return Bad(key, value, want);
  kv.name = f[0];
  if (Status st = ipc::CheckName(kv.name, ipc::kMaxKvStoreNameBytes, "a store name"); !st.ok())
    return Bad(key, value, st.message());
  if (kv.capacity < kv.block_size) return Bad(key, value, "a capacity of at least one block");
  if (f.size() > 3 && !ParsePolicy(f[3], &kv.policy))
    return Bad(key, value, "PAGES: normal, huge-first, huge or huge1g");
  if (f.size() > 4) {
    if (f[4] != "s3fifo" && f[4] != "lru") return Bad(key, value, "EVICTION: s3fifo or lru");
    kv.eviction = f[4] == "lru" ? 1 : 0;
  }
  for (const KvStoreOption& other : o->kv_stores)
    if (other.name == kv.name) return Bad(key, value, "a store named once");
  o->kv_stores.push_back(kv);
  return Status::Ok();
}

std::string Trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

Status ApplySetting(const std::string& key, const std::string& value, Options* o) {
  uint64_t n = 0;
  if (key == "socket") {
    o->socket_path = value;
  } else if (key == "admin-socket") {
    o->admin_socket_path = value;
  } else if (key == "state-file") {
    o->state_file = value;
  } else if (key == "reattach-grace-ms") {
    if (!ParseCount(value, &n) || n > 3600000) return Bad(key, value, "milliseconds, at most an hour");
    o->reattach_grace_ms = static_cast<uint32_t>(n);
  } else if (key == "ready-fd") {
    if (!ParseCount(value, &n) || n > 1 << 20) return Bad(key, value, "an fd number");
    o->ready_fd = static_cast<int>(n);
  } else if (key == "max-bytes") {
    if (!ParseSize(value, &n) || n == 0) return Bad(key, value, "a size such as 8G");
    o->max_bytes = n;
  } else if (key == "max-pinned-bytes") {
    if (!ParseSize(value, &n) || n == 0) return Bad(key, value, "a size such as 1G");
    o->max_pinned_bytes = n;
  } else if (key == "max-device-bytes") {
    std::stringstream in(value);
    for (std::string item; std::getline(in, item, ',');) {
      const size_t eq = item.find('=');
      uint64_t device = 0, bytes = 0;
      if (eq == std::string::npos || !ParseCount(item.substr(0, eq), &device) || device > 1024 ||
          !ParseSize(item.substr(eq + 1), &bytes))
        return Bad(key, value, "DEVICE=SIZE pairs such as 0=40G,1=40G");
      o->max_device_bytes[static_cast<int>(device)] = bytes;
    }
  } else if (key == "max-clients") {
    if (!ParseCount(value, &n) || n == 0) return Bad(key, value, "a positive count");
    o->max_clients = n;
  } else if (key == "handshake-timeout-ms") {
    if (!ParseCount(value, &n) || n == 0 || n > 600000) return Bad(key, value, "milliseconds, 1 to 600000");
    o->handshake_timeout_ms = static_cast<uint32_t>(n);
  } else if (key == "max-outbound-bytes") {
    if (!ParseSize(value, &n) || n < 65536) return Bad(key, value, "a size of at least 64K");
    o->max_outbound_bytes = n;
  } else if (key == "max-outbound-total") {
    if (!ParseSize(value, &n) || n < 65536) return Bad(key, value, "a size of at least 64K");
    o->max_outbound_total_bytes = n;
  } else if (key == "background-delay-ms") {
    if (!ParseCount(value, &n) || n > 60000) return Bad(key, value, "milliseconds, 0 to 60000");
    o->background_delay_ms = static_cast<uint32_t>(n);
  } else if (key == "quota-client") {
    return o->quota_client.Parse(value);
  } else if (key == "quota-uid") {
    size_t colon = value.find(':');
    if (colon == std::string::npos) return Bad(key, value, "UID:SPEC or default:SPEC");
    std::string who = value.substr(0, colon);
    QuotaLimits limits;
    MB_RETURN_IF_ERROR(limits.Parse(value.substr(colon + 1)));
    if (who == "default") {
      o->quota_uid_default = limits;
    } else {
      if (!ParseCount(who, &n) || n >= UINT32_MAX) return Bad(key, value, "UID:SPEC or default:SPEC");
      o->quota_uid.emplace_back(static_cast<uid_t>(n), limits);
    }
  } else if (key == "pool") {
    size_t a = value.find(':'), b = value.rfind(':');
    PoolSpec p;
    uint64_t count = 0;
    if (a == std::string::npos || a == b || !ParseSize(value.substr(0, a), &p.size) ||
        !ParsePolicy(value.substr(a + 1, b - a - 1), &p.policy) ||
        !ParseCount(value.substr(b + 1), &count) || p.size == 0 || count == 0 || count > 65536)
      return Bad(key, value, "SIZE:POLICY:COUNT, e.g. 2M:normal:16");
    if (p.policy == ipc::PagePolicy::kHugeFirst) return Bad(key, value, "pools take normal, huge or huge1g");
    p.size = ipc::RoundUp(p.size, ipc::GranularityFor(p.policy).minimum);
    p.count = static_cast<uint32_t>(count);
    o->pools.push_back(p);
  } else if (key == "va-window") {
    size_t colon = value.find(':');
    uint64_t base = 0, size = 0;
    if (colon == std::string::npos || !ParseSize(value.substr(0, colon), &base) ||
        !ParseSize(value.substr(colon + 1), &size) || base % (1ull << 30) || size % (1ull << 30) ||
        size == 0)
      return Bad(key, value, "BASE:SIZE, both multiples of 1 GiB, e.g. 0x400000000000:4T");
    o->va_window_base = base;
    o->va_window_size = size;
  } else if (key == "socket-group") {
    o->socket_group = value;
  } else if (key == "allow-uid") {
    if (!ParseCount(value, &n) || n >= UINT32_MAX) return Bad(key, value, "a numeric uid");
    o->allow_uids.push_back(static_cast<uid_t>(n));
  } else if (key == "allow-gid") {
    Result<gid_t> gid = ResolveGroup(value);
    if (!gid.ok()) return Bad(key, value, "a group that exists, by name or number: " + gid.status().message());
    o->allow_gids.push_back(*gid);
  } else if (key == "log-level") {
    auto it = std::find(std::begin(kLogLevelNames), std::end(kLogLevelNames), value);
    if (it == std::end(kLogLevelNames)) return Bad(key, value, "error, warn, info or debug");
    o->log_level = static_cast<int>(it - std::begin(kLogLevelNames));
  } else if (key == "metrics-listen") {
    std::string ip;
    uint16_t port = 0;
    if (!MetricsHttp::ParseAddress(value, &ip, &port)) return Bad(key, value, "PORT or IPV4:PORT");
    o->metrics_listen = value;
  } else if (key == "kv-disk") {
    if (value.empty()) return Bad(key, value, "a directory");
    o->kv_disk = value;
  } else if (key == "kv-store") {
    MB_RETURN_IF_ERROR(ParseKvStore(key, value, o));
  } else if (key == "kv-disk-bytes") {
    if (!ParseSize(value, &n) || n == 0) return Bad(key, value, "a size such as 16G");
    o->kv_disk_bytes = n;
  } else if (key == "cluster") {
    Status st = ParseClusterUrl(value, &o->cluster.endpoints);
    if (!st.ok()) return Bad(key, value, st.message());
  } else if (key == "cluster-namespace") {
    if (!CheckHostName(value).ok()) return Bad(key, value, "letters, digits, '.', '_' and '-'");
    o->cluster.ns = value;
  } else if (key == "host-name") {
    Status st = CheckHostName(value);
    if (!st.ok()) return Bad(key, value, st.message());
    o->cluster.host_name = value;
  } else if (key == "cluster-ttl-s") {
    if (!ParseCount(value, &n) || n < 2 || n > 60) return Bad(key, value, "seconds, 2 to 60");
    o->cluster.ttl_s = static_cast<uint32_t>(n);
  } else if (key == "cluster-user") {
    if (value.empty()) return Bad(key, value, "a user name");
    o->cluster.user = value;
  } else if (key == "cluster-password-file") {
    if (value.empty()) return Bad(key, value, "a file");
    o->cluster.password_file = value;
  } else if (key == "cluster-ca" || key == "cluster-cert" || key == "cluster-key") {
    if (value.empty()) return Bad(key, value, "a file");
    (key == "cluster-ca" ? o->cluster.ca_file : key == "cluster-cert" ? o->cluster.cert_file : o->cluster.key_file) = value;
  } else if (key == "log-format") {
    if (value != "text" && value != "json") return Bad(key, value, "text or json");
    o->log_json = value == "json";
  } else if (key == "verbose") {
    if (value.empty() || value == "true" || value == "1") o->log_level = 3;
  } else {
    return Status(ErrorCode::kParamInvalid, "unknown setting '" + key + "'");
  }
  return Status::Ok();
}

Status LoadConfig(const std::string& path, Options* out) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "cannot read config file " + path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    size_t eq = line.find('=');
    std::string key = Trim(line.substr(0, eq));
    std::string value = eq == std::string::npos ? "" : Trim(line.substr(eq + 1));
    Status st = ApplySetting(key, value, out);
    if (!st.ok()) return Status(st.code(), path + ":" + std::to_string(n) + ": " + st.message());
  }
  return Status::Ok();
}

Status ParseArgs(int argc, char** argv, Options* out, bool* help) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return Status::Ok();
    }
    if (a == "--verbose") {
      out->log_level = 3;
      continue;
    }
    if (a == "--take-over") {
      out->take_over = true;
      continue;
    }
    if (a == "--fd-store") {
      out->fd_store = true;
      continue;
    }
    if (a == "--supervise") {
      out->supervise = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc)
      return Status(ErrorCode::kParamInvalid, "bad argument '" + a + "'");
    std::string key = a.substr(2), value = argv[++i];
    MB_RETURN_IF_ERROR(key == "config" ? LoadConfig(value, out) : ApplySetting(key, value, out));
  }
  if (out->socket_path.empty()) return Status(ErrorCode::kParamInvalid, "--socket is required");
  if (out->admin_socket_path.empty()) out->admin_socket_path = out->socket_path + ".admin";
  if (out->state_file.empty()) out->state_file = out->socket_path + ".state";
  return Status::Ok();
}

}  // namespace membroker::broker
