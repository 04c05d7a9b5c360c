// The broker at the edges of its resources: out of fds, connections that never
// say hello, clients that never read, peers that die mid-conversation. Each
// case against the real broker binary.
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

namespace membroker::testing {
namespace {

size_t CountLines(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

// Waits (at most timeout_ms) for the broker to close a raw connection; true
// if it did. What it sent first, if anything, goes to *first.
bool ClosedByBroker(int fd, int timeout_ms, ipc::Message* first = nullptr) {
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, timeout_ms) == 1) {
    ipc::Frame f;
    Status st = ipc::RecvFrame(fd, &f);
    if (!st.ok()) return st.code() == ErrorCode::kNotConnected;
    auto env = ipc::Decode(f.bytes);
    if (env.ok() && first != nullptr) *first = env->body;
  }
  return false;
}

ConnectOptions Opts(const BrokerProcess& b, const std::string& name) {
  ConnectOptions o{b.socket(), name};
  o.call_timeout_ms = 5000;  // an unanswered connect fails the test instead of hanging it
  return o;
}

// At its open-file limit the broker refuses new connections with a reason
// (RESOURCE_EXHAUSTED naming file descriptors), logs the refusals at most
// once a second instead of spinning on the listen backlog, and takes clients
// again as soon as fds are free.
TEST(Limits, OutOfFdsRefusesWithAReasonAndLogsLittle) {
  BrokerProcess b({}, /*log_to_file=*/true, /*fd_limit=*/48);
  std::vector<Client> clients;
  Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    auto c = Client::Connect(Opts(b, "filler"));
    if (c.ok())
      clients.push_back(std::move(*c));
    else
      refused = c.status();
  }
  ASSERT_FALSE(refused.ok()) << "48 fds held 64 clients?";
  EXPECT_EQ(refused.code(), ErrorCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("file descriptors"), std::string::npos) << refused.message();
  for (int i = 0; i < 50; ++i) {
    auto again = Client::Connect(Opts(b, "more"));
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.code(), ErrorCode::kResourceExhausted) << again.status().ToString();
  }
  // The ones connected are still served.
  EXPECT_TRUE(clients.front().Ping().ok());
  const size_t held = clients.size();
  clients.resize(held - 3);  // three disconnect: room again
  EXPECT_EQ(b.WaitForStat("clients_connected", held - 3), held - 3);
  EXPECT_TRUE(Client::Connect(Opts(b, "later")).ok());
  EXPECT_GE(b.Stat("connections_refused"), 51u);
  EXPECT_EQ(b.Stat("fd_limit"), 48u);
  clients.clear();
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stop(), 0);
  // 51 refusals within a second or two: a handful of lines, not one each.
  EXPECT_LE(CountLines(b.log_path(), " refused "), 5u);
}

// Connections that never send their hello neither lock real clients out of a
// broker at --max-clients nor stay for ever: as many may wait as
// --max-clients, the longest-waiting one makes room for a newcomer, and each
// is closed after --handshake-timeout-ms.
TEST(Limits, SilentConnectionsDoNotLockOutRealClients) {
  BrokerProcess b({"--max-clients", "8", "--handshake-timeout-ms", "300"});
  std::vector<ipc::UniqueFd> silent;
  for (int i = 0; i < 8; ++i) {
    auto s = ipc::ConnectSeqpacket(b.socket());
    ASSERT_TRUE(s.ok());
    silent.push_back(std::move(*s));
  }
  EXPECT_EQ(b.WaitForStat("clients_handshaking", 8), 8u);
  // A real client gets in: the longest-waiting silent one made room.
  auto real = Client::Connect(Opts(b, "real"));
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  EXPECT_TRUE(real->Ping().ok());
  EXPECT_TRUE(ClosedByBroker(silent.front().get(), 0)) << "the oldest silent connection is still open";
  EXPECT_EQ(b.Stat("clients_handshaking"), 7u);
  // And the others are closed by the deadline.
  for (auto& s : silent) EXPECT_TRUE(ClosedByBroker(s.get(), 10000));
  EXPECT_EQ(b.WaitForStat("clients_handshaking", 0), 0u);
  EXPECT_EQ(b.Stat("clients_connected"), 1u);
  EXPECT_TRUE(real->Ping().ok());
}

// A client SIGKILLed with replies unread in its socket makes the broker's
// next read fail with a reset, not an EOF: it is still a crash.
TEST(Limits, APeerKilledWithUnreadRepliesIsACrash) {
  BrokerProcess b;
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    auto s = ipc::ConnectSeqpacket(b.socket());
    if (!s.ok()) return 10;
    for (uint64_t rid = 1; rid <= 20; ++rid) {
      ipc::Message m = rid == 1 ? ipc::Message(ipc::HelloRequest{"unread"}) : ipc::Message(ipc::PingRequest{});
      auto bytes = ipc::Encode({ipc::kProtocolVersion, rid, 0, m});
      if (!ipc::SendFrame(s->get(), bytes, {}).ok()) return 11;
    }
    ch.Send("sent");
    ch.Receive();  // killed here, its 20 replies unread
    return 0;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "sent");
  EXPECT_EQ(b.WaitForStat("requests", 20), 20u);  // all answered, none read
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitChild(child), 128 + SIGKILL);
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("clients_crashed"), 1u);
}

// A client that asks and never reads is dropped once its unread replies pass
// --max-outbound-bytes, long before the frame cap: the broker's memory stays
// bounded, and what was queued is counted in stats.bytes_queued meanwhile.
TEST(Limits, ASlowReaderIsCappedInBytes) {
  BrokerProcess b({"--max-outbound-bytes", "256K"});
  auto owner = Client::Connect(Opts(b, "publisher"));
  ASSERT_TRUE(owner.ok());
  auto h = owner->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  const std::string pad(200, 'n');
  for (int i = 0; i < 128; ++i) ASSERT_TRUE(owner->Publish("big/" + std::to_string(i) + pad, *h).ok());
  auto raw = ipc::ConnectSeqpacket(b.socket());
  ASSERT_TRUE(raw.ok());
  uint64_t rid = 1;
  auto send = [&](ipc::Message m) {
    return ipc::SendFrame(raw->get(), ipc::Encode({ipc::kProtocolVersion, rid++, 0, std::move(m)}), {});
  };
  ASSERT_TRUE(send(ipc::HelloRequest{"never-reads"}).ok());
  // Each answer lists 128 names (~30 KiB): 100 of them are far past 256 KiB
  // plus what the socket buffers, and far below the 1024-frame cap.
  int sent = 0;
  for (; sent < 100; ++sent)
    if (!send(ipc::ListNamesRequest{"big/", ""}).ok()) break;  // the broker dropped it already
  EXPECT_EQ(b.WaitForStat("clients_kicked", 1), 1u);
  EXPECT_EQ(b.Stat("bytes_queued"), 0u);
  EXPECT_EQ(b.Stat("clients_connected"), 1u);
  EXPECT_TRUE(owner->Ping().ok());
}

// Misuse is answered, never punished: a bad argument is an error reply and the
// client keeps its connection and everything it holds (docs/API.md). Only
// frames that are not the protocol end a connection.
TEST(Limits, MisuseNeverCostsTheConnection) {
  BrokerProcess b;
  auto c = Client::Connect(Opts(b, "clumsy"));
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(1 << 16);
  ASSERT_TRUE(h.ok());
  auto range = c->ReserveMemAddress(1 << 16);
  ASSERT_TRUE(range.ok());
  auto map = c->MapMem(range->base(), 1 << 16, 0, *h);
  ASSERT_TRUE(map.ok());

  AllocationProp bad_policy;
  bad_policy.page_policy = static_cast<PagePolicy>(9);
  EXPECT_EQ(c->MallocPhysical(4096, bad_policy).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c->SetPidToShareableHandle(std::string(200, 't'), {}).code(), ErrorCode::kNotFound);
  EXPECT_EQ(c->ImportFromShareableHandle("").code(), ErrorCode::kNotFound);
  EXPECT_EQ(c->MemSetAccess(map->data(), 1 << 16, static_cast<Access>(7)).code(), ErrorCode::kParamInvalid);
  // Above the per-allocation limit (1 TiB): PARAM_INVALID; within it but past
  // the budget: RESOURCE_EXHAUSTED.
  EXPECT_EQ(c->MallocPhysical(size_t{1} << 63).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c->MallocPhysical(size_t{1} << 39).code(), ErrorCode::kResourceExhausted);
  // Waits in the broker are capped at 10 minutes.
  EXPECT_EQ(c->Lookup("nothing/here", 10 * 60 * 1000 + 1).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c->Publish("bad\x01name", *h).code(), ErrorCode::kParamInvalid);

  // All of it left the client as it was.
  EXPECT_TRUE(c->Ping().ok());
  EXPECT_TRUE(c->ExportToShareableHandle(*h, kExportNoPidCheck).ok());
  EXPECT_TRUE(c->MemSetAccess(map->data(), 1 << 16, Access::kRead).ok());
  EXPECT_EQ(c->async_errors(), 0u);

  // The broker itself answers what a raw client sends wrong, and keeps it.
  auto raw = ipc::ConnectSeqpacket(b.socket());
  ASSERT_TRUE(raw.ok());
  uint64_t rid = 1;
  auto call = [&](ipc::Message m) -> Result<ipc::Envelope> {
    MB_RETURN_IF_ERROR(ipc::SendFrame(raw->get(), ipc::Encode({ipc::kProtocolVersion, rid++, 0, std::move(m)}), {}));
    ipc::Frame f;
    MB_RETURN_IF_ERROR(ipc::RecvFrame(raw->get(), &f));
    return ipc::Decode(f.bytes);
  };
  ASSERT_TRUE(call(ipc::HelloRequest{"raw"}).ok());
  auto r = call(ipc::MallocRequest{4096, static_cast<ipc::PagePolicy>(9), 0});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(std::holds_alternative<ipc::ErrorReply>(r->body));
  EXPECT_EQ(std::get<ipc::ErrorReply>(r->body).code, ErrorCode::kParamInvalid);
  auto ping = call(ipc::PingRequest{});
  ASSERT_TRUE(ping.ok()) << ping.status().ToString();
  EXPECT_TRUE(std::holds_alternative<ipc::OkReply>(ping->body));
  EXPECT_EQ(b.Stat("clients_kicked"), 0u);
}

// An allow-list costs the broker no fds (pids are tied to their process by
// its start time), duplicates collapse, one allocation has at most 64
// exports, and running out of fds is said as such, never as "no such pid".
TEST(Limits, AllowListsCannotExhaustTheBrokersFds) {
  BrokerProcess b({}, false, /*fd_limit=*/64);
  auto c = Client::Connect(Opts(b, "exporter"));
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  auto token = c->ExportToShareableHandle(*h);
  ASSERT_TRUE(token.ok());
  const uint64_t fds_before = b.Stat("open_fds");
  std::vector<pid_t> mine(1024, ::getpid());
  ASSERT_TRUE(c->SetPidToShareableHandle(*token, mine).ok());
  EXPECT_EQ(b.Stat("open_fds"), fds_before);
  // The allow-list still admits exactly that process.
  auto again = Client::Connect(Opts(b, "importer"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->ImportFromShareableHandle(*token).ok());
  pid_t other = ForkChild([&] {
    auto o = Client::Connect(Opts(b, "stranger"));
    return o.ok() && o->ImportFromShareableHandle(*token).code() == ErrorCode::kNotFound ? 0 : 1;
  });
  EXPECT_EQ(WaitChild(other), 0);
  // Exports of one allocation are bounded.
  int made = 1;
  Status st;
  for (; made < 100; ++made) {
    auto t = c->ExportToShareableHandle(*h);
    if (!t.ok()) {
      st = t.status();
      break;
    }
  }
  EXPECT_EQ(made, 64);
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted) << st.ToString();
  // Out of fds (allocations take them all), a pid check says what ran out.
  std::vector<PhysicalHandle> fill;
  for (int i = 0; i < 100; ++i) {
    auto f = c->MallocPhysical(4096);
    if (!f.ok()) {
      EXPECT_EQ(f.code(), ErrorCode::kResourceExhausted) << f.status().ToString();
      break;
    }
    fill.push_back(std::move(*f));
  }
  Status out = c->SetPidToShareableHandle(*token, mine);
  EXPECT_EQ(out.code(), ErrorCode::kResourceExhausted) << out.ToString();
  EXPECT_NE(out.message().find("file descriptors"), std::string::npos) << out.message();
  fill.clear();
  EXPECT_TRUE(c->Ping().ok());
}

// A memory cgroup this test makes, removed again whatever happens.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(uint64_t limit) {
    const std::string name = "membroker-test-" + std::to_string(::getpid());
    // v2 where the unified hierarchy has the memory controller, else v1.
    for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/memory"}) {
      const bool v2 = std::string(root) == "/sys/fs/cgroup";
      if (v2 && ::access("/sys/fs/cgroup/cgroup.controllers", F_OK) != 0) continue;
      const std::string dir = std::string(root) + "/" + name;
      if (::mkdir(dir.c_str(), 0755) != 0) continue;
      std::ofstream f(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
      f << limit;
      f.close();
      if (!f) {
        ::rmdir(dir.c_str());
        continue;
      }
      dir_ = dir;
      return;
    }
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());  // empty once its broker has exited
  }
  bool ok() const { return !dir_.empty(); }
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// In a 1 GiB memory cgroup the broker's default budget comes from the
// cgroup, not the host's RAM, and says so; a 2 GiB request is an error reply,
// not the OOM killer ending the broker.
TEST(Limits, TheDefaultBudgetComesFromTheMemoryCgroup) {
  MemoryCgroup cg(1ull << 30);
  if (!cg.ok()) GTEST_SKIP() << "cannot make a memory cgroup here (needs root and a writable cgroupfs)";
  {
    BrokerProcess b({}, false, 0, cg.procs());
    EXPECT_EQ(b.Stat("bytes_budget"), 512ull << 20);
    std::string stats = b.Admin("stats");
    EXPECT_NE(stats.find("bytes_budget_source: half of cgroup memory."), std::string::npos) << stats;
    EXPECT_NE(stats.find(cg.dir()), std::string::npos) << stats;
    auto c = Client::Connect(Opts(b, "greedy"));
    ASSERT_TRUE(c.ok());
    auto big = c->MallocPhysical(size_t{2} << 30);
    EXPECT_EQ(big.code(), ErrorCode::kResourceExhausted) << big.status().ToString();
    auto fits = c->MallocPhysical(size_t{256} << 20);
    EXPECT_TRUE(fits.ok()) << fits.status().ToString();
    EXPECT_TRUE(c->Ping().ok());  // the broker is alive and serving
  }
}

// An operator's --max-bytes above the broker's memory cgroup (a common
// mistake): the broker warns at start, and a request the cgroup cannot give is
// an error reply naming the cgroup, never the OOM killer ending the broker
// (with the cgroup's OOM killer on, a 2 GiB request used to end it).
TEST(Limits, AnExplicitBudgetAboveTheMemoryCgroupIsWarnedOfAndNeverReachesTheOomKiller) {
  MemoryCgroup cg(512ull << 20);
  if (!cg.ok()) GTEST_SKIP() << "cannot make a memory cgroup here (needs root and a writable cgroupfs)";
  {
    BrokerProcess b({"--max-bytes", std::to_string(8ull << 30)}, /*log_to_file=*/true, 0, cg.procs());
    EXPECT_EQ(b.Stat("bytes_budget"), 8ull << 30);
    auto c = Client::Connect(Opts(b, "greedy"));
    ASSERT_TRUE(c.ok());
    auto big = c->MallocPhysical(size_t{2} << 30);
    EXPECT_EQ(big.code(), ErrorCode::kResourceExhausted) << big.status().ToString();
    EXPECT_NE(big.status().message().find("memory cgroup has"), std::string::npos) << big.status().ToString();
    EXPECT_NE(big.status().message().find(cg.dir()), std::string::npos) << big.status().ToString();
    auto fits = c->MallocPhysical(size_t{64} << 20);
    EXPECT_TRUE(fits.ok()) << fits.status().ToString();
    EXPECT_TRUE(c->Ping().ok());  // the broker is alive and serving
    std::ifstream log(b.log_path());
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("budget_over_cgroup"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace membroker::testing
