// One conformance suite for the transfer engine's two transports
// (libclient/transfer/transport.h): the same-host path (the peer's memory
// mapped here, or reached by cross-memory attach) and the UCX path (an engine
// of another broker, by ip:port over loopback). Every case runs against both,
// through the public API, with the peer engine in a process of its own
// (engine_agent) so that it can be SIGKILLed. The answers must be the same:
// a caller never has to know which path a connection took.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "engine_agent_process.h"
#include "net_engines.h"
#include "readable.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"

namespace membroker::testing {
namespace {

enum class Path { kSameHost, kUcx };
void PrintTo(Path p, std::ostream* os) { *os << (p == Path::kUcx ? "ucx" : "same-host"); }
constexpr size_t kSize = 4 << 20;
using Clock = std::chrono::steady_clock;

// A buffer the agent allocated and registered: its index there and its address in the agent.
struct RemoteBuffer {
  size_t index = 0;
  uintptr_t addr = 0;
};

class TransportConformance : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    peer_broker_ = std::make_unique<BrokerProcess>();
    // The UCX path: our engine on a broker of its own, so the peer is not this "host's".
    if (GetParam() == Path::kUcx) own_broker_ = std::make_unique<BrokerProcess>();
    client_ = *Client::Connect({(own_broker_ ? *own_broker_ : *peer_broker_).socket(), "conformance"});
    secret_ = SecretFile(peer_broker_->dir(), "conformance-secret");
    StartPeer();
    if (IsSkipped() || HasFatalFailure()) return;
    engine_ = std::make_unique<TransferEngine>(client_);
    std::map<std::string, std::string> options;
    if (GetParam() == Path::kUcx) options["secret_file"] = secret_;
    ASSERT_TRUE(engine_->Initialize("prefill", options).ok());
    local_ = Register(client_, *engine_, kSize);
    Status st = engine_->Connect(remote_, 10'000);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ConnectionInfo info;
    ASSERT_TRUE(engine_->GetConnectionInfo(remote_, info).ok());
    ASSERT_EQ(info.path, GetParam() == Path::kUcx ? "ucx" : "same-host");
    EXPECT_EQ(info.engine, "decode");
  }
  void TearDown() override {
    engine_.reset();
    agent_.reset();
  }

  // Starts the peer engine "decode" in its own process; remote_ is how we name it.
  void StartPeer() {
    agent_ = std::make_unique<EngineAgent>(peer_broker_->socket());
    // 45 s for our transfers to end before its DeregisterMem gives up
    // (10 s by default; the agent answers within 60): a verdict on the protocol,
    // not on a loaded machine's speed.
    const std::string drain = " drain_timeout_ms=45000";
    if (GetParam() == Path::kSameHost) {
      agent_->Ok("init decode" + drain);
      remote_ = "decode";
      return;
    }
    const std::string answer = agent_->Command("init decode listen_address=127.0.0.1:0 secret_file=" + secret_ + drain);
#ifndef MEMBROKER_TEST_HAVE_NET_MODULE
    if (answer.rfind("err UNSUPPORTED", 0) == 0) GTEST_SKIP() << "built without UCX: " << answer;
#endif
    ASSERT_EQ(answer.rfind("ok 127.0.0.1:", 0), 0u) << answer;
    remote_ = answer.substr(3);
  }
  RemoteBuffer Alloc(const std::string& kind, size_t bytes, const std::string& name = "") {
    std::istringstream in(agent_->Ok("alloc " + kind + " " + std::to_string(bytes) + " " + name));
    RemoteBuffer b;
    in >> b.index >> b.addr;
    return b;
  }
  std::string Check(const RemoteBuffer& b, uint64_t seed, size_t offset, size_t length) {
    return agent_->Command("check " + std::to_string(b.index) + " " + std::to_string(seed) + " " +
                           std::to_string(offset) + " " + std::to_string(length));
  }
  void Fill(const RemoteBuffer& b, uint64_t seed) {
    agent_->Ok("fill " + std::to_string(b.index) + " " + std::to_string(seed));
  }
  // Offset of the first byte of local_ that is not AgentPattern(seed), or -1.
  long FirstWrongByte(uint64_t seed, size_t offset, size_t length) const {
    for (size_t i = offset; i < offset + length; ++i)
      if (static_cast<unsigned char>(local_.data()[i]) != AgentPattern(seed, i)) return static_cast<long>(i);
    return -1;
  }

  std::unique_ptr<BrokerProcess> peer_broker_, own_broker_;
  Client client_;
  std::string secret_;
  std::unique_ptr<EngineAgent> agent_;
  std::string remote_;  // "decode", or the agent's ip:port
  std::unique_ptr<TransferEngine> engine_;
  Memory local_;
};

// READ and WRITE of whole buffers and of scattered pieces, into broker memory
// and into the peer's own (HostRegister'ed) memory: every byte lands, and the
// gaps between pieces are left alone.
TEST_P(TransportConformance, ReadAndWriteEveryByte) {
  for (const char* kind : {"broker", "host"}) {
    SCOPED_TRACE(kind);
    RemoteBuffer r = Alloc(kind, kSize);
    Fill(r, 3);
    std::memset(local_.data(), 0, kSize);
    Status st = engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, kSize}}, 30'000);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(FirstWrongByte(3, 0, kSize), -1);

    for (size_t i = 0; i < kSize; ++i) local_.data()[i] = static_cast<char>(AgentPattern(5, i));
    ASSERT_TRUE(engine_->TransferSync(remote_, WRITE, {{local_.addr(), r.addr, kSize}}, 30'000).ok());
    EXPECT_EQ(Check(r, 5, 0, kSize), "ok");

    // 256 pieces of 4 KiB, every other page: the pages between stay as they were.
    Fill(r, 7);
    std::vector<TransferOpDesc> pieces;
    for (size_t i = 0; i < 256; ++i) pieces.push_back({local_.addr() + i * 8192, r.addr + i * 8192, 4096});
    std::memset(local_.data(), 0, kSize);
    ASSERT_TRUE(engine_->TransferSync(remote_, READ, pieces, 30'000).ok());
    for (size_t i = 0; i < 256; ++i) {
      ASSERT_EQ(FirstWrongByte(7, i * 8192, 4096), -1) << "piece " << i;
      ASSERT_EQ(local_.data()[i * 8192 + 4096], 0) << "the gap after piece " << i << " was written";
    }
    for (size_t i = 0; i < kSize; ++i) local_.data()[i] = static_cast<char>(AgentPattern(9, i));
    ASSERT_TRUE(engine_->TransferSync(remote_, WRITE, pieces, 30'000).ok());
    for (size_t i = 0; i < 256; ++i) {
      ASSERT_EQ(Check(r, 9, i * 8192, 4096), "ok") << "piece " << i;
      ASSERT_EQ(Check(r, 7, i * 8192 + 4096, 4096), "ok") << "the gap after piece " << i;
    }
  }
}

TEST_P(TransportConformance, AsyncTransfersCompleteAndAreReportedOnce) {
  RemoteBuffer r = Alloc("broker", kSize);
  Fill(r, 11);
  std::memset(local_.data(), 0, kSize);
  TransferReq req = 0;
  ASSERT_TRUE(engine_->TransferAsync(remote_, READ, {{local_.addr(), r.addr, kSize}}, req, 30'000).ok());
  // The request's own 30 s timeout ends the wait; the outer bound only keeps a broken engine from hanging the test.
  TransferStatus ts = TransferStatus::WAITING;
  const auto bound = Clock::now() + std::chrono::seconds(90);
  while (ts == TransferStatus::WAITING && Clock::now() < bound) {
    ASSERT_TRUE(engine_->GetTransferStatus(req, ts).ok());
    if (ts == TransferStatus::WAITING) std::this_thread::yield();
  }
  ASSERT_EQ(ts, TransferStatus::COMPLETED) << engine_->last_error().ToString();
  EXPECT_EQ(FirstWrongByte(11, 0, kSize), -1);
  EXPECT_EQ(engine_->GetTransferStatus(req, ts).code(), ErrorCode::kParamInvalid);  // reported once
}

// A batch with one bad descriptor is refused whole, naming it, and moves nothing.
TEST_P(TransportConformance, ABadDescriptorIsNamedAndNothingMoves) {
  RemoteBuffer r = Alloc("broker", 1 << 20);
  Fill(r, 13);
  std::memset(local_.data(), 0x44, kSize);
  Status st =
      engine_->TransferSync(remote_, WRITE, {{local_.addr(), r.addr, 4096}, {local_.addr(), r.addr + (1 << 20), 4096}});
  EXPECT_EQ(st.code(), ErrorCode::kParamInvalid) << st.ToString();
  EXPECT_NE(st.message().find("descriptor 1"), std::string::npos) << st.ToString();
  EXPECT_EQ(Check(r, 13, 0, 1 << 20), "ok");
  // Local ranges: outside what this engine registered, or empty.
  st = engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 4096}, {local_.addr() + kSize, r.addr, 4096}});
  EXPECT_EQ(st.code(), ErrorCode::kParamInvalid) << st.ToString();
  EXPECT_NE(st.message().find("descriptor 1"), std::string::npos) << st.ToString();
  EXPECT_EQ(engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 0}}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(engine_->TransferSync(remote_, static_cast<TransferOp>(7), {{local_.addr(), r.addr, 4096}}).code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(static_cast<unsigned char>(local_.data()[0]), 0x44);
}

TEST_P(TransportConformance, NotifiesArriveInOrder) {
  for (int i = 0; i < 3; ++i) {
    Status st = engine_->SendNotify(remote_, {"kv_ready", "request-" + std::to_string(i)}, 10'000);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(agent_->Command("notifies"),
            "ok 3 prefill kv_ready request-0 prefill kv_ready request-1 prefill kv_ready request-2");
  EXPECT_EQ(agent_->Command("notifies"), "ok 0");
  EXPECT_EQ(engine_->SendNotify(remote_, {std::string(129, 'n'), ""}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(engine_->SendNotify(remote_, {"kv_ready", std::string(1025, 'm')}).code(), ErrorCode::kParamInvalid);
}

// A notify for an engine of this process wakes its Client's wake fd (an event
// loop's) and a WaitNotifies, by either path: the broker sends the byte on the
// same host, the transport itself for a notify from another host.
TEST_P(TransportConformance, ANotifyWakesTheWakeFdAndWaitNotifies) {
  const bool ucx = GetParam() == Path::kUcx;
  Client rc = *Client::Connect({(own_broker_ ? *own_broker_ : *peer_broker_).socket(), "receiver"});
  TransferEngine receiver(rc);
  std::map<std::string, std::string> options;
  if (ucx) options = {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret_}};
  ASSERT_TRUE(receiver.Initialize("receiver", options).ok());
  NetworkStats ns;
  ASSERT_TRUE(receiver.GetNetworkStats(ns).ok());
  const std::string address = ucx ? ns.listen_address : "receiver";
  agent_->Ok("connect " + address + " 10000");
  auto fd = rc.WakeFd();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  rc.DrainWakeFd();
  std::vector<Notify> got;
  ASSERT_TRUE(receiver.GetNotifies(got).ok());
  EXPECT_TRUE(got.empty());
  EXPECT_FALSE(Readable(*fd, 0));

  agent_->Ok("notify " + address + " kv_ready one");
  ASSERT_TRUE(Readable(*fd, 30'000)) << "no wake for a notify";
  rc.DrainWakeFd();
  ASSERT_TRUE(receiver.GetNotifies(got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].remote_engine, "decode");
  EXPECT_EQ(got[0].notify_msg, "one");
  EXPECT_FALSE(Readable(*fd, 0));

  // A wait that may begin before or after the notify is sent gets it either way.
  std::vector<Notify> waited;
  Status waited_status;
  std::thread waiter([&] { waited_status = receiver.WaitNotifies(waited, 60'000); });
  agent_->Ok("notify " + address + " kv_ready two");
  waiter.join();
  ASSERT_TRUE(waited_status.ok()) << waited_status.ToString();
  ASSERT_EQ(waited.size(), 1u);
  EXPECT_EQ(waited[0].notify_msg, "two");
  // Nothing more: the wait ends at its bound with none.
  ASSERT_TRUE(receiver.WaitNotifies(waited, 10).ok());
  EXPECT_TRUE(waited.empty());
  EXPECT_EQ(receiver.WaitNotifies(waited, -1).code(), ErrorCode::kParamInvalid);
}

// A peer's registered ranges are listed by the names it gave them, whichever
// path reaches it, and a listed address is one a transfer can use; a name is
// unique per engine, and a deregistered range leaves the list.
TEST_P(TransportConformance, APeersRegionsAreListedByTheirNames) {
  RemoteBuffer kv = Alloc("broker", 1 << 20, "kv-cache");
  RemoteBuffer plain = Alloc("host", 4096);
  std::vector<RegionInfo> regions;
  ASSERT_TRUE(engine_->GetRemoteRegions(remote_, regions, 10'000).ok());
  auto named = [&](const std::string& name) {
    return std::find_if(regions.begin(), regions.end(), [&](const RegionInfo& r) { return r.name == name; });
  };
  ASSERT_NE(named("kv-cache"), regions.end());
  EXPECT_EQ(named("kv-cache")->address, kv.addr);
  EXPECT_EQ(named("kv-cache")->length, size_t{1} << 20);
  EXPECT_FALSE(named("kv-cache")->read_only);
  EXPECT_TRUE(std::any_of(regions.begin(), regions.end(),
                          [&](const RegionInfo& r) { return r.address == plain.addr && r.name.empty(); }));
  // The listed address is where the bytes go.
  for (size_t i = 0; i < 4096; ++i) local_.data()[i] = static_cast<char>(AgentPattern(3, 8192 + i));
  ASSERT_TRUE(engine_->TransferSync(remote_, WRITE, {{local_.addr(), named("kv-cache")->address + 8192, 4096}}, 10'000).ok());
  EXPECT_EQ(Check(kv, 3, 8192, 4096), "ok");
  EXPECT_EQ(agent_->Command("alloc broker 4096 kv-cache").rfind("err ALREADY_EXISTS", 0), 0u);
  EXPECT_EQ(agent_->Command("alloc broker 4096 " + std::string(33, 'n')).rfind("err PARAM_INVALID", 0), 0u);
  agent_->Ok("dereg " + std::to_string(kv.index));
  ASSERT_TRUE(engine_->GetRemoteRegions(remote_, regions, 10'000).ok());
  EXPECT_EQ(named("kv-cache"), regions.end()) << "a deregistered range is still listed";
  EXPECT_EQ(engine_->GetRemoteRegions("nobody", regions).code(), ErrorCode::kNotConnected);
}

// Threads here write into the peer's range while the peer deregisters it: the
// deregistration waits for the writes in flight, a write that starts after it
// returned is refused, and nothing lands in the range afterwards.
TEST_P(TransportConformance, DeregistrationWhileTransfersAreInFlight) {
  RemoteBuffer r = Alloc("broker", 2 << 20);  // a MiB per thread: the threads never write the same bytes
  std::atomic<bool> stop{false}, deregistered{false};
  std::atomic<int> moved{0}, refused_after{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        const bool after = deregistered.load();
        Status st =
            engine_->TransferSync(remote_, WRITE, {{local_.addr() + t * (1 << 20), r.addr + t * (1 << 20), 1 << 20}}, 30'000);
        if (st.ok() && !after)
          moved.fetch_add(1);
        else if (st.code() == ErrorCode::kParamInvalid && after)
          refused_after.fetch_add(1);
        else if (!(st.code() == ErrorCode::kParamInvalid && !after))
          wrong.fetch_add(1);  // ok after, or another error
      }
    });
  const auto bound = Clock::now() + std::chrono::seconds(60);
  while (moved.load() < 4 && Clock::now() < bound) std::this_thread::yield();
  EXPECT_GE(moved.load(), 4) << "no transfer completed in 60 s";
  agent_->Ok("dereg " + std::to_string(r.index));
  deregistered.store(true);
  Fill(r, 17);  // the agent's bytes now; none of ours may land here any more
  while (refused_after.load() < 4 && Clock::now() < bound) std::this_thread::yield();
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_GE(refused_after.load(), 4);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(Check(r, 17, 0, 2 << 20), "ok") << "written after DeregisterMem returned";
}

// The peer's process is SIGKILLed: transfers and notifies say NOT_CONNECTED
// (never hang, never crash this process), and a new engine of the same name
// can be connected again.
TEST_P(TransportConformance, APeerKilledIsNotConnectedAndANewOneCanBeReached) {
  RemoteBuffer r = Alloc("broker", 1 << 20);
  ASSERT_TRUE(engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 1 << 20}}, 30'000).ok());
  agent_->Kill();
  Status st = engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 1 << 20}}, 30'000);
  EXPECT_EQ(st.code(), ErrorCode::kNotConnected) << st.ToString();
  st = engine_->SendNotify(remote_, {"kv_ready", "after"}, 30'000);
  EXPECT_EQ(st.code(), ErrorCode::kNotConnected) << st.ToString();
  st = engine_->Disconnect(remote_, 30'000);
  EXPECT_TRUE(st.ok() || st.code() == ErrorCode::kNotConnected) << st.ToString();

  StartPeer();
  if (IsSkipped()) return;
  ASSERT_FALSE(HasFatalFailure());
  RemoteBuffer again = Alloc("broker", 1 << 20);
  Fill(again, 19);
  st = engine_->Connect(remote_, 10'000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(engine_->TransferSync(remote_, READ, {{local_.addr(), again.addr, 1 << 20}}, 30'000).ok());
  EXPECT_EQ(FirstWrongByte(19, 0, 1 << 20), -1);
}

// A transfer whose time is up before it starts says TIMEOUT and moves
// nothing, synchronous or asynchronous, and the seed's recovery works on both paths:
// Disconnect, Connect, retry. (The UCX path closes the connection at a
// timeout, which cancels what is outstanding; the same-host path stops its own
// copies and could go on: docs/TRANSFER.md.)
TEST_P(TransportConformance, ATimeoutIsReportedAndTheConnectionStillWorks) {
  const size_t big = 64 << 20;
  Memory large = Register(client_, *engine_, big);
  RemoteBuffer r = Alloc("broker", big);
  Fill(r, 21);
  std::memset(large.data(), 0, big);
  Status st = engine_->TransferSync(remote_, READ, {{large.addr(), r.addr, big}}, 0);
  EXPECT_EQ(st.code(), ErrorCode::kTimeout) << st.ToString();
  for (size_t i = 0; i < big; i += 4096) ASSERT_EQ(large.data()[i], 0) << "byte " << i << " moved";
  TransferReq req = 0;
  ASSERT_TRUE(engine_->TransferAsync(remote_, WRITE, {{large.addr(), r.addr, big}}, req, 0).ok());
  TransferStatus ts = TransferStatus::WAITING;
  const auto bound = Clock::now() + std::chrono::seconds(90);
  while (ts == TransferStatus::WAITING && Clock::now() < bound) {
    ASSERT_TRUE(engine_->GetTransferStatus(req, ts).ok());
    if (ts == TransferStatus::WAITING) std::this_thread::yield();
  }
  EXPECT_EQ(ts, TransferStatus::TIMEOUT);
  EXPECT_EQ(engine_->last_error().code(), ErrorCode::kTimeout);
  EXPECT_EQ(Check(r, 21, 0, big), "ok") << "the timed-out WRITE moved bytes";
  Fill(r, 23);
  st = engine_->Disconnect(remote_, 30'000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = engine_->Connect(remote_, 10'000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 1 << 20}}, 30'000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FirstWrongByte(23, 0, 1 << 20), -1);
}

// Disconnect ends the connection for this engine only; transfers then say
// NOT_CONNECTED, a second Connect while connected says ALREADY_CONNECTED, and
// connecting again works.
TEST_P(TransportConformance, DisconnectAndConnectAgain) {
  RemoteBuffer r = Alloc("broker", 1 << 20);
  EXPECT_EQ(engine_->Connect(remote_, 10'000).code(), ErrorCode::kAlreadyConnected);
  ASSERT_TRUE(engine_->Disconnect(remote_, 10'000).ok());
  EXPECT_EQ(engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 4096}}).code(), ErrorCode::kNotConnected);
  EXPECT_EQ(engine_->SendNotify(remote_, {"n", "m"}).code(), ErrorCode::kNotConnected);
  EXPECT_EQ(engine_->Disconnect(remote_, 10'000).code(), ErrorCode::kNotConnected);
  ASSERT_TRUE(engine_->Connect(remote_, 10'000).ok());
  Fill(r, 29);
  ASSERT_TRUE(engine_->TransferSync(remote_, READ, {{local_.addr(), r.addr, 1 << 20}}, 30'000).ok());
  EXPECT_EQ(FirstWrongByte(29, 0, 1 << 20), -1);
}

INSTANTIATE_TEST_SUITE_P(Paths, TransportConformance, ::testing::Values(Path::kSameHost, Path::kUcx),
                         [](const ::testing::TestParamInfo<Path>& p) {
                           return p.param == Path::kUcx ? std::string("ucx") : std::string("same_host");
                         });

}  // namespace
}  // namespace membroker::testing
