// --cluster and its settings (cluster/cluster.h uses them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "membroker/status.h"

namespace membroker::broker {

struct ClusterOptions {
  std::vector<std::string> endpoints;  // "http://HOST:PORT", from --cluster etcd://HOST:PORT[,...]
  std::string ns = "membroker";        // --cluster-namespace: keys live under /membroker/NS/
  std::string host_name;               // --host-name; default: the machine's host name
  uint32_t ttl_s = 5;                  // --cluster-ttl-s: the lease, and so how long a dead host's records last
  std::string user;                    // --cluster-user, with its password in --cluster-password-file
  std::string password_file;
  // etcds://: TLS, etcd's certificate checked against --cluster-ca (else the
  // system's CAs), and this broker's own with --cluster-cert and --cluster-key.
  std::string ca_file, cert_file, key_file;
  bool enabled() const { return !endpoints.empty(); }
};

// "etcd://HOST:PORT[,HOST:PORT...]" into "http://HOST:PORT" endpoints,
// "etcds://..." into "https://...".
Status ParseClusterUrl(const std::string& url, std::vector<std::string>* endpoints);

}  // namespace membroker::broker
