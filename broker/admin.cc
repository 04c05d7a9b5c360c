// The admin socket: a SOCK_STREAM Unix socket (mode 0600) taking one command
// line per connection and answering with text, or JSON with --json.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "admin_format.h"
#include "broker.h"
#include "log.h"
#include "membroker/ipc/admin_commands.h"

namespace membroker::broker {

namespace {
constexpr size_t kMaxAdminCommandBytes = 4096;

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

// Stats whose values only grow: Prometheus counters.
bool IsCounter(const std::string& key) {
  static const char* kCounters[] = {
      "clients_total", "clients_crashed", "clients_kicked", "clients_refused", "connections_refused",
      "allocations_created", "allocations_freed", "exports_created", "imports",
      "released_on_disconnect", "quota_rejections", "requests", "errors_sent",
      "protocol_errors", "huge_fallbacks", "clients_reattached", "handles_reattached",
      "handles_adopted", "reattach_refused", "exports_restored", "fd_store_stored", "fd_store_states",
      "fd_store_failures", "fd_store_restored"};
  return std::find(std::begin(kCounters), std::end(kCounters), key) != std::end(kCounters);
}

const char* const kPolicyNames[] = {"normal", "huge-first", "huge", "huge1g"};

}  // namespace

Record Broker::StatsRecord() const {
  // Engines' connections to other hosts by the path taken, as their clients reported them.
  uint64_t net_ucx = 0, net_same_host = 0, net_refused = 0;
  for (const auto& [name, e] : engines_) {
    net_refused += e.network.refused;
    for (const auto& c : e.network.connections) (c.path == "ucx" ? net_ucx : net_same_host) += 1;
  }
  Record r;
  const TableCounters& t = table_.counters();
  uint64_t by_page[3] = {0, 0, 0};  // 4 KiB, 2 MiB, 1 GiB
  for (const auto& [id, a] : table_.all())
    ++by_page[a.page_size == ipc::kHuge1GPageSize ? 2 : a.page_size == ipc::kHuge2MPageSize ? 1 : 0];
  uint64_t host_registered = 0;
  for (const auto& [id, s] : sessions_)
    for (const auto& [addr, size] : s->host_regs) host_registered += size;
  r.Num("pid", static_cast<uint64_t>(::getpid()))
      .Num("clients_connected", sessions_.size())
      .Num("clients_total", counters_.clients_total)
      .Num("clients_crashed", Closes(CloseWhy::kCrash))
      .Num("clients_kicked", Closes(CloseWhy::kProtocolViolation) + Closes(CloseWhy::kSlowReader) +
                                 Closes(CloseWhy::kKicked))
      .Num("clients_refused", counters_.clients_refused)
      .Num("clients_handshaking", Handshaking())
      .Num("connections_refused", counters_.connections_refused)
      .Num("allocations_live", table_.all().size())
      .Num("allocations_4k", by_page[0])
      .Num("allocations_2m", by_page[1])
      .Num("allocations_1g", by_page[2])
      .Num("huge_fallbacks", t.huge_fallbacks)
      .Num("free_hugepages_2m", ipc::FreeHugePages(ipc::kHuge2MPageSize))
      .Num("free_hugepages_1g", ipc::FreeHugePages(ipc::kHuge1GPageSize))
      .Num("bytes_allocated", t.bytes_live)
      .Num("bytes_pending", counters_.bytes_pending)
      .Num("bytes_returning", BytesReturning())
      .Num("bytes_budget", options_.max_bytes)
      .Str("bytes_budget_source", budget_source_)
      .Num("pinned_bytes", accounting_.total().pinned_bytes)
      .Num("pinned_budget", options_.max_pinned_bytes)
      .Str("pinned_budget_source", pinned_budget_source_)
      .Num("host_registered_bytes", host_registered)
      .Num("same_address_bytes", window_.used())
      .Num("engines", engines_.size())
      .Num("engine_connections_ucx", net_ucx)
      .Num("engine_connections_same_host_by_address", net_same_host)
      .Num("engine_network_refused", net_refused)
      .Num("waiters", waiters_.size())
      .Num("named_objects", names_.size())
      .Num("allocations_created", t.allocations_created)
      .Num("allocations_freed", t.allocations_freed)
      .Num("exports_live", table_.export_count())
      .Num("exports_created", t.exports_created)
      .Num("imports", t.imports)
      .Num("released_on_disconnect", counters_.released_on_disconnect)
      .Num("quota_rejections", counters_.quota_rejections)
      .Num("clients_reattached", counters_.clients_reattached)
      .Num("handles_reattached", counters_.handles_reattached)
      .Num("handles_adopted", counters_.handles_adopted)
      .Num("reattach_refused", counters_.reattach_refused)
      .Num("exports_restored", counters_.exports_restored)
      .Num("fd_store_stored", counters_.fd_store_stored)
      .Num("fd_store_states", counters_.fd_store_states)
      .Num("fd_store_failures", counters_.fd_store_failures)
      .Num("fd_store_restored", counters_.fd_store_restored)
      .Num("requests", counters_.requests)
      .Num("errors_sent", counters_.errors_sent)
      .Num("protocol_errors", counters_.protocol_errors)
      .Num("bytes_queued", outbound_bytes_)
      .Num("open_fds", OpenFdCount())
      .Num("fd_limit", FdLimit());
  return r;
}

Record Broker::ClientRecord(const Session& s) const {
  uint64_t bytes = 0, allocations = 0, imports = 0;
  for (uint64_t aid : s.ledger.Ids()) {
    const Allocation* a = table_.Find(aid);
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
      .Num("connected_since",
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

Record Broker::AllocationRecord(const Allocation& a) const {
  bool read_only = false;
  for (const std::string& t : a.tokens)
    if (const ExportEntry* e = table_.FindExport(t); e && e->read_only_fd.valid()) read_only = true;
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
      .Num("age_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - a.created)
                         .count());
  return r;
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
  switch (req.command->id) {
    case ipc::AdminCommandId::kStats:
      return RenderRecord(StatsRecord(), json);
    case ipc::AdminCommandId::kHelp: {
      if (!json) return ipc::AdminHelpText();
      std::vector<Record> rows;
      for (const ipc::AdminCommand& c : ipc::AdminCommands()) {
        Record r;
        r.Str("command", std::string(c.words))
            .Str("argument", std::string(ipc::AdminArgName(c.arg)))
            .Bool("json", c.has_json)
            .Str("summary", std::string(c.summary));
        rows.push_back(std::move(r));
      }
      return RenderTable(rows, json, "");
    }
    case ipc::AdminCommandId::kMetrics:
      return MetricsText();
    case ipc::AdminCommandId::kListClients: {
      std::vector<Record> rows;
      for (const auto& [sid, s] : sessions_) rows.push_back(ClientRecord(*s));
      return RenderTable(rows, json, "no clients");
    }
    case ipc::AdminCommandId::kListAllocations: {
      std::vector<Record> rows;
      for (const auto& [aid, a] : table_.all()) rows.push_back(AllocationRecord(a));
      return RenderTable(rows, json, "no allocations");
    }
    case ipc::AdminCommandId::kListPools:
      return RenderTable(PoolRecords(), json, "no pools (see --pool)");
    case ipc::AdminCommandId::kListEngines:
      return RenderTable(EngineRecords(), json, "no engines");
    case ipc::AdminCommandId::kListNames:
      return RenderTable(NameRecords(), json, "no named objects");
    case ipc::AdminCommandId::kUnpublish: {
      auto it = names_.find(req.arg);
      if (it == names_.end()) return RenderError("no named object '" + req.arg + "'", json);
      Unpublish(it, 0);
      Record r;
      r.Str("unpublished", req.arg);
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kListQuotas:
      return RenderTable(QuotaRecords(), json, "nothing charged");
    case ipc::AdminCommandId::kShowClient: {
      Session* s = FindSession(id);
      if (s == nullptr) return RenderError("no client " + std::to_string(id), json);
      Record r = ClientRecord(*s);
      std::vector<uint64_t> ids = s->ledger.Ids();
      std::sort(ids.begin(), ids.end());
      std::string held;
      for (uint64_t aid : ids) held += (held.empty() ? "" : ",") + std::to_string(aid);
      r.Str("holds", held);
      return RenderRecord(r, json);
    }
    case ipc::AdminCommandId::kShowAllocation: {
      const Allocation* a = table_.Find(id);
      if (a == nullptr) return RenderError("no allocation " + std::to_string(id), json);
      Record r = AllocationRecord(*a);
      std::string holders;
      for (const auto& [sid, s] : sessions_)
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
      return RenderRecord(ConfigRecord(), json);
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

std::string Broker::MetricsText() const {
  std::string out;
  const Record stats = StatsRecord();
  for (const auto& f : stats.fields()) {
    if (f.key == "pid" || f.quoted) continue;  // not a number
    bool counter = IsCounter(f.key);
    std::string name = "membroker_" + f.key + (counter ? "_total" : "");
    if (f.key == "clients_total") name = "membroker_clients_total";
    out += "# TYPE " + name + (counter ? " counter\n" : " gauge\n") + name + " " + f.value + "\n";
  }
  return out;
}

std::vector<Record> Broker::PoolRecords() const {
  std::vector<Record> rows;
  for (size_t i = 0; i < pools_.size(); ++i) {
    const Pool& p = pools_[i];
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

std::vector<Record> Broker::EngineRecords() const {
  std::vector<Record> rows;
  for (const auto& [name, e] : engines_) {
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

std::vector<Record> Broker::NameRecords() const {
  std::vector<Record> rows;
  for (const auto& [name, e] : names_) {
    const Allocation* a = table_.Find(e.allocation);
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

std::vector<Record> Broker::QuotaRecords() const {
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
  for (const auto& [uid, u] : accounting_.by_uid())
    row("uid:" + std::to_string(uid), u, accounting_.LimitsFor(uid));
  for (const auto& [sid, s] : sessions_)
    row("client:" + std::to_string(sid), s->usage, accounting_.client_limits);
  return rows;
}

Record Broker::ConfigRecord() const {
  Record r;
  r.Str("socket", options_.socket_path)
      .Str("admin-socket", options_.admin_socket_path)
      .Num("max-bytes", options_.max_bytes)
      .Num("max-pinned-bytes", options_.max_pinned_bytes)
      .Num("max-clients", options_.max_clients)
      .Str("quota-client", options_.quota_client.ToString())
      .Str("quota-uid default", options_.quota_uid_default.ToString());
  for (const auto& [uid, l] : options_.quota_uid)
    r.Str(("quota-uid " + std::to_string(uid)).c_str(), l.ToString());
  std::string pools;
  for (const auto& p : options_.pools)
    pools += (pools.empty() ? "" : " ") + std::to_string(p.size) + ":" +
             kPolicyNames[static_cast<int>(p.policy)] + ":" + std::to_string(p.count);
  std::string uids, gids;
  for (uid_t u : options_.allow_uids) uids += (uids.empty() ? "" : ",") + std::to_string(u);
  for (gid_t g : options_.allow_gids) gids += (gids.empty() ? "" : ",") + std::to_string(g);
  char window[64];
  std::snprintf(window, sizeof(window), "0x%llx:%llu",
                static_cast<unsigned long long>(options_.va_window_base),
                static_cast<unsigned long long>(options_.va_window_size));
  r.Str("pool", pools)
      .Str("va-window", window)
      .Str("allow-uid", uids)
      .Str("allow-gid", gids)
      .Str("socket-group", options_.socket_group)
      .Num("log-level", static_cast<uint64_t>(options_.log_level));
  return r;
}

struct AdminConnection {
  uv_pipe_t pipe{};
  uv_write_t write{};
  std::string in;
  std::string out;

  static void Close(AdminConnection* c) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->pipe),
             [](uv_handle_t* h) { delete static_cast<AdminConnection*>(h->data); });
  }
};

Status Broker::ListenAdmin() {
  MB_RETURN_IF_ERROR(PrepareSocketPath(options_.admin_socket_path));
  uv_pipe_init(&loop_, &admin_pipe_, 0);
  admin_pipe_.data = this;
  mode_t old = ::umask(0177);  // 0600: the broker's own uid only
  int rc = uv_pipe_bind(&admin_pipe_, options_.admin_socket_path.c_str());
  ::umask(old);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&admin_pipe_), 16, OnAdminConnection);
  if (rc != 0)
    return Status(ErrorCode::kInternal,
                  "admin socket " + options_.admin_socket_path + ": " + uv_strerror(rc));
  return Status::Ok();
}

void Broker::OnAdminConnection(uv_stream_t* server, int status) {
  if (status < 0) return;
  auto* c = new AdminConnection();
  uv_pipe_init(server->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->pipe)) != 0) {
    AdminConnection::Close(c);
    return;
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->pipe),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = suggested;
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<AdminConnection*>(stream->data);
        std::unique_ptr<char[]> owned(buf->base);
        if (n < 0) {
          AdminConnection::Close(c);
          return;
        }
        c->in.append(buf->base, static_cast<size_t>(n));
        size_t nl = c->in.find('\n');
        if (nl == std::string::npos && c->in.size() < kMaxAdminCommandBytes) return;
        uv_read_stop(stream);
        auto* broker = static_cast<Broker*>(stream->loop->data);
        c->out = broker->AdminCommand(c->in.substr(0, std::min(nl, kMaxAdminCommandBytes)));
        uv_buf_t reply = uv_buf_init(c->out.data(), static_cast<unsigned>(c->out.size()));
        c->write.data = c;
        uv_write(&c->write, stream, &reply, 1, [](uv_write_t* w, int) {
          AdminConnection::Close(static_cast<AdminConnection*>(w->data));
        });
      });
}

}  // namespace membroker::broker

namespace membroker::broker {

void CloseAdminConnections(uv_loop_t* loop, uv_handle_t* listener) {
  uv_walk(
      loop,
      [](uv_handle_t* h, void* arg) {
        if (h->type == UV_NAMED_PIPE && h != arg && !uv_is_closing(h))
          AdminConnection::Close(static_cast<AdminConnection*>(h->data));
      },
      listener);
}

}  // namespace membroker::broker
