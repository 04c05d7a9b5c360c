// AdminTables: what `stats`, `list ...`, `show ...` and `config` print and the
// Prometheus text of `metrics`, read from the components (admin_records.cc).
// A view the broker makes for each admin request: it holds references and
// changes nothing; the operator's actions (kick, free, drop) are the broker's.
#pragma once

#include <string>
#include <vector>

#include "admin/admin_format.h"

namespace membroker::broker {

struct Options;
struct BrokerCounters;
class Admission;
class Sessions;
struct Session;
class MetricsHttp;
class FdStoreSync;
class Pools;
class Workers;
class Holdings;
struct Allocation;
class EngineRegistry;
class NameRegistry;
class KvStores;
class Waiters;
class Cluster;

struct AdminTables {
  Record Stats() const;
  std::string MetricsText() const;  // every number of Stats, and the per-device budgets
  Record Client(const Session& s) const;
  Record OfAllocation(const Allocation& a) const;
  Record Config() const;
  std::vector<Record> PoolRows() const;
  std::vector<Record> EngineRows() const;
  std::vector<Record> NameRows() const;
  std::vector<Record> StoreRows() const;
  std::vector<Record> QuotaRows() const;

  const Options& options;
  const BrokerCounters& counters;
  const Admission& admission;
  const Sessions& sessions;
  const MetricsHttp& metrics;
  const FdStoreSync& fd_store;
  const Pools& pools;
  const Workers& workers;
  const Holdings& holdings;
  const EngineRegistry& engines;
  const NameRegistry& names;
  const KvStores& kv;
  const Waiters& waiters;
  const Cluster& cluster;
};

}  // namespace membroker::broker
