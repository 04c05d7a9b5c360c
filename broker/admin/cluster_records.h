// What the admin socket says of the cluster (cluster/cluster.h): the stats'
// cluster_* fields, `list hosts` and `list names --cluster`.
#pragma once

#include <vector>

#include "admin/admin_format.h"
#include "cluster/cluster.h"

namespace membroker::broker {

void AddClusterStats(const ClusterView& v, Record& r);
// The cluster's settings for `config` (the password file's path, never the password).
void AddClusterConfig(const Cluster& cluster, const ClusterOptions& given, Record& r);
// The hosts as etcd has them now; NOT_CONNECTED (with the reason) while the
// broker's watch of etcd is down, UNSUPPORTED without --cluster.
Result<std::vector<Record>> HostRecords(const Cluster& cluster);
// The names every host lists for the cluster, by name then host; the same errors.
Result<std::vector<Record>> ClusterNameRecords(const Cluster& cluster);

}  // namespace membroker::broker
