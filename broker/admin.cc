// The admin socket: a SOCK_STREAM Unix socket (mode 0600) taking one command
// line per connection and answering with text, or JSON with --json.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "broker.h"
#include "log.h"

namespace membroker::broker {

namespace {
constexpr size_t kMaxAdminCommandBytes = 4096;

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

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

// Renders rows of (key, value) either as "key: value" text or as a JSON object.
class Record {
 public:
  Record& Num(const char* key, uint64_t v) { return Add(key, std::to_string(v), false); }
  Record& Str(const char* key, const std::string& v) { return Add(key, v, true); }
  Record& Bool(const char* key, bool v) { return Add(key, v ? "true" : "false", false); }

  std::string Json() const {
    std::string out = "{";
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (i) out += ", ";
      out += JsonString(rows_[i].key) + ": " +
             (rows_[i].quoted ? JsonString(rows_[i].value) : rows_[i].value);
    }
    return out + "}";
  }
  std::string Text(const char* sep) const {
    std::string out;
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (i) out += sep;
      out += rows_[i].key + "=" + rows_[i].value;
    }
    return out;
  }
  std::string Lines() const {
    std::string out;
    for (const auto& r : rows_) out += r.key + ": " + r.value + "\n";
    return out;
  }

 private:
  struct Row {
    std::string key, value;
    bool quoted;
  };
  Record& Add(const char* key, std::string v, bool quoted) {
    rows_.push_back({key, std::move(v), quoted});
    return *this;
  }
  std::vector<Row> rows_;
};

std::string RenderList(const std::vector<Record>& records, bool json, const char* empty) {
  if (json) {
    std::string out = "[";
    for (size_t i = 0; i < records.size(); ++i) out += (i ? ",\n " : "") + records[i].Json();
    return out + "]\n";
  }
  if (records.empty()) return std::string(empty) + "\n";
  std::string out;
  for (const auto& r : records) out += r.Text("  ") + "\n";
  return out;
}
}  // namespace

std::string Broker::AdminCommand(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  bool json = false;
  for (std::string w; in >> w;) {
    if (w == "--json")
      json = true;
    else
      words.push_back(w);
  }
  auto now_wall = std::chrono::system_clock::now();
  auto now = std::chrono::steady_clock::now();
  std::string cmd;
  for (const auto& w : words) cmd += (cmd.empty() ? "" : " ") + w;

  if (cmd == "stats") {
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
        .Num("clients_crashed", counters_.clients_crashed)
        .Num("clients_kicked", counters_.clients_kicked)
        .Num("allocations_live", table_.all().size())
        .Num("allocations_4k", by_page[0])
        .Num("allocations_2m", by_page[1])
        .Num("allocations_1g", by_page[2])
        .Num("huge_fallbacks", t.huge_fallbacks)
        .Num("free_hugepages_2m", ipc::FreeHugePages(ipc::kHuge2MPageSize))
        .Num("free_hugepages_1g", ipc::FreeHugePages(ipc::kHuge1GPageSize))
        .Num("bytes_allocated", t.bytes_live)
        .Num("bytes_pending", counters_.bytes_pending)
        .Num("bytes_budget", options_.max_bytes)
        .Num("pinned_bytes", accounting_.total().pinned_bytes)
        .Num("pinned_budget", options_.max_pinned_bytes)
        .Num("host_registered_bytes", host_registered)
        .Num("same_address_bytes", window_.used())
        .Num("allocations_created", t.allocations_created)
        .Num("allocations_freed", t.allocations_freed)
        .Num("exports_live", table_.export_count())
        .Num("exports_created", t.exports_created)
        .Num("imports", t.imports)
        .Num("released_on_disconnect", counters_.released_on_disconnect)
        .Num("quota_rejections", counters_.quota_rejections)
        .Num("requests", counters_.requests)
        .Num("errors_sent", counters_.errors_sent)
        .Num("protocol_errors", counters_.protocol_errors)
        .Num("open_fds", OpenFdCount());
    return json ? r.Json() + "\n" : r.Lines();
  }
  if (cmd == "list pools") {
    std::vector<Record> rows;
    for (size_t i = 0; i < pools_.size(); ++i) {
      const Pool& p = pools_[i];
      Record r;
      r.Num("pool", i)
          .Num("size", p.spec.size)
          .Num("page_size", ipc::GranularityFor(p.spec.policy).minimum)
          .Num("capacity", p.spec.count)
          .Num("ready", p.ready.size())
          .Num("in_use", p.in_use)
          .Num("hits", p.hits)
          .Num("misses", p.misses)
          .Num("refills", p.refills)
          .Num("refill_failures", p.refill_failures);
      rows.push_back(std::move(r));
    }
    return RenderList(rows, json, "no pools (see --pool)");
  }
  if (cmd == "list quotas") {
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
      row("uid " + std::to_string(uid), u, accounting_.LimitsFor(uid));
    for (const auto& [id, s] : sessions_)
      row("client " + std::to_string(id), s->usage, accounting_.client_limits);
    return RenderList(rows, json, "nothing charged");
  }
  if (cmd == "list clients") {
    std::vector<Record> rows;
    for (const auto& [id, s] : sessions_) {
      uint64_t bytes = 0;
      for (const auto& [aid, a] : table_.all())
        if (s->ledger.Holds(aid)) bytes += a.size;
      Record r;
      r.Num("id", id)
          .Num("pid", static_cast<uint64_t>(s->cred.pid))
          .Num("uid", s->cred.uid)
          .Str("name", s->name)
          .Num("connected_since",
               std::chrono::duration_cast<std::chrono::seconds>(s->connected_since.time_since_epoch())
                   .count())
          .Num("connected_s", std::chrono::duration_cast<std::chrono::seconds>(
                                  now_wall - s->connected_since)
                                  .count())
          .Num("holdings", s->ledger.size())
          .Num("bytes_held", bytes)
          .Num("bytes_created", s->usage.bytes)
          .Num("pinned_bytes", s->usage.pinned_bytes)
          .Num("imports", s->usage.imports)
          .Num("host_registrations", s->host_regs.size());
      rows.push_back(std::move(r));
    }
    return RenderList(rows, json, "no clients");
  }
  if (cmd == "list allocations") {
    std::vector<Record> rows;
    for (const auto& [id, a] : table_.all()) {
      Record r;
      r.Num("id", id)
          .Num("size", a.size)
          .Num("page_size", a.page_size)
          .Num("owner", a.creator)
          .Num("holders", a.holders)
          .Bool("pinned", a.pinned)
          .Bool("fell_back", a.fell_back)
          .Bool("from_pool", a.pool >= 0)
          .Num("fixed_address", a.fixed_address)
          .Bool("exported", !a.tokens.empty())
          .Num("age_ms",
               std::chrono::duration_cast<std::chrono::milliseconds>(now - a.created).count());
      rows.push_back(std::move(r));
    }
    return RenderList(rows, json, "no allocations");
  }
  std::string msg = "unknown command '" + cmd +
                    "' (try: stats, list clients, list allocations, list pools, list quotas; add --json for JSON)";
  return json ? "{\"error\": " + JsonString(msg) + "}\n" : "error: " + msg + "\n";
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
