// The admin socket through membrokerctl, as an operator uses it, and the demo.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include <gtest/gtest.h>

#include "broker_process.h"
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
  EXPECT_NE(clients.text.find("name=model-server"), std::string::npos) << clients.text;
  EXPECT_NE(clients.text.find("pid=" + std::to_string(::getpid())), std::string::npos);
  EXPECT_NE(clients.text.find("bytes_held=3145728"), std::string::npos);

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
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.text.find("unknown command"), std::string::npos);
  Output none = Shell(BinaryPath("membrokerctl") + " --admin-socket /nonexistent/admin stats");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.text.find("cannot connect"), std::string::npos);
  Output usage = Shell(BinaryPath("membrokerctl"));
  EXPECT_EQ(usage.code, 2);
}

TEST(Admin, ClientNamesAreEscapedInJson) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "we\"ird\\name\n"});
  ASSERT_TRUE(c.ok());
  std::string j = b.Admin("list clients --json");
  EXPECT_NE(j.find(R"("name": "we\"ird\\name\u000a")"), std::string::npos) << j;
}

TEST(Demo, HandoffOutlivesTheProducer) {
  BrokerProcess b;
  Output o = Shell(BinaryPath("handoff_demo") + " --socket " + b.socket() + " --size 8388608");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("VERIFIED after the producer exited"), std::string::npos) << o.text;
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
}

}  // namespace
}  // namespace membroker::testing
