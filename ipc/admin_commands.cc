#include "membroker/ipc/admin_commands.h"

#include <vector>


namespace membroker::ipc {

namespace {

using enum AdminCommandId;

constexpr AdminCommand kCommands[] = {
    {kStats, "stats", AdminArg::kNone, true, "counters and gauges",
     "Counters and gauges: clients, allocations, bytes, pinned memory, cleanups, engines, "
     "named objects, waiters, the broker's open fds."},
    {kMetrics, "metrics", AdminArg::kNone, false, "the stats in the Prometheus text format",
     "The stats in the Prometheus text exposition format (membroker_*; counters end in _total). "
     "It has no JSON form: stats --json has the same values."},
    {kListClients, "list clients", AdminArg::kNone, true, "connected clients",
     "Connected clients, one row each: its identity, since when, and what it holds (bytes held, "
     "allocations it created, imports, pinned bytes, host registrations).",
     "id pid uid name connected_since connected_s bytes_held allocations imports pinned_bytes host_registrations"},
    {kListAllocations, "list allocations", AdminArg::kNone, true, "live allocations",
     "Live allocations, one row each: size and pages, who made and who holds it, how it is "
     "shared, where it came from, its age.",
     "id size page_size pinned owner holders exported read_only fell_back from_pool fixed_address location age_ms"},
    {kListPools, "list pools", AdminArg::kNone, true, "pools and their refills",
     "Pools, one row each: the size class, what is ready and being refilled, and how takes "
     "fared.",
     "pool size page_size capacity ready refilling in_use hits misses refills refill_failures"},
    {kListQuotas, "list quotas", AdminArg::kNone, true, "usage and limits per uid and client",
     "Usage and limits, one row per uid and per client.",
     "who bytes pinned_bytes allocations imports limits"},
    {kListEngines, "list engines", AdminArg::kNone, true, "transfer engines",
     "Transfer engines, one row each: its client, registered ranges, peers, notifies, and its "
     "side towards other hosts (docs/TRANSFER.md).",
     "engine client regions registered_bytes peers notifies_queued notifies_refused listen net_in net_refused net_connections"},
    {kListNames, "list names", AdminArg::kNone, true, "named objects",
     "Named objects, one row each: the allocation, its size, how it is published, and its "
     "publisher.",
     "name allocation size read_only persist publisher_pid publisher_connected"},
    {kListChannels, "list channels", AdminArg::kNone, true, "channels: subscribers, queues, drops",
     "Channels (docs/PIPELINE.md), one row each, read from their control blocks: the publisher, "
     "geometry, subscribers, chunks queued (all queues, and the fullest), chunks in use, and the "
     "publisher's counts: published, dropped, unreceived, dead subscribers reaped, redelivered.",
     "name publisher_pid state mode when_full chunks chunk_bytes queue_depth subscribers queued fullest_queue "
     "chunks_in_use published dropped unreceived reaped redelivered"},
    {kListStores, "list stores", AdminArg::kNone, true, "KV-cache stores: blocks, hits, leases by client",
     "KV-cache stores (docs/KV.md), one row each: geometry and eviction policy, blocks sealed and "
     "being written, leases held, and since creation hits, misses, evictions, reservations refused "
     "for want of room and STALE answers, and with a disk tier blocks written to it, read back from "
     "it, and in it now; clients lists who holds leases and reservations now, "
     "as client:leases/reservations.",
     "name id block_size blocks slabs page_size eviction uid bytes sealed writing leases hits misses evictions "
     "exhausted stale spilled disk_hits disk_blocks disk_trimmed disk_write_skipped clients"},
    {kListHosts, "list hosts", AdminArg::kNone, true, "the cluster's hosts (--cluster)",
     "The hosts of the cluster (docs/CLUSTER.md), one row each, as etcd has them now: the host's "
     "name, its registration's generation (new each time its broker registers), its broker's pid, "
     "since when it is registered, whether it is this broker, and its engines that listen for other "
     "hosts, as name=address. Without --cluster, or while etcd is out of reach, an error says why.",
     "host generation pid since self engines"},
    {kListClusterNames, "list names --cluster", AdminArg::kNone, true, "names published for the cluster (--cluster)",
     "The names published with the cluster flag on every host of the cluster (docs/CLUSTER.md), one "
     "row each, as the hosts' records in etcd have them now: the name, the host and its "
     "generation, the size, whether lookups get it read-only, and the bytes of metadata. Without "
     "--cluster, or while etcd is out of reach, an error says why.",
     "name host generation size read_only metadata_bytes"},
    {kShowClient, "show client", AdminArg::kId, true, "one client and what it holds",
     "One client, with the ids of the allocations it holds."},
    {kShowAllocation, "show allocation", AdminArg::kId, true, "one allocation and its holders",
     "One allocation, with the clients that hold it (never its tokens)."},
    {kKickClient, "kick client", AdminArg::kId, true, "disconnect a client, release its holdings",
     "Disconnect a client and release everything it held, exactly as if it had crashed."},
    {kFreeAllocation, "free allocation", AdminArg::kId, true, "drop every reference to one",
     "Stop exporting an allocation and drop every holder's broker reference (clients, transfer "
     "engines, named objects). Processes that mapped it keep their pages until they unmap them "
     "or exit: the broker cannot revoke a mapping."},
    {kUnpublish, "unpublish", AdminArg::kName, true, "remove a named object",
     "Remove a named object, persistent ones included (their publishers may be long gone)."},
    {kConfig, "config", AdminArg::kNone, true, "the effective configuration",
     "The broker's effective configuration."},
    {kCheck, "check", AdminArg::kNone, true, "check that the broker's tables agree",
     "Walk the broker's tables and check that they agree: each allocation's holders against "
     "the ledgers, engine holdings and named objects; every charge against its owner; every "
     "waiter against its client. Answers consistent, or the first disagreement (exit 1). The "
     "test suite runs it after every test."},
    {kHelp, "help", AdminArg::kNone, true, "this list", "The list of commands."},
};

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

// How many leading words of `have` spell c.words, or 0.
size_t Matches(const AdminCommand& c, const std::vector<std::string_view>& have) {
  std::vector<std::string_view> want = Words(c.words);
  if (have.size() < want.size()) return 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (have[i] != want[i]) return 0;
  return want.size();
}

Status Invalid(std::string message) { return Status(ErrorCode::kParamInvalid, std::move(message)); }

// The command whose words begin `words` (the longest such), and how many
// words it took; nullptr if none.
const AdminCommand* Longest(const std::vector<std::string_view>& words, size_t* used) {
  const AdminCommand* found = nullptr;
  *used = 0;
  for (const AdminCommand& c : kCommands) {
    if (size_t n = Matches(c, words); n > *used) {
      *used = n;
      found = &c;
    }
  }
  return found;
}

}  // namespace

std::span<const AdminCommand> AdminCommands() { return kCommands; }

std::string_view AdminArgName(AdminArg arg) {
  switch (arg) {
    case AdminArg::kNone: return "";
    case AdminArg::kId: return "ID";
    case AdminArg::kName: return "NAME";
  }
  return "";
}

std::string AdminUsage(const AdminCommand& c) {
  std::string out(c.words);
  if (c.arg != AdminArg::kNone) out += " " + std::string(AdminArgName(c.arg));
  return out;
}

Result<AdminRequest> ParseAdminLine(std::string_view line) {
  AdminRequest r;
  std::vector<std::string_view> words;
  for (std::string_view w : Words(line)) {
    if (w == "--json")
      r.json = true;
    else
      words.push_back(w);
  }
  std::string typed;
  for (std::string_view w : words) typed += (typed.empty() ? "" : " ") + std::string(w);
  if (words.empty()) return Invalid("no command (try: help)");
  size_t used = 0;
  r.command = Longest(words, &used);
  if (r.command == nullptr) return Invalid("unknown command '" + typed + "' (try: help)");
  const AdminCommand& c = *r.command;
  const size_t extra = words.size() - used;
  if (c.arg == AdminArg::kNone && extra != 0)
    return Invalid("'" + std::string(c.words) + "' takes no argument");
  if (c.arg != AdminArg::kNone && extra != 1)
    return Invalid("'" + std::string(c.words) + "' needs one " +
                   std::string(AdminArgName(c.arg)) + " (" + AdminUsage(c) + ")");
  if (c.arg != AdminArg::kNone) r.arg = std::string(words.back());
  if (c.arg == AdminArg::kId) {
    if (r.arg.size() > 19 || r.arg.find_first_not_of("0123456789") != std::string::npos)
      return Invalid("'" + r.arg + "' is not an ID (a decimal number)");
    r.id = std::stoull(r.arg);
  }
  if (r.json && !c.has_json)
    return Invalid("'" + std::string(c.words) + "' has no JSON form" +
                   (c.id == AdminCommandId::kMetrics ? " (stats --json has the same values)" : ""));
  return r;
}

const AdminCommand* FindAdminCommand(std::string_view line) {
  std::vector<std::string_view> words;
  for (std::string_view w : Words(line))
    if (w != "--json") words.push_back(w);
  size_t used = 0;
  return Longest(words, &used);
}

std::string AdminHelpText() {
  std::string out = "commands (add --json for JSON):\n";
  for (const AdminCommand& c : kCommands) {
    std::string usage = AdminUsage(c);
    out += "  " + usage + std::string(usage.size() < 22 ? 22 - usage.size() : 1, ' ') +
           std::string(c.summary) + "\n";
    if (!c.columns.empty()) out += std::string(24, ' ') + "columns: " + std::string(c.columns) + "\n";
  }
  return out;
}

}  // namespace membroker::ipc
