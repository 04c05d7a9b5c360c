#include "top.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "membroker/ipc/admin_client.h"
#include "membroker/ipc/escape.h"

namespace membroker::ctl {
namespace {

using Object = std::map<std::string, std::string>;  // a flat JSON object: numbers as text, strings unescaped

// A reader of the admin's JSON (flat objects, arrays of them). What does not
// parse leaves *ok false; nothing is trusted beyond that.
class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}
  bool ok() const { return ok_; }

  Object ReadObject() {
    Object o;
    if (!Expect('{')) return o;
    if (Peek() == '}') return ++i_, o;
    do {
      std::string key = ReadString();
      if (!Expect(':')) return o;
      o[key] = Peek() == '"' ? ReadString() : ReadToken();
    } while (ok_ && Peek() == ',' && ++i_);
    Expect('}');
    return o;
  }
  std::vector<Object> ReadArray() {
    std::vector<Object> rows;
    if (!Expect('[')) return rows;
    if (Peek() == ']') return ++i_, rows;
    do rows.push_back(ReadObject());
    while (ok_ && Peek() == ',' && ++i_);
    Expect(']');
    return rows;
  }

 private:
  char Peek() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  bool Expect(char c) {
    if (Peek() != c)
      ok_ = false;
    else
      ++i_;
    return ok_;
  }
  std::string ReadToken() {  // a number, true, false or null
    Peek();
    const size_t start = i_;
    while (i_ < s_.size() && std::string_view("-+.0123456789eEtruefalsn").find(s_[i_]) != std::string_view::npos) ++i_;
    if (i_ == start) ok_ = false;
    return s_.substr(start, i_ - start);
  }
  std::string ReadString() {
    std::string out;
    if (!Expect('"')) return out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      c = s_[i_++];
      if (c == 'u' && i_ + 4 <= s_.size()) {
        const unsigned long cp = std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16);
        i_ += 4;
        if (cp < 0x80)
          out += static_cast<char>(cp);
        else if (cp < 0x800)
          out += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
        else
          out += {static_cast<char>(0xe0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3f)),
                  static_cast<char>(0x80 | (cp & 0x3f))};
      } else {
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
      }
    }
    Expect('"');
    return out;
  }
  const std::string& s_;
  size_t i_ = 0;
  bool ok_ = true;
};

uint64_t Num(const Object& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

std::string Bytes(uint64_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string Now() {
  const time_t t = std::time(nullptr);
  tm utc{};
  gmtime_r(&t, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

volatile sig_atomic_t g_stop = 0;

// The terminal in raw-ish mode (keys without Enter, no echo) while top runs.
class RawTerminal {
 public:
  RawTerminal() {
    if (::isatty(0) && ::tcgetattr(0, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      active_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
    }
  }
  ~RawTerminal() {
    if (active_) ::tcsetattr(0, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

struct Sample {
  std::chrono::steady_clock::time_point at;
  uint64_t requests = 0, errors = 0;
};

// One frame: the broker's figures, then its clients by bytes held.
std::string Frame(const std::string& admin, Sample* last, int rows) {
  auto stats_text = ipc::AskAdmin(admin, "stats --json");
  auto clients_text = stats_text.ok() ? ipc::AskAdmin(admin, "list clients --json") : stats_text;
  std::string out = "membrokerd at " + ipc::EscapeText(admin) + "   " + Now() + "   (q quits)\n";
  if (!stats_text.ok() || !clients_text.ok())
    return out + "cannot reach the broker: " +
           ipc::EscapeText((stats_text.ok() ? clients_text : stats_text).status().message()) + "\n";
  JsonReader sr(*stats_text), cr(*clients_text);
  const Object s = sr.ReadObject();
  std::vector<Object> clients = cr.ReadArray();
  if (!sr.ok() || !cr.ok()) return out + "the broker's answer did not parse\n";

  const Sample now{std::chrono::steady_clock::now(), Num(s, "requests"), Num(s, "errors_sent")};
  std::string req_rate = "-", err_rate = "-";
  if (last->at.time_since_epoch().count() != 0) {
    const double secs = std::chrono::duration<double>(now.at - last->at).count();
    if (secs > 0) {
      req_rate = std::to_string(static_cast<uint64_t>((now.requests - last->requests) / secs));
      err_rate = std::to_string(static_cast<uint64_t>((now.errors - last->errors) / secs));
    }
  }
  *last = now;
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "clients %llu (handshaking %llu)   requests/s %s   errors/s %s   waiters %llu   engines %llu   named %llu\n",
      (unsigned long long)Num(s, "clients_connected"), (unsigned long long)Num(s, "clients_handshaking"),
      req_rate.c_str(), err_rate.c_str(), (unsigned long long)Num(s, "waiters"), (unsigned long long)Num(s, "engines"),
      (unsigned long long)Num(s, "named_objects"));
  out += line;
  out += "memory  allocated " + Bytes(Num(s, "bytes_allocated")) + " of " + Bytes(Num(s, "bytes_budget")) +
         "   pinned " + Bytes(Num(s, "pinned_bytes")) + " of " + Bytes(Num(s, "pinned_budget")) + "   pending " +
         Bytes(Num(s, "bytes_pending")) + "   returning " + Bytes(Num(s, "bytes_returning")) + "\n";
  std::snprintf(
      line, sizeof(line),
      "by kind allocations: 4 KiB pages %llu, 2 MiB %llu, 1 GiB %llu   host registered %s   same-address %s\n",
      (unsigned long long)Num(s, "allocations_4k"), (unsigned long long)Num(s, "allocations_2m"),
      (unsigned long long)Num(s, "allocations_1g"), Bytes(Num(s, "host_registered_bytes")).c_str(),
      Bytes(Num(s, "same_address_bytes")).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "fds %llu of %llu   exports %llu   crashed %llu   kicked %llu\n\n",
                (unsigned long long)Num(s, "open_fds"), (unsigned long long)Num(s, "fd_limit"),
                (unsigned long long)Num(s, "exports_live"), (unsigned long long)Num(s, "clients_crashed"),
                (unsigned long long)Num(s, "clients_kicked"));
  out += line;

  std::sort(clients.begin(), clients.end(),
            [](const Object& a, const Object& b) { return Num(a, "bytes_held") > Num(b, "bytes_held"); });
  std::snprintf(line, sizeof(line), "%-6s %-8s %-24s %10s %6s %7s %10s %s\n", "ID", "PID", "NAME", "HELD", "ALLOCS",
                "IMPORTS", "PINNED", "CONNECTED_S");
  out += line;
  const int shown = std::max(1, rows - 7);
  for (int i = 0; i < static_cast<int>(clients.size()) && i < shown; ++i) {
    const Object& c = clients[static_cast<size_t>(i)];
    std::string name = ipc::EscapeText(c.count("name") ? c.at("name") : "");
    if (name.size() > 24) name = name.substr(0, 23) + "~";
    std::snprintf(line, sizeof(line), "%-6llu %-8llu %-24s %10s %6llu %7llu %10s %llu\n",
                  (unsigned long long)Num(c, "id"), (unsigned long long)Num(c, "pid"), name.c_str(),
                  Bytes(Num(c, "bytes_held")).c_str(), (unsigned long long)Num(c, "allocations"),
                  (unsigned long long)Num(c, "imports"), Bytes(Num(c, "pinned_bytes")).c_str(),
                  (unsigned long long)Num(c, "connected_s"));
    out += line;
  }
  if (static_cast<int>(clients.size()) > shown)
    out += "... " + std::to_string(clients.size() - static_cast<size_t>(shown)) + " more\n";
  return out;
}

}  // namespace

int RunTop(const std::string& admin, int interval_ms, bool once) {
  Sample last;
  if (once) {
    const std::string f = Frame(admin, &last, 1 << 20);
    std::fputs(f.c_str(), stdout);
    return f.find("cannot reach the broker") == std::string::npos ? 0 : 1;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  ::sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: poll returns at once
  ::sigaction(SIGTERM, &sa, nullptr);
  RawTerminal terminal;
  while (!g_stop) {
    winsize ws{};
    const int rows = ::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 ? ws.ws_row : 24;
    const std::string f = "\x1b[H\x1b[2J" + Frame(admin, &last, rows);
    std::fputs(f.c_str(), stdout);
    std::fflush(stdout);
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, interval_ms) == 1) {
      char key = 0;
      if (::read(0, &key, 1) <= 0 || key == 'q' || key == 'Q') break;  // EOF on stdin ends it too
    }
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace membroker::ctl
