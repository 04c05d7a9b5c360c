// Every admin command, the way an operator types it: through the membrokerctl
// binary, as text and as --json, against a broker that has something of each
// kind to show. And the docs: every command they mention exists, and every
// command in the table is documented.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <cstdio>
#include <map>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/channel.h"
#include "membroker/client.h"
#include "membroker/kv_store.h"
#include "membroker/ipc/admin_commands.h"
#include "membroker/ipc/channel_layout.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/transfer_engine.h"

namespace membroker::testing {
namespace {

struct Output {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs membrokerctl with args (no shell: arguments travel exactly), with
// env's NAME=VALUE entries added to its environment.
Output RunCtl(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    for (auto& e : env) ::putenv(e.data());
    std::vector<std::string> argv_s{BinaryPath("membrokerctl")};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Output o;
  // Outputs are small (well under a pipe's buffer): read one, then the other.
  for (auto [fd, into] : {std::pair{out_pipe[0], &o.out}, std::pair{err_pipe[0], &o.err}}) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) into->append(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> DocFiles() {
  const std::string root = MEMBROKER_SOURCE_DIR;
  std::vector<std::string> files{root + "/README.md"};
  for (const char* doc :
       {"API", "ARCHITECTURE", "BENCHMARKS", "CLUSTER", "MEMORY", "OPERATIONS", "PIPELINE", "PROTOCOL", "TRANSFER"})
    files.push_back(root + "/docs/" + doc + ".md");
  return files;
}

// The command part of a documented membrokerctl line: options and placeholders
// dropped or filled in ("membrokerctl --admin-socket S --json show client ID"
// -> "show client 1").
std::string CommandOf(const std::string& doc_line) {
  std::istringstream in(doc_line.substr(0, doc_line.find(" #")));  // a shell comment after it
  std::string word, out;
  in >> word;  // membrokerctl
  while (in >> word) {
    if (word == "--admin-socket" || word == "--socket" || word == "--timeout-ms") {
      in >> word;
      continue;
    }
    if (word == "--json" || word == "[--json]") continue;
    if (word == "ID" || word == "N") word = "1";
    if (word == "NAME") word = "some/name";
    out += (out.empty() ? "" : " ") + word;
  }
  return out;
}

TEST(Cli, EveryDocumentedCommandExists) {
  const std::regex mention("`(membrokerctl [^`]*)`|^(membrokerctl [^\\n]*)$", std::regex::multiline);
  size_t checked = 0;
  for (const std::string& file : DocFiles()) {
    const std::string text = ReadFile(file);
    ASSERT_FALSE(text.empty()) << file;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), mention); it != std::sregex_iterator(); ++it) {
      std::string line = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
      std::string cmd = CommandOf(line);
      if (cmd.empty() || cmd.find("COMMAND") != std::string::npos || cmd == "--help") continue;
      if (cmd == "top" || cmd.rfind("top ", 0) == 0) continue;  // membrokerctl's own, not the broker's
      if (cmd.size() > 7 && cmd.compare(cmd.size() - 7, 7, " --help") == 0) cmd.resize(cmd.size() - 7);
      auto parsed = ipc::ParseAdminLine(cmd);
      EXPECT_TRUE(parsed.ok()) << file << " documents `" << line << "`: " << parsed.status().message();
      ++checked;
    }
  }
  EXPECT_GE(checked, 5u);
}

TEST(Cli, EveryCommandIsDocumented) {
  const std::string ops = ReadFile(std::string(MEMBROKER_SOURCE_DIR) + "/docs/OPERATIONS.md");
  for (const ipc::AdminCommand& c : ipc::AdminCommands())
    EXPECT_NE(ops.find("`" + ipc::AdminUsage(c) + "`"), std::string::npos)
        << "docs/OPERATIONS.md does not list `" << ipc::AdminUsage(c) << "`";
}

// A list's columns are written once (the command table): the broker's records
// keep to them (it says INTERNAL otherwise), help prints them, and
// docs/OPERATIONS.md shows them, checked here word for word.
TEST(Cli, EveryListsColumnsAreTheTablesInHelpAndInTheDocs) {
  std::string ops = ReadFile(std::string(MEMBROKER_SOURCE_DIR) + "/docs/OPERATIONS.md");
  for (char& ch : ops)
    if (ch == '\n') ch = ' ';
  BrokerProcess b;
  const std::string help = b.Admin("help");
  size_t lists = 0;
  for (const ipc::AdminCommand& c : ipc::AdminCommands()) {
    if (c.columns.empty()) continue;
    ++lists;
    const std::string columns(c.columns);
    EXPECT_NE(ops.find("`" + ipc::AdminUsage(c) + "`: `" + columns + "`"), std::string::npos)
        << "docs/OPERATIONS.md does not show `" << ipc::AdminUsage(c) << "`: `" << columns << "`";
    EXPECT_NE(help.find("columns: " + columns), std::string::npos) << help;
  }
  EXPECT_EQ(lists, 10u);
}

TEST(Cli, EveryCommandRunsThroughTheCliAsTextAndJson) {
  BrokerProcess b({"--pool", "64K:normal:1"});
  const std::string admin = b.admin_socket();
  auto c = Client::Connect({b.socket(), "operator-view"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(1 << 20);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(c->Publish("cli/tensor", *h).ok());
  TransferEngine engine(*c);
  ASSERT_TRUE(engine.Initialize("cli-engine").ok());
  auto chan = ChannelPublisher::Create(*c, "cli/chan", {.chunks = 2, .chunk_bytes = 64, .queue_depth = 1});
  ASSERT_TRUE(chan.ok());
  auto store = KvStore::Create(*c, "cli/kv", {.block_size = 4096, .capacity = 4 * 4096});
  ASSERT_TRUE(store.ok());

  auto victim = Client::Connect({b.socket(), "victim"});
  ASSERT_TRUE(victim.ok());
  auto loose = victim->MallocPhysical(1 << 16);
  ASSERT_TRUE(loose.ok());

  // What each command is shown, and a word its text answer must contain.
  struct Expect {
    std::string arg;
    std::string text_has;
  };
  std::map<ipc::AdminCommandId, Expect> expect = {
      {ipc::AdminCommandId::kStats, {"", "clients_connected: 2"}},
      {ipc::AdminCommandId::kMetrics, {"", "membroker_clients_connected 2"}},
      {ipc::AdminCommandId::kListClients, {"", "operator-view"}},
      {ipc::AdminCommandId::kListAllocations, {"", "1048576"}},
      {ipc::AdminCommandId::kListPools, {"", "65536"}},
      {ipc::AdminCommandId::kListQuotas, {"", "client:" + std::to_string(c->client_id())}},
      {ipc::AdminCommandId::kListEngines, {"", "cli-engine"}},
      {ipc::AdminCommandId::kListNames, {"", "cli/tensor"}},
      {ipc::AdminCommandId::kListChannels, {"", "cli/chan"}},
      {ipc::AdminCommandId::kListStores, {"", "cli/kv"}},
      {ipc::AdminCommandId::kShowClient, {std::to_string(c->client_id()), "name: operator-view"}},
      {ipc::AdminCommandId::kShowAllocation, {std::to_string(h->id()), "held_by: "}},
      {ipc::AdminCommandId::kConfig, {"", "pool: 65536:normal:1"}},
      {ipc::AdminCommandId::kCheck, {"", "tables: consistent"}},
      {ipc::AdminCommandId::kHelp, {"", "kick client ID"}},
  };
  // The ones that change state run last, once each form, on things made for them.
  const std::vector<std::pair<ipc::AdminCommandId, std::vector<std::string>>> destructive = {
      {ipc::AdminCommandId::kUnpublish, {"cli/tensor", "cli/again"}},
      {ipc::AdminCommandId::kFreeAllocation, {std::to_string(loose->id()), ""}},
      {ipc::AdminCommandId::kKickClient, {std::to_string(victim->client_id()), ""}},
  };

  auto run = [&](const ipc::AdminCommand& cmd, const std::string& arg, bool json) {
    std::vector<std::string> args{"--admin-socket", admin};
    if (json) args.push_back("--json");
    std::istringstream words{std::string(cmd.words)};
    for (std::string w; words >> w;) args.push_back(w);
    if (!arg.empty()) args.push_back(arg);
    return RunCtl(args);
  };

  size_t ran = 0;
  for (const ipc::AdminCommand& cmd : ipc::AdminCommands()) {
    auto e = expect.find(cmd.id);
    if (e == expect.end()) continue;
    SCOPED_TRACE(std::string(cmd.words));
    Output text = run(cmd, e->second.arg, false);
    EXPECT_EQ(text.code, 0) << text.err;
    EXPECT_NE(text.out.find(e->second.text_has), std::string::npos) << text.out;
    if (!cmd.columns.empty()) {  // a list's header is its table's columns
      std::string header = text.out.substr(0, text.out.find('\n')), want(cmd.columns);
      std::istringstream got(header);
      std::string joined;
      for (std::string w; got >> w;) joined += (joined.empty() ? "" : " ") + w;
      std::transform(want.begin(), want.end(), want.begin(), ::toupper);
      EXPECT_EQ(joined, want);
    }
    Output json = run(cmd, e->second.arg, true);
    if (cmd.has_json) {
      EXPECT_EQ(json.code, 0) << json.err;
      ASSERT_FALSE(json.out.empty());
      EXPECT_TRUE(json.out.front() == '{' || json.out.front() == '[') << json.out;
    } else {
      EXPECT_EQ(json.code, 2) << json.out;  // a usage error, said before asking the broker
      EXPECT_NE(json.err.find("has no JSON form"), std::string::npos) << json.err;
    }
    ++ran;
  }
  // `list hosts` and `list names --cluster` need --cluster: here they say
  // so, in both forms (Cluster.* runs them against etcd).
  for (const ipc::AdminCommand& cmd : ipc::AdminCommands()) {
    if (cmd.id != ipc::AdminCommandId::kListHosts && cmd.id != ipc::AdminCommandId::kListClusterNames) continue;
    Output text = run(cmd, "", false), json = run(cmd, "", true);
    EXPECT_EQ(text.code, 1);
    EXPECT_NE(text.err.find("UNSUPPORTED: this broker runs without --cluster"), std::string::npos) << text.err;
    EXPECT_EQ(json.code, 1);
    EXPECT_EQ(json.err.rfind("{\"error\": ", 0), 0u) << json.err;
    ++ran;
  }
  // Publish a second name so unpublish runs once as text and once as JSON.
  ASSERT_TRUE(c->Publish("cli/again", *h).ok());
  for (const auto& [id, args] : destructive) {
    const ipc::AdminCommand* cmd = nullptr;
    for (const ipc::AdminCommand& k : ipc::AdminCommands())
      if (k.id == id) cmd = &k;
    ASSERT_NE(cmd, nullptr);
    SCOPED_TRACE(std::string(cmd->words));
    Output text = run(*cmd, args[0], false);
    EXPECT_EQ(text.code, 0) << text.err;
    // The second form acts on something else, or on the same thing again
    // (then the broker's answer is an error: exit 1, in JSON).
    Output json = run(*cmd, args[1].empty() ? args[0] : args[1], true);
    if (args[1].empty()) {
      EXPECT_EQ(json.code, 1) << json.out;
      EXPECT_EQ(json.err.rfind("{\"error\": ", 0), 0u) << json.err;
    } else {
      EXPECT_EQ(json.code, 0) << json.err;
      EXPECT_EQ(json.out.front(), '{') << json.out;
    }
    ++ran;
  }
  EXPECT_EQ(ran, ipc::AdminCommands().size()) << "a command has no case in this test";
  *chan = ChannelPublisher();  // unpublishes its two names
  EXPECT_EQ(b.Stat("named_objects"), 0u);
  EXPECT_EQ(b.Stat("clients_connected"), 1u);
}

// list channels, as an operator watches a pipeline: subscribers, queue fill,
// drops, a SIGKILLed subscriber reaped; and a control block a subscriber
// scribbled on is shown for what it is while the broker serves on.
TEST(Cli, ListChannelsShowsQueuesDropsAndADeadSubscriber) {
  BrokerProcess b;
  const std::string admin = b.admin_socket();
  auto list = [&](bool json) {
    std::vector<std::string> args{"--admin-socket", admin, "list", "channels"};
    if (json) args.insert(args.begin() + 2, "--json");
    Output o = RunCtl(args);
    EXPECT_EQ(o.code, 0) << o.err;
    return o.out;
  };
  auto expect_fields = [&](std::initializer_list<const char*> fields) {
    const std::string json = list(true);
    for (const char* f : fields) EXPECT_NE(json.find(f), std::string::npos) << f << " in " << json;
  };
  EXPECT_EQ(list(false), "no channels\n");

  auto c = Client::Connect({b.socket(), "publisher"});
  ASSERT_TRUE(c.ok());
  const ChannelOptions o{.chunks = 8, .chunk_bytes = 4096, .queue_depth = 4, .when_full = WhenFull::kDropOldest};
  auto pub = ChannelPublisher::Create(*c, "ops/frames", o);
  ASSERT_TRUE(pub.ok());
  auto watcher = Client::Connect({b.socket(), "watcher"});
  ASSERT_TRUE(watcher.ok());
  auto sub = ChannelSubscriber::Join(*watcher, "ops/frames");
  ASSERT_TRUE(sub.ok());
  // A second subscriber, in a process of its own: it joins and never takes.
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  const pid_t doomed = ForkChild([&] {
    auto cc = Client::Connect({b.socket(), "doomed"});
    if (!cc.ok()) return 10;
    auto joined = ChannelSubscriber::Join(*cc, "ops/frames");
    if (!joined.ok()) return 11;
    if (::write(ready[1], "j", 1) != 1) return 12;
    for (;;) ::pause();
  });
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_TRUE(pub->WaitForSubscribers(2, 5000).ok());

  // Six publications into queues of four: each queue drops its two oldest.
  for (int n = 0; n < 6; ++n) {
    auto chunk = pub->Loan(64, 5000);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    chunk->size = 64;
    ASSERT_TRUE(pub->Publish(*chunk, 5000).ok());
  }
  auto held = sub->Receive(5000);  // the watcher holds one, three stay queued
  ASSERT_TRUE(held.ok());
  expect_fields({"\"name\": \"ops/frames\"", "\"state\": \"open\"", "\"mode\": \"broadcast\"",
                 "\"when_full\": \"drop-oldest\"", "\"chunks\": 8", "\"queue_depth\": 4", "\"subscribers\": 2",
                 "\"queued\": 7", "\"fullest_queue\": 4", "\"chunks_in_use\": 4", "\"published\": 6", "\"dropped\": 4",
                 "\"reaped\": 0", ("\"publisher_pid\": " + std::to_string(::getpid())).c_str()});
  const std::string text = list(false);
  EXPECT_EQ(text.rfind("NAME", 0), 0u) << text;
  EXPECT_NE(text.find("ops/frames"), std::string::npos) << text;

  // SIGKILLed, then reaped by the publisher: its queue is gone, its count is 1.
  ::kill(doomed, SIGKILL);
  EXPECT_EQ(WaitChild(doomed), 128 + SIGKILL);
  EXPECT_EQ(pub->Reap(), 1u);
  expect_fields(
      {"\"subscribers\": 1", "\"reaped\": 1", "\"queued\": 3", "\"fullest_queue\": 3", "\"chunks_in_use\": 4"});

  // The control block is writable by every subscriber: what one writes there
  // is read as hostile. A queue longer than its depth counts as full; a block
  // that is no channel says so; the broker answers everyone throughout.
  auto vandal = Client::Connect({b.socket(), "vandal"});
  ASSERT_TRUE(vandal.ok());
  auto h = vandal->Lookup("ops/frames");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto m = MapWhole(*vandal, *h);
  ASSERT_TRUE(m.ok());
  namespace layout = detail::channel;
  const auto l = layout::Layout::For(o.chunks, o.chunk_bytes, o.queue_depth);
  auto& header = *m->as<layout::Header>();
  auto& slot = *reinterpret_cast<layout::SlotHeader*>(m->as<char>() + l.slots + l.slot_stride * sub->slot());
  const uint64_t tail = slot.tail.load();
  slot.tail.store(slot.head.load() + 1000000);
  expect_fields({"\"queued\": 4", "\"fullest_queue\": 4"});
  slot.tail.store(tail);
  header.chunks = 1u << 30;
  expect_fields({"\"state\": \"unreadable: its geometry is out of range\"", "\"subscribers\": 0"});
  header.chunks = 65536;  // in range, but a control block larger than this memory
  expect_fields({"\"state\": \"unreadable: smaller than its geometry says\""});
  header.chunks = o.chunks;
  const uint64_t magic = header.magic.exchange(0x4d424348414e4e33ull);  // layout 3's
  expect_fields({"\"state\": \"unreadable: not a channel of this layout\""});
  header.magic.store(magic);
  expect_fields({"\"state\": \"open\"", "\"subscribers\": 1"});
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
  ASSERT_TRUE(sub->Release(*held).ok());
}

TEST(Cli, UsageErrorsAreExitTwoWithAReason) {
  BrokerProcess b;
  const std::string admin = b.admin_socket();
  Output missing = RunCtl({"--admin-socket", admin, "show", "client"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("needs one ID"), std::string::npos) << missing.err;
  Output extra = RunCtl({"--admin-socket", admin, "stats", "now"});
  EXPECT_EQ(extra.code, 2);
  EXPECT_NE(extra.err.find("takes no argument"), std::string::npos) << extra.err;
  Output not_id = RunCtl({"--admin-socket", admin, "kick", "client", "seven"});
  EXPECT_EQ(not_id.code, 2);
  EXPECT_NE(not_id.err.find("not an ID"), std::string::npos) << not_id.err;
  // A hostile command line is escaped in the message: one line, no raw control bytes.
  Output odd = RunCtl({"--admin-socket", admin, "launch\n\x1b[2Jmissiles"});
  EXPECT_EQ(odd.code, 2);
  EXPECT_EQ(odd.err.find('\x1b'), std::string::npos) << odd.err;
  EXPECT_EQ(odd.err.find('\n'), odd.err.size() - 1) << odd.err;
  Output help = RunCtl({"unpublish", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("unpublish NAME"), std::string::npos) << help.out;
}

TEST(Cli, ClientStringsAreEscapedInTablesAndLogs) {
  BrokerProcess b({}, /*log_to_file=*/true);
  {
    // A quote cannot end a log field early, nor a backslash fake an escape.
    auto c = Client::Connect({b.socket(), "evil\" forged=\"yes \\"});
    ASSERT_TRUE(c.ok());
    auto h = c->MallocPhysical(4096);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(c->Publish("row \"quoted\"", *h).ok());
    // Control characters never get in, whoever sends them.
    EXPECT_EQ(c->Publish("row\nforged-row", *h).code(), ErrorCode::kParamInvalid);
    auto raw = ipc::ConnectSeqpacket(b.socket());
    ASSERT_TRUE(raw.ok());
    auto hello = ipc::Encode(
        {ipc::kProtocolVersion, 1, 0, ipc::HelloRequest{"x\nmembrokerd 2026-01-01T00:00:00.000Z info forged"}});
    ASSERT_TRUE(ipc::SendFrame(raw->get(), hello, {}).ok());
    ipc::Frame f;
    ASSERT_TRUE(ipc::RecvFrame(raw->get(), &f).ok());
    auto reply = ipc::Decode(f.bytes);
    ASSERT_TRUE(reply.ok());
    ASSERT_TRUE(std::holds_alternative<ipc::ErrorReply>(reply->body));
    EXPECT_EQ(std::get<ipc::ErrorReply>(reply->body).code, ErrorCode::kParamInvalid);

    Output clients = RunCtl({"--admin-socket", b.admin_socket(), "list", "clients"});
    EXPECT_EQ(clients.code, 0);
    EXPECT_NE(clients.out.find("evil\\\" forged=\\\"yes \\\\"), std::string::npos) << clients.out;
    Output names = RunCtl({"--admin-socket", b.admin_socket(), "list", "names"});
    EXPECT_NE(names.out.find("row \\\"quoted\\\""), std::string::npos) << names.out;
    EXPECT_EQ(std::count(names.out.begin(), names.out.end(), '\n'), 2) << names.out;  // a header and one row
  }
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stop(), 0);
  const std::string log = ReadFile(b.log_path());
  ASSERT_NE(log.find("disconnect"), std::string::npos) << "no broker log at " << b.log_path();
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    EXPECT_EQ(line.rfind("membrokerd ", 0), 0u) << "a log line not written by the broker: " << line;
  EXPECT_NE(log.find("name=\"evil\\\" forged=\\\"yes \\\\\""), std::string::npos) << log;
  EXPECT_EQ(log.find(" forged=\"yes"), std::string::npos) << "a field forged into the log";
}

// --log-format json: every line a JSON object a real parser (Python's json)
// reads; client names come out as the client gave them, a quote or a brace in
// one never forges a member, and numbers stay numbers.
TEST(Cli, JsonLogLinesParseAndKeepClientNames) {
  BrokerProcess b({"--log-format", "json"}, /*log_to_file=*/true);
  const std::string evil = "evil\" forged=\"yes {\"level\":\"error\"} \\";
  const std::string cjk = "\xe6\xa8\xa1\xe5\x9e\x8b-loader";  // "模型-loader"
  for (const std::string& name : {evil, cjk}) {
    auto c = Client::Connect({b.socket(), name});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
  }
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stop(), 0);
  const std::string script =
      "import json, sys\n"
      "names, n = [], 0\n"
      "for line in open(sys.argv[1], encoding='utf-8'):\n"
      "    o = json.loads(line)\n"
      "    n += 1\n"
      "    assert o['program'] == 'membrokerd' and o['level'] in ('error','warn','info','debug'), o\n"
      "    assert o['ts'].endswith('Z') and isinstance(o['event'], str), o\n"
      "    if o['event'] == 'disconnect':\n"
      "        assert isinstance(o['client'], int) and isinstance(o['pid'], int), o\n"
      "        names.append(o['name'])\n"
      "sys.stdout.write(str(n) + '\\n' + '\\n'.join(names))\n";
  RunResult r = RunProgram({"/usr/bin/python3", "-c", script, b.log_path()});
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n" << ReadFile(b.log_path());
  EXPECT_NE(r.output.find("\n" + evil), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n" + cjk), std::string::npos) << r.output;
}

// An admin socket that closes connections at once (what a broker out of fds
// does) gives exit 1 and a one-line reason, never death by SIGPIPE (141).
TEST(Cli, AnAdminSocketThatHangsUpIsExitOneWithAReason) {
  char tmpl[] = "/tmp/membroker-hangup.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/admin.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 64), 0);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    while (!stop.load()) {
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      linger l{1, 0};  // a reset, as a refusing broker's close can be
      ::setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      ::close(c);
    }
  });
  for (int i = 0; i < 20; ++i) {
    Output o = RunCtl({"--admin-socket", path, "stats"});
    EXPECT_EQ(o.code, 1) << o.err;
    EXPECT_EQ(o.err.rfind("membrokerctl: ", 0), 0u) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
  stop = true;
  server.join();
  ::close(lfd);
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

// The admin socket without --admin-socket: --socket S means S.admin, then
// $MEMBROKER_ADMIN_SOCKET; the client socket given for the admin one is named
// as such, with the path to use.
TEST(Cli, FindsItsAdminSocketAndSaysWhichToUse) {
  BrokerProcess b;
  Output by_socket = RunCtl({"--socket", b.socket(), "stats"});
  EXPECT_EQ(by_socket.code, 0) << by_socket.err;
  EXPECT_NE(by_socket.out.find("clients_connected"), std::string::npos) << by_socket.out;
  Output by_env = RunCtl({"stats"}, {"MEMBROKER_ADMIN_SOCKET=" + b.admin_socket()});
  EXPECT_EQ(by_env.code, 0) << by_env.err;
  EXPECT_NE(by_env.out.find("clients_connected"), std::string::npos) << by_env.out;
  Output flag_wins = RunCtl({"--socket", b.socket(), "stats"}, {"MEMBROKER_ADMIN_SOCKET=/nonexistent.admin"});
  EXPECT_EQ(flag_wins.code, 0) << flag_wins.err;

  Output wrong = RunCtl({"--admin-socket", b.socket(), "stats"});
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("is a broker's client socket, not its admin socket: use " + b.socket() + ".admin"),
            std::string::npos)
      << wrong.err;
  EXPECT_EQ(std::count(wrong.err.begin(), wrong.err.end(), '\n'), 1) << wrong.err;

  struct stat st {};
  if (::stat("/run/membroker/membroker.sock.admin", &st) != 0) {  // no shipped unit runs here
    Output none = RunCtl({"stats"}, {"MEMBROKER_ADMIN_SOCKET="});
    EXPECT_EQ(none.code, 2) << none.err;
    EXPECT_NE(none.err.find("MEMBROKER_ADMIN_SOCKET"), std::string::npos) << none.err;
  }
}

// membrokerctl top as a person uses it: in a terminal (tmux), redrawn as
// clients come, with request rates, and gone when they press q.
TEST(Cli, TopRedrawsInATerminalAndQuitsOnQ) {
  struct stat st {};
  if (::stat("/usr/bin/tmux", &st) != 0) {
    ADD_FAILURE() << "tmux is missing (scripts/test installs it)";
    return;
  }
  BrokerProcess b;
  auto first = Client::Connect({b.socket(), "first-client"});
  ASSERT_TRUE(first.ok());
  const std::string server = "membroker-top-" + std::to_string(::getpid());
  struct KillServer {
    std::string name;
    ~KillServer() { (void)RunProgram({"/usr/bin/tmux", "-L", name, "kill-server"}); }
  } kill_server{server};
  auto tmux = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/tmux", "-L", server});
    return RunProgram(args);
  };
  ASSERT_EQ(tmux({"new-session", "-d", "-x", "120", "-y", "30",
                  BinaryPath("membrokerctl") + " --socket " + b.socket() + " top --interval-ms 100"})
                .exit_code,
            0);
  // The screen as the person sees it, until it shows what we wait for (bounded: 30 s).
  auto screen_with = [&](const std::regex& want) {
    std::string screen;
    for (int i = 0; i < 300; ++i) {
      screen = tmux({"capture-pane", "-p"}).output;
      if (std::regex_search(screen, want)) return screen;
      ::poll(nullptr, 0, 100);
    }
    ADD_FAILURE() << "the screen never showed what was waited for:\n" << screen;
    return screen;
  };
  std::string screen = screen_with(std::regex("clients 1 "));
  EXPECT_NE(screen.find("first-client"), std::string::npos) << screen;
  auto second = Client::Connect({b.socket(), "second-client"});
  ASSERT_TRUE(second.ok());
  auto h = second->MallocPhysical(3 << 20);
  ASSERT_TRUE(h.ok());
  screen = screen_with(std::regex("clients 2 [\\s\\S]*requests/s [0-9]+[\\s\\S]*second-client +3\\.0 MiB"));
  EXPECT_TRUE(std::regex_search(screen, std::regex("requests/s [0-9]+"))) << screen;  // a rate, once two frames exist
  // Sorted by what they hold: the second client (3 MiB) above the first.
  EXPECT_LT(screen.find("second-client"), screen.find("first-client")) << screen;
  ASSERT_EQ(tmux({"send-keys", "q"}).exit_code, 0);
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {  // the session ends when top exits (bounded: 30 s)
    gone = tmux({"has-session"}).exit_code != 0;
    if (!gone) ::poll(nullptr, 0, 100);
  }
  EXPECT_TRUE(gone) << "top did not quit on q:\n" << tmux({"capture-pane", "-p"}).output;
}

}  // namespace
}  // namespace membroker::testing

namespace membroker::testing {
namespace {

// `membrokerctl list stores` through the binary: a store's figures, and the
// client holding leases and a reservation, named until it is gone.
TEST(Cli, ListStoresShowsBlocksLeasesAndTheirHolders) {
  BrokerProcess b;
  auto list = [&](bool json) {
    std::vector<std::string> args{"--admin-socket", b.admin_socket(), "list", "stores"};
    if (json) args.insert(args.begin() + 2, "--json");
    Output o = RunCtl(args);
    EXPECT_EQ(o.code, 0) << o.err;
    return o.out;
  };
  EXPECT_EQ(list(false), "no KV stores\n");
  auto c = *Client::Connect({b.socket(), "engine"});
  auto store =
      *KvStore::Create(c, "llama/kv \"7b\"", {.block_size = 4096, .capacity = 8 * 4096, .eviction = KvEviction::kLru});
  std::vector<std::string> keys{"a", "b", "c"};
  std::vector<std::byte> bytes(100, std::byte{1});
  std::vector<std::span<const std::byte>> values(3, std::span<const std::byte>(bytes));
  ASSERT_TRUE(store.Put(keys, values).ok());
  std::vector<std::string> asked{"a", "b", "x"};
  auto got = *store.Get(asked);
  std::vector<std::string> more{"d"};
  auto put = *store.Reserve(more);
  const std::string json = list(true);
  for (const char* field :
       {"\"name\": \"llama/kv \\\"7b\\\"\"", "\"block_size\": 4096", "\"blocks\": 8", "\"eviction\": \"lru\"",
        "\"sealed\": 3", "\"writing\": 1", "\"leases\": 2", "\"hits\": 2", "\"misses\": 1", "\"bytes\": 32768"})
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  const std::string holder = "\"clients\": \"" + std::to_string(c.client_id()) + ":2/1\"";
  EXPECT_NE(json.find(holder), std::string::npos) << holder << " in " << json;
  const std::string table = list(false);
  EXPECT_NE(table.find("llama/kv"), std::string::npos) << table;
  got.Release();
  ASSERT_TRUE(store.Abort(put).ok());
  EXPECT_EQ(b.WaitForStat("kv_leases", 0), 0u);
  EXPECT_EQ(b.WaitForStat("kv_writing", 0), 0u);
  EXPECT_NE(list(true).find("\"clients\": \"-\""), std::string::npos);
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

}  // namespace
}  // namespace membroker::testing
