// A client of etcd's v3 API through its JSON gateway (POST /v3/...), over
// libcurl: the few calls the cluster view needs (leases, a claim of a key,
// prefix reads, deletes, a watch stream). Calls block, each bounded by a
// timeout; one client per thread (its curl handle is its own). It tries the
// endpoints in turn, and with a user it authenticates and sends etcd's token.
// Every answer goes through ParseEtcdAnswer (etcd_json.h) before it is used.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cluster/etcd_json.h"
#include "membroker/status.h"

struct curl_slist;

namespace membroker::broker {

struct EtcdConfig {
  std::vector<std::string> endpoints;  // "http://HOST:PORT"
  std::string user, password;          // etcd's authentication, when a user is set
  std::string ca_file, cert_file, key_file;  // https: etcd's CA (else the system's), our certificate
  uint32_t timeout_ms = 2000;          // each call, connecting included
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdConfig config);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  Result<int64_t> Grant(int64_t ttl_s);       // a lease's id
  Result<int64_t> KeepAlive(int64_t lease);   // its TTL now; 0: etcd no longer has it
  Status Revoke(int64_t lease);

  // Puts key = value under lease if the key is absent. Else nothing, and the
  // key as found (in *present).
  struct Claim {
    bool created = false;
    int64_t revision = 0;  // created: the key's create_revision
    EtcdKv present;
  };
  Result<Claim> PutIfAbsent(const std::string& key, const std::string& value, int64_t lease);
  // Puts key = value under lease if the key is still the one created at create_revision.
  Result<bool> PutIfCreatedAt(const std::string& key, const std::string& value, int64_t lease,
                              int64_t create_revision);
  // Deletes key if it is still at mod_revision; false if it changed.
  Result<bool> DeleteIfAt(const std::string& key, int64_t mod_revision);
  Status Put(const std::string& key, const std::string& value);  // no lease (tests, tools)

  struct Range {
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
  };
  Result<Range> RangePrefix(const std::string& prefix);

  // Streams the changes under prefix from start_revision: on_line gets each
  // answer of the stream. Returns when keep_going() says stop (checked at
  // least once a second), on_line returns an error, or the stream fails.
  Status Watch(const std::string& prefix, int64_t start_revision,
               const std::function<Status(const EtcdAnswer&)>& on_line, const std::function<bool()>& keep_going);

  const std::string& endpoint() const { return config_.endpoints[current_]; }

 private:
  // One POST of body to path, at each endpoint in turn until one answers.
  Result<EtcdAnswer> Call(const std::string& path, const std::string& body);
  Result<EtcdAnswer> CallOnce(const std::string& path, const std::string& body);
  ::curl_slist* Prepare(const std::string& path, const std::string& body);
  std::string Failure(int rc) const;
  Status Authenticate();

  EtcdConfig config_;
  size_t current_ = 0;
  void* curl_ = nullptr;  // CURL*
  std::string token_;
  std::string url_;       // the transfer's, alive while it runs
  char error_[256] = {};  // CURL_ERROR_SIZE: libcurl's detail of the last failure
};

}  // namespace membroker::broker
