// The admin commands (ipc/admin_commands.h lists them): each one a record or
// a table (admin_records.cc), or an operator's action - unpublish, kick a
// client, free an allocation - done as the client's own request would be.
#include <algorithm>

#include "admin/channel_census.h"
#include "admin/cluster_records.h"
#include "broker.h"
#include "log.h"
#include "membroker/ipc/admin_commands.h"

namespace membroker::broker {

namespace {
// A list answers with the columns the command table says (ipc/admin_commands.cc),
// which `help` prints and docs/OPERATIONS.md shows: a record that drifted from
// them is the broker's bug, said as such rather than printed.
std::string Table(const std::vector<Record>& rows, const ipc::AdminRequest& req, const char* empty) {
  for (const Record& r : rows) {
    std::string keys;
    for (const auto& f : r.fields()) keys += (keys.empty() ? "" : " ") + f.key;
    if (keys != req.command->columns)
      return RenderError("INTERNAL: `" + std::string(req.command->words) + "` made the columns '" + keys +
                             "', its table says '" + std::string(req.command->columns) + "'",
                         req.json);
  }
  return RenderTable(rows, req.json, empty);
}
}  // namespace

AdminTables Broker::Tables() const {
  return AdminTables{options_, counters_, admission_, sessions_, metrics_, fd_store_, pools_,
                     workers_, holdings_, engines_,   names_,    kv_,      waiters_,  cluster_};
}

std::string Broker::AdminCommand(const std::string& line) {
  auto parsed = ipc::ParseAdminLine(line);
  if (!parsed.ok()) {
    const bool json = (" " + line + " ").find(" --json ") != std::string::npos;
    return RenderError(parsed.status().message(), json);
  }
  const ipc::AdminRequest& req = *parsed;
  const bool json = req.json;
  const uint64_t id = req.id;
  const AdminTables tables = Tables();
  switch (req.command->id) {
    case ipc::AdminCommandId::kStats:
      return RenderRecord(tables.Stats(), json);
    case ipc::AdminCommandId::kHelp: {
      if (!json) return ipc::AdminHelpText();
      std::vector<Record> rows;
      for (const ipc::AdminCommand& c : ipc::AdminCommands()) {
        Record r;
        r.Str("command", std::string(c.words))
            .Str("argument", std::string(ipc::AdminArgName(c.arg)))
            .Bool("json", c.has_json)
            .Str("summary", std::string(c.summary))
            .Str("columns", std::string(c.columns));
        rows.push_back(std::move(r));
      }
      return RenderTable(rows, json, "");
    }
    case ipc::AdminCommandId::kMetrics:
      return tables.MetricsText();
    case ipc::AdminCommandId::kListClients: {
      std::vector<Record> rows;
      for (const auto& [sid, s] : sessions_.all()) rows.push_back(tables.Client(*s));
      return Table(rows, req, "no clients");
    }
    case ipc::AdminCommandId::kListAllocations: {
      std::vector<Record> rows;
      for (const auto& [aid, a] : holdings_.table().all()) rows.push_back(tables.OfAllocation(a));
      return Table(rows, req, "no allocations");
    }
    case ipc::AdminCommandId::kListPools:
      return Table(tables.PoolRows(), req, "no pools (see --pool)");
    case ipc::AdminCommandId::kListEngines:
      return Table(tables.EngineRows(), req, "no engines");
    case ipc::AdminCommandId::kListNames:
      return Table(tables.NameRows(), req, "no named objects");
    case ipc::AdminCommandId::kListChannels:
      return Table(ChannelRecords(names_, holdings_), req, "no channels");
    case ipc::AdminCommandId::kListStores:
      return Table(tables.StoreRows(), req, "no KV stores");
    case ipc::AdminCommandId::kListHosts: {
      Result<std::vector<Record>> hosts = HostRecords(cluster_);
      if (!hosts.ok()) return RenderError(hosts.status().ToString(), json);
      return Table(*hosts, req, "no hosts");
    }
    case ipc::AdminCommandId::kListClusterNames: {
      Result<std::vector<Record>> cluster_names = ClusterNameRecords(cluster_);
      if (!cluster_names.ok()) return RenderError(cluster_names.status().ToString(), json);
      return Table(*cluster_names, req, "no names published for the cluster");
    }
    case ipc::AdminCommandId::kUnpublish: {
      if (names_.Find(req.arg) == nullptr) return RenderError("no named object '" + req.arg + "'", json);
      Unpublish(req.arg, 0);
      Record r;
      r.Str("unpublished", req.arg);
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kListQuotas:
      return Table(tables.QuotaRows(), req, "nothing charged");
    case ipc::AdminCommandId::kShowClient: {
      const Session* s = sessions_.Find(id);
      if (s == nullptr) return RenderError("no client " + std::to_string(id), json);
      Record r = tables.Client(*s);
      std::vector<uint64_t> ids = s->ledger.Ids();
      std::sort(ids.begin(), ids.end());
      std::string held;
      for (uint64_t aid : ids) held += (held.empty() ? "" : ",") + std::to_string(aid);
      r.Str("holds", held);
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kShowAllocation: {
      const Allocation* a = holdings_.Find(id);
      if (a == nullptr) return RenderError("no allocation " + std::to_string(id), json);
      Record r = tables.OfAllocation(*a);
      std::string holders;
      for (const auto& [sid, s] : sessions_.all())
        if (s->ledger.Holds(id)) holders += (holders.empty() ? "" : ",") + std::to_string(sid);
      r.Str("held_by", holders).Num("tokens", a->tokens.size());  // never the tokens themselves
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kKickClient: {
      Status st = KickClient(id);
      if (!st.ok()) return RenderError(st.message(), json);
      Record r;
      r.Num("kicked_client", id);
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kFreeAllocation: {
      Status st = FreeAllocation(id);
      if (!st.ok()) return RenderError(st.message(), json);
      Record r;
      r.Num("freed_allocation", id)
          .Str("note", "processes that mapped it keep their pages until they unmap or exit");
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kConfig:
      return RenderRecord(tables.Config(), json);
    case ipc::AdminCommandId::kCheck: {
      Status st = CheckTables();
      if (!st.ok()) return RenderError(st.message(), json);
      Record r;
      r.Str("tables", "consistent");
      return RenderRecord(r, json);
    }
  }
  return RenderError("unhandled command", json);  // unreachable: the switch is exhaustive
}

Status Broker::FreeAllocation(uint64_t id) {
  if (holdings_.Find(id) == nullptr) return Status(ErrorCode::kNotFound, "no allocation " + std::to_string(id));
  size_t holders = 0;
  for (uint64_t sid : sessions_.Ids()) {
    Session* s = sessions_.Find(sid);
    if (s == nullptr) continue;
    holders += holdings_.Release(*s, id, Holding::kLedger) ? 1 : 0;
    holdings_.Release(*s, id, Holding::kEngine);
  }
  for (const std::string& name : names_.NamesWhere([&](const NamedEntry& e) { return e.allocation == id; }))
    Unpublish(name, 0);
  MB_INFO("allocation_freed_by_admin", "id=%llu holders=%zu", static_cast<unsigned long long>(id), holders);
  return Status::Ok();
}

}  // namespace membroker::broker
