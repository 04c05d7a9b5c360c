#include "admin/cluster_records.h"

#include <algorithm>

namespace membroker::broker {

void AddClusterStats(const ClusterView& v, Record& r) {
  r.Str("cluster", ClusterStateName(v.state))
      .Str("cluster_error", v.error.empty() ? "-" : v.error)
      .Num("cluster_up", v.state == ClusterState::kRegistered)
      .Num("cluster_hosts", v.hosts.size())
      .Num("cluster_generation", v.state == ClusterState::kRegistered ? static_cast<uint64_t>(v.generation) : 0)
      .Num("cluster_registrations", v.registrations)
      .Num("cluster_errors", v.errors)
      .Num("cluster_invalid_records", v.invalid_records)
      .Num("cluster_hosts_gone", v.hosts_gone);
}

void AddClusterConfig(const Cluster& cluster, const ClusterOptions& given, Record& r) {
  const ClusterOptions& o = cluster.started() ? cluster.options() : given;
  std::string url;
  for (const std::string& e : o.endpoints)
    url += (url.empty() ? (e.rfind("https", 0) == 0 ? "etcds://" : "etcd://") : ",") + e.substr(e.find("//") + 2);
  r.Str("cluster", url)
      .Str("cluster-namespace", o.ns)
      .Str("host-name", o.host_name)
      .Num("cluster-ttl-s", o.ttl_s)
      .Str("cluster-user", o.user)
      .Str("cluster-password-file", o.password_file)
      .Str("cluster-ca", o.ca_file)
      .Str("cluster-cert", o.cert_file)
      .Str("cluster-key", o.key_file);
}

namespace {

// The cluster's table, if there is one to show.
Result<ClusterView> Watched(const Cluster& cluster) {
  if (!cluster.started())
    return Status(ErrorCode::kUnsupported, "this broker runs without --cluster (docs/CLUSTER.md)");
  ClusterView v = cluster.View();
  if (!v.watching)
    return Status(ErrorCode::kNotConnected,
                  "etcd is out of reach" + (v.error.empty() ? std::string() : ": " + v.error));
  return v;
}

}  // namespace

Result<std::vector<Record>> ClusterNameRecords(const Cluster& cluster) {
  MB_ASSIGN_OR_RETURN(const ClusterView v, Watched(cluster));
  std::vector<std::pair<std::pair<std::string, std::string>, Record>> rows;
  for (const ClusterHost& h : v.hosts) {
    for (const HostName& n : h.record.names) {
      Record r;
      r.Str("name", n.name)
          .Str("host", h.record.host)
          .Num("generation", static_cast<uint64_t>(h.generation))
          .Num("size", n.size)
          .Bool("read_only", n.read_only)
          .Num("metadata_bytes", n.metadata.size());
      rows.push_back({{n.name, h.record.host}, std::move(r)});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Record> out;
  for (auto& [key, r] : rows) out.push_back(std::move(r));
  return out;
}

Result<std::vector<Record>> HostRecords(const Cluster& cluster) {
  MB_ASSIGN_OR_RETURN(const ClusterView v, Watched(cluster));
  std::vector<Record> rows;
  for (const ClusterHost& h : v.hosts) {
    std::string engines;
    for (const HostEngine& e : h.record.engines) engines += (engines.empty() ? "" : " ") + e.name + "=" + e.address;
    Record r;
    r.Str("host", h.record.host)
        .Num("generation", static_cast<uint64_t>(h.generation))
        .Num("pid", static_cast<uint64_t>(h.record.pid))
        .Time("since", h.record.started_s)
        .Bool("self", h.self)
        .Str("engines", engines.empty() ? "-" : engines);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace membroker::broker
