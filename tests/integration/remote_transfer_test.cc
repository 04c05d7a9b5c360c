// The transfer engine's UCX path between two brokers on this host (loopback):
// an engine that listens on 127.0.0.1 and one that connects to it by ip:port.
// The two-host tests (tests/net/two_hosts.py) run the same path between
// namespaces over a veth; these run everywhere, also under ASan and TSan, and
// check the API's answers and the threads (callers against the progress thread).
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "net_engines.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"

namespace membroker::testing {
namespace {

constexpr size_t kSize = 4 << 20;

class RemoteTransfer : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<BrokerProcess>();
    b_ = std::make_unique<BrokerProcess>();
    ca_ = *Client::Connect({a_->socket(), "listener"});
    cb_ = *Client::Connect({b_->socket(), "connector"});
    secret_ = SecretFile(a_->dir(), "loopback-secret");
  }
  // decode listens at broker a; returns its address.
  std::string Listen(TransferEngine& e) { return ListenOnLoopback(e, "decode", secret_); }
  std::unique_ptr<BrokerProcess> a_, b_;
  Client ca_, cb_;
  std::string secret_;
};

TEST_F(RemoteTransfer, ReadWriteAndNotifyBetweenTwoBrokers) {
  TransferEngine decode(ca_), prefill(cb_);
  Status init = decode.Initialize("decode", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret_}});
  MB_UCX_OR_SKIP(init);
  ASSERT_TRUE(init.ok()) << init.ToString();
  NetworkStats ns;
  ASSERT_TRUE(decode.GetNetworkStats(ns).ok());
  ASSERT_EQ(ns.listen_address.rfind("127.0.0.1:", 0), 0u) << ns.listen_address;
  const std::string addr = ns.listen_address;
  Memory remote = Register(ca_, decode, kSize);
  ASSERT_TRUE(prefill.Initialize("prefill", {{"secret_file", secret_}}).ok());
  Memory local = Register(cb_, prefill, kSize);
  Status st = prefill.Connect(addr, 5000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ConnectionInfo info;
  ASSERT_TRUE(prefill.GetConnectionInfo(addr, info).ok());
  EXPECT_EQ(info.path, "ucx");  // another broker: not this host's engine, whatever UCX chose beneath
  EXPECT_EQ(info.engine, "decode");
  EXPECT_FALSE(info.transports.empty());
  EXPECT_EQ(prefill.Connect(addr, 5000).code(), ErrorCode::kAlreadyConnected);

  for (size_t i = 0; i < kSize; ++i) local.data()[i] = static_cast<char>(i * 7 + 1);
  std::vector<TransferOpDesc> scattered;
  for (size_t i = 0; i < 256; ++i) scattered.push_back({local.addr() + i * 8192, remote.addr() + i * 8192, 4096});
  ASSERT_TRUE(prefill.TransferSync(addr, WRITE, scattered, 10000).ok());
  for (size_t i = 0; i < 256; ++i) {
    ASSERT_EQ(std::memcmp(remote.data() + i * 8192, local.data() + i * 8192, 4096), 0) << i;
    ASSERT_EQ(remote.data()[i * 8192 + 4096], 0) << "the gap after descriptor " << i << " was written";
  }
  for (size_t i = 0; i < kSize; ++i) remote.data()[i] = static_cast<char>(i * 13 + 5);
  ASSERT_TRUE(prefill.TransferSync(addr, READ, {{local.addr(), remote.addr(), kSize}}, 10000).ok());
  ASSERT_EQ(std::memcmp(local.data(), remote.data(), kSize), 0);

  TransferReq req = 0;
  ASSERT_TRUE(prefill.TransferAsync(addr, READ, {{local.addr(), remote.addr(), kSize}}, req, 10000).ok());
  // The request's own 10 s timeout ends the wait; the outer bound only keeps a broken engine from
  // hanging the test. No count of polls: a loaded machine may need many (CI failed on 100,000).
  TransferStatus ts = TransferStatus::WAITING;
  const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ts == TransferStatus::WAITING && std::chrono::steady_clock::now() < bound) {
    ASSERT_TRUE(prefill.GetTransferStatus(req, ts).ok());
    if (ts == TransferStatus::WAITING) std::this_thread::yield();
  }
  EXPECT_EQ(ts, TransferStatus::COMPLETED);

  ASSERT_TRUE(prefill.SendNotify(addr, {"kv_ready", "request 17"}, 5000).ok());
  std::vector<Notify> got;
  ASSERT_TRUE(decode.GetNotifies(got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].remote_engine, "prefill");
  EXPECT_EQ(got[0].name, "kv_ready");
  EXPECT_EQ(got[0].notify_msg, "request 17");

  // Descriptor 1 outside decode's memory: PARAM_INVALID naming it, nothing written.
  std::memset(remote.data(), 0, 4096);
  st = prefill.TransferSync(addr, WRITE, {{local.addr(), remote.addr(), 4096}, {local.addr(), remote.addr() + kSize, 4096}});
  EXPECT_EQ(st.code(), ErrorCode::kParamInvalid);
  EXPECT_NE(st.message().find("descriptor 1"), std::string::npos) << st.ToString();
  EXPECT_EQ(remote.data()[0], 0);
  // The broker's view: the connection and its path.
  EXPECT_NE(b_->Admin("list engines").find(addr + "=ucx("), std::string::npos) << b_->Admin("list engines");
  EXPECT_EQ(b_->Stat("engine_connections_ucx"), 1u);

  ASSERT_TRUE(prefill.Disconnect(addr, 5000).ok());
  EXPECT_EQ(prefill.TransferSync(addr, READ, {{local.addr(), remote.addr(), 4096}}).code(), ErrorCode::kNotConnected);
  ASSERT_TRUE(prefill.Connect(addr, 5000).ok());
  EXPECT_TRUE(prefill.TransferSync(addr, READ, {{local.addr(), remote.addr(), 4096}}).ok());
}

TEST_F(RemoteTransfer, RefusedWithoutTheSecretAndCounted) {
  TransferEngine decode(ca_), intruder(cb_);
  const std::string addr = Listen(decode);
  if (addr.empty()) GTEST_SKIP() << "built without UCX";
  ASSERT_TRUE(intruder.Initialize("intruder", {{"secret_file", SecretFile(b_->dir(), "wrong")}}).ok());
  Status st = intruder.Connect(addr, 5000);
  EXPECT_EQ(st.code(), ErrorCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("wrong secret"), std::string::npos) << st.ToString();
  NetworkStats ns;
  ASSERT_TRUE(decode.GetNetworkStats(ns).ok());
  EXPECT_EQ(ns.refused, 1u);
  EXPECT_EQ(ns.accepted, 0u);
  EXPECT_NE(ns.last_refusal.find("intruder"), std::string::npos) << ns.last_refusal;
  EXPECT_EQ(a_->Stat("engine_network_refused"), 1u);
}

TEST_F(RemoteTransfer, InitializeRefusesUnsafeOrWrongOptions) {
  TransferEngine e(ca_);
  Status st = e.Initialize("decode", {{"listen_address", "127.0.0.1:0"}});
  MB_UCX_OR_SKIP(st);
  EXPECT_EQ(st.code(), ErrorCode::kParamInvalid) << st.ToString();  // admits nobody
  EXPECT_EQ(e.Initialize("decode", {{"listen_address", "localhost:5000"}, {"secret_file", secret_}}).code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(e.Initialize("decode", {{"listen_address", "127.0.0.1:0"}, {"secret_file", SecretFile(a_->dir(), "x", 0644)}}).code(),
            ErrorCode::kPermissionDenied);
  EXPECT_EQ(e.Initialize("decode", {{"secret_file", a_->dir() + "/missing"}}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(e.Initialize("decode", {{"allow_from", "10.0.0.0/40"}}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(e.Initialize("10.0.0.1:5000").code(), ErrorCode::kParamInvalid);  // names cannot look like addresses
  // A port taken by another listener.
  TransferEngine first(ca_);
  const std::string addr = Listen(first);
  ASSERT_FALSE(addr.empty());
  Client other = *Client::Connect({a_->socket(), "second"});
  TransferEngine second(other);
  EXPECT_EQ(second.Initialize("decode2", {{"listen_address", addr}, {"secret_file", secret_}}).code(),
            ErrorCode::kAddressInUse);
  // Nothing listens there: NOT_CONNECTED, not a hang.
  TransferEngine lone(cb_);
  ASSERT_TRUE(lone.Initialize("lone").ok());
  first.Finalize();
  st = lone.Connect(addr, 3000);
  EXPECT_TRUE(st.code() == ErrorCode::kNotConnected || st.code() == ErrorCode::kTimeout) << st.ToString();
}

TEST_F(RemoteTransfer, AnAddressOfThisBrokersEngineTakesTheSameHostPath) {
  TransferEngine decode(ca_);
  const std::string addr = Listen(decode);
  if (addr.empty()) GTEST_SKIP() << "built without UCX";
  Memory remote = Register(ca_, decode, kSize);
  std::memset(remote.data(), 0x5a, kSize);
  Client neighbour_client = *Client::Connect({a_->socket(), "neighbour"});
  TransferEngine neighbour(neighbour_client);
  ASSERT_TRUE(neighbour.Initialize("neighbour", {{"secret_file", secret_}}).ok());
  Memory local = Register(neighbour_client, neighbour, kSize);
  ASSERT_TRUE(neighbour.Connect(addr, 5000).ok());
  ConnectionInfo info;
  ASSERT_TRUE(neighbour.GetConnectionInfo(addr, info).ok());
  EXPECT_EQ(info.path, "same-host");
  ASSERT_TRUE(neighbour.TransferSync(addr, READ, {{local.addr(), remote.addr(), kSize}}).ok());
  EXPECT_EQ(local.data()[kSize - 1], 0x5a);
}

// Connector threads transfer while the listener deregisters and registers
// ranges: every transfer either moves its bytes or is refused cleanly, and a
// deregistered range is never written afterwards.
TEST_F(RemoteTransfer, DeregistrationWhileConnectorThreadsTransfer) {
  TransferEngine decode(ca_), prefill(cb_);
  const std::string addr = Listen(decode);
  if (addr.empty()) GTEST_SKIP() << "built without UCX";
  std::vector<Memory> ranges;
  for (int i = 0; i < 4; ++i) ranges.push_back(Register(ca_, decode, 1 << 20));
  ASSERT_TRUE(prefill.Initialize("prefill", {{"secret_file", secret_}}).ok());
  Memory local = Register(cb_, prefill, 1 << 20);
  ASSERT_TRUE(prefill.Connect(addr, 5000).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> moved{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        const Memory& r = ranges[(n + t) % ranges.size()];
        Status st = prefill.TransferSync(addr, n % 2 ? WRITE : READ, {{local.addr(), r.addr(), 1 << 20}}, 10000);
        (st.ok() ? moved : st.code() == ErrorCode::kParamInvalid ? refused : other).fetch_add(1);
      }
    });
  // Deregister ranges 0 and 1 while the threads run; after each returns, its
  // memory is zeroed here and must stay zero.
  for (int i = 0; i < 2; ++i) {
    while (moved.load() < 10 * (i + 1)) std::this_thread::yield();
    ASSERT_TRUE(decode.DeregisterMem(ranges[i].registered).ok());
    std::memset(ranges[i].data(), 0, 1 << 20);
  }
  const int refused_before = refused.load();
  while (refused.load() < refused_before + 10) std::this_thread::yield();
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(other.load(), 0);
  for (int i = 0; i < 2; ++i)
    for (size_t j = 0; j < (1 << 20); j += 4096) ASSERT_EQ(ranges[i].data()[j], 0) << "range " << i << " written after DeregisterMem";
}

// UCX is loaded only when an engine asks for the network (a listen address or
// Connect("ip:port")): a process that moves bytes on its host only never maps
// libucs, whose signal handlers would replace the program's own. Checked in a
// process of its own (net_module_probe), since this one may have listened in
// another test.
TEST(NetModule, LoadedOnlyWhenAnEngineAsksForTheNetwork) {
  BrokerProcess broker;
  const std::string secret = SecretFile(broker.dir(), "probe-secret");
  RunResult r = RunProgram({BinaryPath("net_module_probe"), broker.socket(), secret});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("start libucs=0 module=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("same_host libucs=0 module=0"), std::string::npos) << r.output;
#ifdef MEMBROKER_TEST_HAVE_NET_MODULE
  EXPECT_NE(r.output.find("network ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("network libucs=1 module=1"), std::string::npos) << r.output;
#else
  EXPECT_NE(r.output.find("network UNSUPPORTED"), std::string::npos) << r.output;
#endif
}

}  // namespace
}  // namespace membroker::testing
