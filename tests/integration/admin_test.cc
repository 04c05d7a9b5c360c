// The admin socket through membrokerctl, as an operator uses it, and the demo.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <regex>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

struct Output {
  int code;
  std::string text;
};

Output Shell(const std::string& cmd) {
  Output o{-1, ""};
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) o.text.append(buf, n);
  int status = ::pclose(p);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

std::string Ctl(const BrokerProcess& b, const std::string& args) {
  return BinaryPath("membrokerctl") + " --admin-socket " + b.admin_socket() + " " + args;
}

TEST(Admin, StatsListClientsListAllocations) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "model-server"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(3 << 20);
  ASSERT_TRUE(h.ok());
  auto tok = c->ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(tok.ok());

  Output stats = Shell(Ctl(b, "stats"));
  EXPECT_EQ(stats.code, 0);
  EXPECT_NE(stats.text.find("clients_connected: 1"), std::string::npos) << stats.text;
  EXPECT_NE(stats.text.find("allocations_live: 1"), std::string::npos);
  EXPECT_NE(stats.text.find("bytes_allocated: 3145728"), std::string::npos);

  Output clients = Shell(Ctl(b, "list clients"));
  EXPECT_EQ(clients.code, 0);
  EXPECT_EQ(clients.text.rfind("ID  PID", 0), 0u) << clients.text;  // a table with a header
  EXPECT_NE(clients.text.find("model-server"), std::string::npos) << clients.text;
  // Times as ISO 8601 UTC in text, seconds since the epoch in JSON.
  EXPECT_TRUE(std::regex_search(clients.text,
                                std::regex(" 20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]Z ")))
      << clients.text;
  Output cj = Shell(Ctl(b, "--json list clients"));
  EXPECT_NE(cj.text.find("\"pid\": " + std::to_string(::getpid())), std::string::npos) << cj.text;
  EXPECT_NE(cj.text.find("\"bytes_held\": 3145728"), std::string::npos);
  EXPECT_NE(cj.text.find("\"allocations\": 1"), std::string::npos);
  EXPECT_TRUE(std::regex_search(cj.text, std::regex("\"connected_since\": [0-9]{10}"))) << cj.text;

  Output allocs = Shell(Ctl(b, "--json list allocations"));
  EXPECT_EQ(allocs.code, 0);
  EXPECT_EQ(allocs.text.front(), '[');
  EXPECT_NE(allocs.text.find("\"size\": 3145728"), std::string::npos) << allocs.text;
  EXPECT_NE(allocs.text.find("\"exported\": true"), std::string::npos);
  EXPECT_NE(allocs.text.find("\"holders\": 1"), std::string::npos);

  Output json = Shell(Ctl(b, "stats --json"));
  EXPECT_EQ(json.text.front(), '{');
  EXPECT_NE(json.text.find("\"exports_live\": 1"), std::string::npos);
}

TEST(Admin, UnknownCommandAndMissingSocketFail) {
  BrokerProcess b;
  Output bad = Shell(Ctl(b, "launch missiles"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.text.find("unknown command"), std::string::npos);
  // The broker's own answer to an unknown command, past the CLI.
  EXPECT_EQ(b.Admin("launch missiles").rfind("error: unknown command", 0), 0u);
  Output none = Shell(BinaryPath("membrokerctl") + " --admin-socket /nonexistent/admin stats");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.text.find("cannot connect"), std::string::npos);
  Output usage = Shell(BinaryPath("membrokerctl"));
  EXPECT_EQ(usage.code, 2);
}

TEST(Admin, ShowKickAndFree) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "victim"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(1 << 20);
  ASSERT_TRUE(h.ok());
  auto tok = c->ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(tok.ok());
  auto other = Client::Connect({b.socket(), "reader"});
  auto imported = other->ImportFromShareableHandle(*tok);
  ASSERT_TRUE(imported.ok());
  auto m = MapWhole(*other, *imported);
  ASSERT_TRUE(m.ok());
  std::memset(m->data(), 7, 1 << 20);

  std::string id = std::to_string(c->client_id()), aid = std::to_string(h->id());
  Output show = Shell(Ctl(b, "show client " + id));
  EXPECT_EQ(show.code, 0);
  EXPECT_NE(show.text.find("name: victim"), std::string::npos) << show.text;
  EXPECT_NE(show.text.find("holds: " + aid), std::string::npos) << show.text;
  Output alloc = Shell(Ctl(b, "--json show allocation " + aid));
  EXPECT_NE(alloc.text.find("\"holders\": 2"), std::string::npos) << alloc.text;
  EXPECT_EQ(alloc.text.find(*tok), std::string::npos) << "tokens must never be shown";
  EXPECT_EQ(Shell(Ctl(b, "show client 999")).code, 1);

  // Kick: the client is gone exactly as if it had crashed; the importer keeps the memory.
  Output kick = Shell(Ctl(b, "kick client " + id));
  EXPECT_EQ(kick.code, 0) << kick.text;
  // It is told why, and does not reattach by itself.
  Status kicked = c->Ping();
  EXPECT_EQ(kicked.code(), ErrorCode::kPermissionDenied) << kicked.ToString();
  EXPECT_NE(kicked.message().find("membrokerctl kick"), std::string::npos) << kicked.ToString();
  EXPECT_EQ(c->reattaches(), 0u);
  EXPECT_EQ(b.Stat("clients_connected"), 1u);
  EXPECT_EQ(b.Stat("allocations_live"), 1u);
  EXPECT_EQ(b.Stat("clients_kicked"), 1u);

  // Free: no holder keeps a reference; the mapping stays valid in its process.
  Output freed = Shell(Ctl(b, "free allocation " + aid));
  EXPECT_EQ(freed.code, 0) << freed.text;
  EXPECT_NE(freed.text.find("keep their pages"), std::string::npos);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("exports_live"), 0u);
  EXPECT_EQ(m->as<char>()[12345], 7);
  EXPECT_EQ(other->ExportToShareableHandle(*imported).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(Shell(Ctl(b, "free allocation " + aid)).code, 1);
}

TEST(Admin, MetricsConfigAndHelp) {
  BrokerProcess b({"--pool", "64K:normal:1", "--quota-client", "allocations=9"});
  Output metrics = Shell(Ctl(b, "metrics"));
  EXPECT_EQ(metrics.code, 0);
  EXPECT_NE(metrics.text.find("# TYPE membroker_clients_connected gauge\nmembroker_clients_connected 0\n"),
            std::string::npos)
      << metrics.text;
  EXPECT_NE(metrics.text.find("# TYPE membroker_allocations_created_total counter"), std::string::npos);
  Output config = Shell(Ctl(b, "config"));
  EXPECT_NE(config.text.find("pool: 65536:normal:1"), std::string::npos) << config.text;
  EXPECT_NE(config.text.find("allocations=9"), std::string::npos);
  EXPECT_NE(config.text.find("log-level: info\n"), std::string::npos) << config.text;  // names, not numbers
  EXPECT_NE(config.text.find("log-format: text\n"), std::string::npos) << config.text;
  Output help = Shell(BinaryPath("membrokerctl") + " kick client --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.text.find("exactly as if it had crashed"), std::string::npos);
  EXPECT_EQ(Shell(BinaryPath("membrokerctl") + " --help").code, 0);
  EXPECT_EQ(Shell(Ctl(b, "show client")).code, 2);  // missing ID
}

TEST(Admin, ClientNamesAreEscapedInJson) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "we\"ird\\näme"});
  ASSERT_TRUE(c.ok());
  std::string j = b.Admin("list clients --json");
  EXPECT_NE(j.find(R"("name": "we\"ird\\näme")"), std::string::npos) << j;
  // Names are UTF-8 without control characters: the library refuses others.
  EXPECT_EQ(Client::Connect({b.socket(), "new\nline"}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(Client::Connect({b.socket(), "bad\xff"}).code(), ErrorCode::kParamInvalid);
}

TEST(Demo, HandoffOutlivesTheProducer) {
  BrokerProcess b;
  Output o = Shell(BinaryPath("handoff_demo") + " --socket " + b.socket() + " --size 8388608");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("VERIFIED after the producer exited"), std::string::npos) << o.text;
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
}

TEST(Demo, KvTransferDecodeChecksEveryBlock) {
  BrokerProcess b;
  Output o = Shell(BinaryPath("kv_transfer") + " --socket " + b.socket() + " --blocks 64");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("checked 64 blocks of 65536 bytes: all correct"), std::string::npos) << o.text;
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("engines"), 0u);
}

// The channels demo: every worker gets every step (a replacement, every step
// from the one it joined at), every job is done once, the broker ends empty.
TEST(Demo, FanOutThroughChannelsWithAndWithoutAKilledWorker) {
  BrokerProcess b;
  for (const char* extra : {"", " --kill-worker"}) {
    Output o = Shell(BinaryPath("fanout") + " --socket " + b.socket() + extra);
    EXPECT_EQ(o.code, 0) << o.text;
    EXPECT_NE(o.text.find("broadcast 60 steps of 256 KiB to 3 workers"), std::string::npos) << o.text;
    EXPECT_NE(o.text.find("work sharing: 300 of 300 jobs done"), std::string::npos) << o.text;
    if (*extra) {
      EXPECT_NE(o.text.find("worker 0 SIGKILLed holding a chunk: reaped 1 subscriber"), std::string::npos) << o.text;
    }
    EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
    EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
    EXPECT_EQ(b.Stat("named_objects"), 0u);
  }
}

// The pipeline demo, plain and with each stage killed and restarted: every
// frame is checked exactly once, none is lost, the monitor on the model's
// results channel finds nothing wrong (and rejoins the restarted model's
// channel), the broker ends empty.
class PipelineDemo : public ::testing::TestWithParam<int> {};

TEST_P(PipelineDemo, EveryFrameIsAccountedFor) {
  BrokerProcess b;
  std::string cmd = BinaryPath("pipeline") + " --socket " + b.socket() + " --frames 60";
  if (GetParam() >= 0) cmd += " --kill-stage " + std::to_string(GetParam());
  Output o = Shell(cmd);
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("sink: 60 checked once, 0 mismatched, 0 lost"), std::string::npos) << o.text;
  // The monitor took results off the model's channel and found none wrong.
  EXPECT_NE(o.text.find("every byte checked: 0 mismatched"), std::string::npos) << o.text;
  if (GetParam() == 2) {
    EXPECT_NE(o.text.find("joined 2 time(s)"), std::string::npos) << o.text;
  }
  if (GetParam() >= 0) {
    EXPECT_NE(o.text.find("died (pid"), std::string::npos) << o.text;
  }
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("named_objects"), 0u);
}

INSTANTIATE_TEST_SUITE_P(KillStage, PipelineDemo, ::testing::Values(-1, 0, 1, 2, 3), [](const auto& info) {
  return info.param < 0 ? std::string("NoKill") : "Stage" + std::to_string(info.param);
});

}  // namespace
}  // namespace membroker::testing
