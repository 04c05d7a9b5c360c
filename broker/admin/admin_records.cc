// The admin records: what `stats`, `list ...` and `show ...` print, and the
// Prometheus text of `metrics`, read from the components.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "admin/admin_tables.h"
#include "admin/cluster_records.h"
#include "admin/metrics_http.h"
#include "cluster/cluster.h"
#include "counters.h"
#include "engine_registry.h"
#include "kv/kv_stores.h"
#include "log.h"
#include "memory/holdings.h"
#include "name_registry.h"
#include "options.h"
#include "restart/fd_store_sync.h"
#include "server/admission.h"
#include "server/sessions.h"
#include "waiters.h"
#include "membroker/ipc/admin_commands.h"
#include "membroker/ipc/page_policy.h"

namespace membroker::broker {

namespace {
size_t OpenFdCount() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    --n;  // the directory stream's own fd
  }
  return n;
}

// Every number of `stats` as a metric: whether it only grows (a Prometheus
// counter, "_total") and its HELP line. One list: a stat missing here is
// exported without help, which `promtool check metrics` fails
// (Cli/Metrics tests).
struct StatMetric {
  const char* key;
  bool counter;
  const char* help;
};
constexpr StatMetric kStatMetrics[] = {
    {"clients_connected", false, "Clients connected now, past their hello."},
    {"clients_total", true, "Clients that said hello since the broker started."},
    {"clients_crashed", true, "Clients whose connection ended without a goodbye."},
    {"clients_kicked", true, "Clients disconnected by the broker or the operator (protocol violation, slow reader, kick)."},
    {"clients_refused", true, "Clients refused at hello (not admitted, too many clients)."},
    {"clients_handshaking", false, "Connections that have not said hello yet."},
    {"connections_refused", true, "Connections refused before hello (out of fds, invisible pid, too many waiting)."},
    {"allocations_live", false, "Allocations the broker holds now."},
    {"allocations_4k", false, "Live allocations in 4 KiB pages."},
    {"allocations_2m", false, "Live allocations in 2 MiB huge pages."},
    {"allocations_1g", false, "Live allocations in 1 GiB huge pages."},
    {"huge_fallbacks", true, "Huge-first allocations that fell back to normal pages."},
    {"free_hugepages_2m", false, "Free 2 MiB huge pages in the kernel's pool."},
    {"free_hugepages_1g", false, "Free 1 GiB huge pages in the kernel's pool."},
    {"bytes_allocated", false, "Bytes of live allocations."},
    {"device_bytes", false,
     "Bytes of live CUDA device allocations, on all devices (per device: membroker_device_bytes_on)."},
    {"bytes_pending", false, "Bytes of allocations being created on workers."},
    {"bytes_returning", false, "Bytes of freed memory being returned on workers."},
    {"bytes_budget", false, "The budget for all allocations (--max-bytes), in bytes."},
    {"pinned_bytes", false, "Bytes of pinned allocations and host registrations."},
    {"pinned_budget", false, "The budget for pinned memory (--max-pinned-bytes), in bytes."},
    {"host_registered_bytes", false, "Bytes of host memory clients registered."},
    {"same_address_bytes", false, "Bytes of the same-address window in use."},
    {"engines", false, "Transfer engines registered."},
    {"engine_connections_ucx", false, "Engine connections to other hosts over UCX, as clients reported them."},
    {"engine_connections_same_host_by_address", false, "Engine connections by ip:port that took the same-host path."},
    {"engine_network_refused", false, "Network connections engines refused (wrong secret, not allowed), as reported."},
    {"waiters", false, "Requests waiting in the broker (lookups, events, connects)."},
    {"named_objects", false, "Named objects published."},
    {"kv_stores", false, "KV-cache stores."},
    {"kv_blocks", false, "KV blocks sealed and cached, in every store."},
    {"kv_writing", false, "KV blocks reserved and not yet sealed."},
    {"kv_leases", false, "KV read leases held by clients."},
    {"kv_hits", true, "KV keys found by gets and lookups."},
    {"kv_misses", true, "KV keys not found by gets and lookups."},
    {"kv_evictions", true, "KV blocks evicted to make room."},
    {"kv_stale", true, "KV references refused as STALE (their block was evicted and its slot reused)."},
    {"kv_restored", true, "KV blocks an earlier broker sealed, made again at this broker's start."},
    {"kv_lost", true, "KV blocks an earlier broker sealed that this one could not make again (a damaged record, a slab that did not come)."},
    {"kv_spilled", true, "KV blocks evicted from memory and written to the disk tier."},
    {"kv_disk_hits", true, "KV blocks a get read back from the disk tier (also counted in kv_hits)."},
    {"kv_disk_blocks", false, "KV blocks in the disk tier (--kv-disk)."},
    {"kv_disk_bytes", false, "Bytes of KV blocks in the disk tier."},
    {"kv_disk_writing", false, "KV blocks being written to the disk tier by workers."},
    {"kv_stores_restoring", false, "KV stores of an earlier broker still being copied into new slabs (a restart); requests naming one wait."},
    {"kv_disk_capacity", false, "The disk tier's capacity (--kv-disk-bytes), in bytes; 0 without a disk tier."},
    {"kv_disk_found", false, "KV blocks the disk tier found at the broker's start."},
    {"kv_disk_trimmed", true, "KV blocks removed from the disk tier to stay within its capacity."},
    {"kv_disk_damaged", true, "KV block files dropped because a check failed (never served)."},
    {"kv_disk_write_failed", true, "KV blocks the disk tier could not write (a full disk, an I/O error)."},
    {"kv_disk_write_skipped", true, "Evicted KV blocks not written: no room (the tier's files were being read or written) or too many bytes waiting to be written."},
    {"allocations_created", true, "Allocations created."},
    {"allocations_freed", true, "Allocations freed."},
    {"exports_live", false, "Export tokens live."},
    {"exports_created", true, "Export tokens created."},
    {"imports", true, "Imports of exported or named memory."},
    {"released_on_disconnect", true, "Holdings released because their client disconnected."},
    {"quota_rejections", true, "Requests refused by a quota or a budget."},
    {"clients_reattached", true, "Clients that reattached after a broker restart."},
    {"handles_reattached", true, "Handles clients presented again after a restart."},
    {"handles_adopted", true, "Presented handles of memory an earlier broker created."},
    {"reattach_refused", true, "Presented handles refused."},
    {"exports_restored", true, "Export tokens restored after a restart."},
    {"fd_store_stored", true, "Memfds stored in the fd store."},
    {"fd_store_states", true, "State memfds stored in the fd store."},
    {"fd_store_failures", true, "Stores the fd store refused."},
    {"fd_store_restored", true, "Allocations taken back from the fd store at start."},
    {"cluster_up", false, "1 while this broker is registered in the cluster's etcd (--cluster), else 0."},
    {"cluster_hosts", false, "Hosts of the cluster in this broker's table (itself included); 0 without --cluster."},
    {"cluster_generation", false, "This broker's registration in the cluster (its record's etcd revision); 0 when not registered."},
    {"cluster_registrations", true, "Times this broker registered its host in etcd (a lost lease registers again)."},
    {"cluster_errors", true, "Failed calls to etcd (unreachable, refused, malformed answers)."},
    {"cluster_invalid_records", true, "Host records in etcd that failed their checks and were ignored."},
    {"cluster_hosts_gone", true, "Other hosts whose records went (their broker stopped, died or was cut off)."},
    {"requests", true, "Requests served."},
    {"errors_sent", true, "Error replies sent."},
    {"protocol_errors", true, "Malformed or out-of-order messages received."},
    {"bytes_queued", false, "Reply bytes queued for clients that do not read."},
    {"open_fds", false, "File descriptors the broker has open."},
    {"fd_limit", false, "The broker's open-file limit."},
};

const StatMetric* FindStatMetric(const std::string& key) {
  for (const StatMetric& m : kStatMetrics)
    if (key == m.key) return &m;
  return nullptr;
}

}  // namespace

Record AdminTables::Stats() const {
  // Engines' connections to other hosts by the path taken, as their clients reported them.
  uint64_t net_ucx = 0, net_same_host = 0, net_refused = 0;
  for (const auto& [name, e] : engines.all()) {
    net_refused += e.network.refused;
    for (const auto& c : e.network.connections) (c.path == "ucx" ? net_ucx : net_same_host) += 1;
  }
  Record r;
  const AllocationTable& table = holdings.table();
  const TableCounters& t = table.counters();
  uint64_t by_page[3] = {0, 0, 0};  // 4 KiB, 2 MiB, 1 GiB
  for (const auto& [id, a] : table.all())
    ++by_page[a.page_size == ipc::kHuge1GPageSize ? 2 : a.page_size == ipc::kHuge2MPageSize ? 1 : 0];
  uint64_t host_registered = 0;
  for (const auto& [id, s] : sessions.all())
    for (const auto& [addr, size] : s->host_regs) host_registered += size;
  const KvStoreStats totals = kv.Totals();  // counters since start; the rest: now
  const KvDiskStats disk = kv.disk() ? kv.disk()->stats() : KvDiskStats{};
  uint64_t kv_sealed = 0, kv_writing = 0, kv_leases = 0;
  for (const auto& [name, store] : kv.all()) {
    kv_sealed += store->sealed_blocks();
    kv_writing += store->writing_blocks();
    kv_leases += store->leases_held();
  }
  r.Num("pid", static_cast<uint64_t>(::getpid()))
      .Num("clients_connected", sessions.size())
      .Num("clients_total", counters.clients_total)
      .Num("clients_crashed", sessions.Ends(CloseReason::kCrash))
      .Num("clients_kicked", sessions.Ends(CloseReason::kProtocolViolation) + sessions.Ends(CloseReason::kSlowReader) +
                                 sessions.Ends(CloseReason::kKicked))
      .Num("clients_refused", counters.clients_refused)
      .Num("clients_handshaking", sessions.Handshaking())
      .Num("connections_refused", admission.refused())
      .Num("allocations_live", table.all().size())
      .Num("allocations_4k", by_page[0])
      .Num("allocations_2m", by_page[1])
      .Num("allocations_1g", by_page[2])
      .Num("huge_fallbacks", t.huge_fallbacks)
      .Num("free_hugepages_2m", FreeHugePages(ipc::kHuge2MPageSize))
      .Num("free_hugepages_1g", FreeHugePages(ipc::kHuge1GPageSize))
      .Num("bytes_allocated", t.bytes_live)
      .Num("bytes_pending", counters.bytes_pending)
      .Num("bytes_returning", workers.bytes_returning())
      .Num("bytes_budget", options.max_bytes)
      .Str("bytes_budget_source", holdings.accounting().budget_source)
      .Num("device_bytes", holdings.accounting().total().device_bytes)
      .Num("pinned_bytes", holdings.accounting().total().pinned_bytes)
      .Num("pinned_budget", options.max_pinned_bytes)
      .Str("pinned_budget_source", holdings.accounting().pinned_budget_source)
      .Num("host_registered_bytes", host_registered)
      .Num("same_address_bytes", holdings.window().used())
      .Num("engines", engines.size())
      .Num("engine_connections_ucx", net_ucx)
      .Num("engine_connections_same_host_by_address", net_same_host)
      .Num("engine_network_refused", net_refused)
      .Num("waiters", waiters.size())
      .Num("named_objects", names.size())
      .Num("kv_stores", kv.all().size())
      .Num("kv_blocks", kv_sealed)
      .Num("kv_writing", kv_writing)
      .Num("kv_leases", kv_leases)
      .Num("kv_hits", totals.hits)
      .Num("kv_misses", totals.misses)
      .Num("kv_evictions", totals.evictions)
      .Num("kv_stale", totals.stale)
      .Num("kv_restored", totals.restored)
      .Num("kv_lost", totals.lost)
      .Num("kv_spilled", totals.spilled)
      .Num("kv_disk_hits", totals.disk_hits)
      .Num("kv_disk_blocks", disk.blocks)
      .Num("kv_disk_bytes", disk.bytes)
      .Num("kv_disk_writing", disk.writing)
      .Num("kv_stores_restoring", kv.restoring_count())
      .Num("kv_disk_capacity", kv.disk() ? kv.disk()->capacity() : 0)
      .Num("kv_disk_found", disk.found)
      .Num("kv_disk_trimmed", disk.trimmed)
      .Num("kv_disk_damaged", disk.damaged)
      .Num("kv_disk_write_failed", disk.write_failed)
      .Num("kv_disk_write_skipped", disk.write_skipped)
      .Num("allocations_created", t.allocations_created)
      .Num("allocations_freed", t.allocations_freed)
      .Num("exports_live", table.export_count())
      .Num("exports_created", t.exports_created)
      .Num("imports", t.imports)
      .Num("released_on_disconnect", counters.released_on_disconnect)
      .Num("quota_rejections", counters.quota_rejections)
      .Num("clients_reattached", counters.clients_reattached)
      .Num("handles_reattached", counters.handles_reattached)
      .Num("handles_adopted", counters.handles_adopted)
      .Num("reattach_refused", counters.reattach_refused)
      .Num("exports_restored", counters.exports_restored)
      .Num("fd_store_stored", fd_store.counters().stored)
      .Num("fd_store_states", fd_store.counters().states)
      .Num("fd_store_failures", fd_store.counters().failures)
      .Num("fd_store_restored", fd_store.counters().restored);
  AddClusterStats(cluster.View(), r);
  r.Num("requests", counters.requests)
      .Num("errors_sent", counters.errors_sent)
      .Num("protocol_errors", counters.protocol_errors)
      .Num("bytes_queued", sessions.queued_bytes())
      .Num("open_fds", OpenFdCount())
      .Num("fd_limit", FdLimit());
  return r;
}

Record AdminTables::Client(const Session& s) const {
  uint64_t bytes = 0, allocations = 0, imports = 0;
  for (uint64_t aid : s.ledger.Ids()) {
    const Allocation* a = holdings.Find(aid);
    if (a == nullptr) continue;
    bytes += a->size;
    (a->creator == s.id ? allocations : imports) += 1;
  }
  auto now = std::chrono::system_clock::now();
  Record r;
  r.Num("id", s.id)
      .Num("pid", static_cast<uint64_t>(s.cred.pid))
      .Num("uid", s.cred.uid)
      .Str("name", s.name)
      .Time("connected_since",
           std::chrono::duration_cast<std::chrono::seconds>(s.connected_since.time_since_epoch()).count())
      .Num("connected_s",
           std::chrono::duration_cast<std::chrono::seconds>(now - s.connected_since).count())
      .Num("bytes_held", bytes)
      .Num("allocations", allocations)
      .Num("imports", imports)
      .Num("pinned_bytes", s.usage.pinned_bytes)
      .Num("host_registrations", s.host_regs.size());
  return r;
}

Record AdminTables::OfAllocation(const Allocation& a) const {
  bool read_only = false;
  for (const std::string& t : a.tokens)
    if (const ExportEntry* e = holdings.table().FindExport(t); e && e->read_only_fd.valid()) read_only = true;
  Record r;
  r.Num("id", a.id)
      .Num("size", a.size)
      .Num("page_size", a.page_size)
      .Bool("pinned", a.pinned)
      .Num("owner", a.creator)
      .Num("holders", a.holders)
      .Bool("exported", !a.tokens.empty())
      .Bool("read_only", read_only)
      .Bool("fell_back", a.fell_back)
      .Bool("from_pool", a.pool >= 0)
      .Num("fixed_address", a.fixed_address)
      .Str("location", a.memory.device >= 0 ? "cuda:" + std::to_string(a.memory.device) : "host")
      .Num("age_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - a.created)
                         .count());
  return r;
}

std::string AdminTables::MetricsText() const {
  std::string out;
  const Record stats = Stats();
  for (const auto& f : stats.fields()) {
    if (f.key == "pid" || f.quoted) continue;  // not a number
    const StatMetric* m = FindStatMetric(f.key);
    const bool counter = m != nullptr && m->counter;
    std::string name = "membroker_" + f.key;
    if (counter && !name.ends_with("_total")) name += "_total";
    if (m != nullptr) out += "# HELP " + name + " " + m->help + "\n";
    out += "# TYPE " + name + (counter ? " counter\n" : " gauge\n") + name + " " + f.value + "\n";
  }
  // Per CUDA device: what is in use and its budget (--max-device-bytes).
  const Accounting& acc = holdings.accounting();
  if (!acc.max_device_bytes.empty()) {
    out +=
        "# HELP membroker_device_bytes_on Bytes of live allocations on one CUDA device.\n"
        "# TYPE membroker_device_bytes_on gauge\n";
    for (const auto& [device, budget] : acc.max_device_bytes)
      out += "membroker_device_bytes_on{device=\"" + std::to_string(device) + "\"} " +
             std::to_string(acc.device_total(device)) + "\n";
    out +=
        "# HELP membroker_device_bytes_budget The budget of one CUDA device (--max-device-bytes), in bytes.\n"
        "# TYPE membroker_device_bytes_budget gauge\n";
    for (const auto& [device, budget] : acc.max_device_bytes)
      out +=
          "membroker_device_bytes_budget{device=\"" + std::to_string(device) + "\"} " + std::to_string(budget) + "\n";
  }
  return out;
}

std::vector<Record> AdminTables::PoolRows() const {
  std::vector<Record> rows;
  for (size_t i = 0; i < pools.all().size(); ++i) {
    const Pool& p = pools.all()[i];
    Record r;
    r.Num("pool", i)
        .Num("size", p.spec.size)
        .Num("page_size", ipc::GranularityFor(p.spec.policy).minimum)
        .Num("capacity", p.spec.count)
        .Num("ready", p.ready.size())
        .Num("refilling", p.refilling)
        .Num("in_use", p.in_use)
        .Num("hits", p.hits)
        .Num("misses", p.misses)
        .Num("refills", p.refills)
        .Num("refill_failures", p.refill_failures);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<Record> AdminTables::EngineRows() const {
  std::vector<Record> rows;
  for (const auto& [name, e] : engines.all()) {
    uint64_t registered = 0;
    for (const auto& [addr, r] : e.regions) registered += r.length;
    Record r;
    r.Str("engine", name)
        .Num("client", e.session_id)
        .Num("regions", e.regions.size())
        .Num("registered_bytes", registered)
        .Num("peers", e.peers.size())
        .Num("notifies_queued", e.notifies.size())
        .Num("notifies_refused", e.notifies_dropped);
    // Its network side: what it listens on, and each connection it made by ip:port with the path taken.
    std::string paths;
    for (const auto& c : e.network.connections)
      paths += (paths.empty() ? "" : " ") + c.remote + "=" + c.path + "(" + c.transports + ")";
    r.Str("listen", e.network.listen_address.empty() ? "-" : e.network.listen_address)
        .Num("net_in", e.network.inbound)
        .Num("net_refused", e.network.refused)
        .Str("net_connections", paths.empty() ? "-" : paths);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<Record> AdminTables::NameRows() const {
  std::vector<Record> rows;
  for (const auto& [name, e] : names.all()) {
    const Allocation* a = holdings.Find(e.allocation);
    Record r;
    r.Str("name", name)
        .Num("allocation", e.allocation)
        .Num("size", a ? a->size : 0)
        .Bool("read_only", e.read_only)
        .Bool("persist", e.persist)
        .Num("publisher_pid", static_cast<uint64_t>(e.publisher_pid))
        .Bool("publisher_connected", e.publisher_session != 0);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<Record> AdminTables::StoreRows() const {
  std::vector<Record> rows;
  for (const auto& [name, store] : kv.all()) {
    const KvStoreSpec& spec = store->spec();
    const KvStoreStats& k = store->stats();
    std::string clients;
    for (const auto& [sid, held] : store->BySession())
      clients += (clients.empty() ? "" : ",") + std::to_string(sid) + ":" + std::to_string(held.first) + "/" +
                 std::to_string(held.second);
    Record r;
    r.Str("name", name)
        .Num("id", store->id())
        .Num("block_size", spec.block_size)
        .Num("blocks", spec.blocks)
        .Num("slabs", store->slab_count())
        .Num("page_size", store->page_size())
        .Str("eviction", std::string(EvictionName(spec.eviction)))
        .Num("uid", spec.uid)
        .Num("bytes", store->bytes())
        .Num("sealed", store->sealed_blocks())
        .Num("writing", store->writing_blocks())
        .Num("leases", store->leases_held())
        .Num("hits", k.hits)
        .Num("misses", k.misses)
        .Num("evictions", k.evictions)
        .Num("exhausted", k.exhausted)
        .Num("stale", k.stale)
        .Num("spilled", k.spilled)
        .Num("disk_hits", k.disk_hits)
        .Num("disk_blocks", kv.disk() ? kv.disk()->StoreUsage(name).first : 0)
        .Num("disk_trimmed", kv.disk() ? kv.disk()->LossesOf(name).trimmed : 0)
        .Num("disk_write_skipped", kv.disk() ? kv.disk()->LossesOf(name).write_skipped : 0)
        .Str("clients", clients.empty() ? "-" : clients);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<Record> AdminTables::QuotaRows() const {
  std::vector<Record> rows;
  auto row = [&](const std::string& who, const Usage& u, const QuotaLimits& l) {
    Record r;
    r.Str("who", who)
        .Num("bytes", u.bytes)
        .Num("pinned_bytes", u.pinned_bytes)
        .Num("allocations", u.allocations)
        .Num("imports", u.imports)
        .Str("limits", l.ToString());
    rows.push_back(std::move(r));
  };
  const Accounting& accounting = holdings.accounting();
  for (const auto& [uid, u] : accounting.by_uid()) row("uid:" + std::to_string(uid), u, accounting.LimitsFor(uid));
  for (const auto& [sid, s] : sessions.all()) row("client:" + std::to_string(sid), s->usage, accounting.client_limits);
  return rows;
}

Record AdminTables::Config() const {
  Record r;
  r.Str("socket", options.socket_path)
      .Str("admin-socket", options.admin_socket_path)
      .Num("max-bytes", options.max_bytes)
      .Num("max-pinned-bytes", options.max_pinned_bytes)
      .Num("max-clients", options.max_clients)
      .Str("quota-client", options.quota_client.ToString())
      .Str("quota-uid default", options.quota_uid_default.ToString());
  for (const auto& [uid, l] : options.quota_uid) r.Str(("quota-uid " + std::to_string(uid)).c_str(), l.ToString());
  std::string pool_specs;
  for (const auto& p : options.pools)
    pool_specs += (pool_specs.empty() ? "" : " ") + std::to_string(p.size) + ":" +
                  std::string(ipc::PagePolicyName(p.policy)) + ":" + std::to_string(p.count);
  std::string uids, gids;
  for (uid_t u : options.allow_uids) uids += (uids.empty() ? "" : ",") + std::to_string(u);
  for (gid_t g : options.allow_gids) gids += (gids.empty() ? "" : ",") + std::to_string(g);
  char window[64];
  std::snprintf(window, sizeof(window), "0x%llx:%llu", static_cast<unsigned long long>(options.va_window_base),
                static_cast<unsigned long long>(options.va_window_size));
  r.Str("pool", pool_specs)
      .Str("va-window", window)
      .Str("allow-uid", uids)
      .Str("allow-gid", gids)
      .Str("socket-group", options.socket_group)
      .Str("log-level", kLogLevelNames[std::clamp(options.log_level, 0, 3)])
      .Str("log-format", options.log_json ? "json" : "text")
      .Str("metrics-listen", metrics.address())
      .Bool("fd-store", options.fd_store)
      .Str("state-file", options.state_file);
  AddClusterConfig(cluster, options.cluster, r);
  return r;
}

}  // namespace membroker::broker
