// Transfer engine between real processes: the test process is one engine, a
// forked child ("server") is the other. The child obeys one-line commands on a
// Channel so the test decides when it registers, deregisters or dies.
#include <grp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"
#include "membroker/ipc/engine_control.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

namespace membroker::testing {
namespace {

constexpr size_t kSize = 1 << 20;

// Memory an engine registers: broker memory mapped here, or this process's own
// heap memory pinned with HostRegister (reached by cross-memory attach).
struct Region {
  PhysicalHandle handle;
  WholeMapping mem;
  void* heap = nullptr;
  size_t size = 0;
  char* data() const { return heap ? static_cast<char*>(heap) : mem.as<char>(); }
};

Region MakeRegion(Client& c, size_t size, bool pageable) {
  Region r;
  r.size = size;
  if (pageable) {
    r.heap = std::aligned_alloc(4096, size);
    if (r.heap == nullptr || !c.HostRegister(r.heap, size).ok()) std::abort();
  } else {
    r.handle = *c.MallocPhysical(size);
    r.mem = *MapWhole(c, r.handle);
  }
  return r;
}

uint64_t Sum(const char* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s = s * 31 + static_cast<unsigned char>(p[i]);
  return s;
}

// The child side. Commands: "sum" (checksum of region 0), "fill B", "reg"
// (register a second region; replies its address), "dereg" (region 0),
// "notifies" (count received), "finalize", "exit".
int Server(const std::string& socket, const std::string& name, bool pageable, bool deferred, Channel& ch) {
  if (deferred && ch.Receive() != "go") return 9;
  auto c = Client::Connect({socket, name});
  if (!c.ok()) return 10;
  TransferEngine engine(*c);
  if (!engine.Initialize(name).ok()) return 11;
  std::vector<Region> regions;
  std::vector<MemHandle> handles;
  auto add = [&](size_t size) {
    regions.push_back(MakeRegion(*c, size, pageable));
    std::memset(regions.back().data(), 'S', size);
    MemHandle h = nullptr;
    Status st = engine.RegisterMem({reinterpret_cast<uintptr_t>(regions.back().data()), size}, MEM_HOST, h);
    handles.push_back(h);
    return st;
  };
  if (!add(kSize).ok()) return 12;
  ch.Send("ready " + std::to_string(reinterpret_cast<uintptr_t>(regions[0].data())));
  for (;;) {
    std::string cmd = ch.Receive();
    if (cmd.empty() || cmd == "exit") return 0;
    if (cmd == "sum") {
      ch.Send(std::to_string(Sum(regions[0].data(), kSize)));
    } else if (cmd.rfind("fill ", 0) == 0) {
      std::memset(regions[0].data(), cmd[5], kSize);
      ch.Send("ok");
    } else if (cmd == "reg") {
      Status st = add(kSize);
      ch.Send(st.ok() ? std::to_string(reinterpret_cast<uintptr_t>(regions.back().data())) : st.ToString());
    } else if (cmd == "dereg") {
      ch.Send(engine.DeregisterMem(handles[0]).ToString());
    } else if (cmd == "notifies") {
      std::vector<Notify> got;
      Status st = engine.GetNotifies(got);
      std::string line = st.ok() ? std::to_string(got.size()) : st.ToString();
      if (!got.empty()) line += " " + got.back().remote_engine + " " + got.back().name + " " + got.back().notify_msg;
      ch.Send(line);
    } else if (cmd == "finalize") {
      engine.Finalize();
      ch.Send("ok");
    }
  }
}

// Children are forked before the test process starts threads of its own (an
// engine's), as ThreadSanitizer requires; a deferred child starts its engine
// only when Start() says so.
struct ServerChild {
  Channel ch;
  pid_t pid = -1;
  uintptr_t addr = 0;
  ServerChild(const std::string& socket, const std::string& name, bool pageable, bool deferred = false) {
    pid = ForkChild([&] {
      ch.AsChild();
      return Server(socket, name, pageable, deferred, ch);
    });
    ch.AsParent();
    if (!deferred) WaitReady();
  }
  void Start() {
    ch.Send("go");
    WaitReady();
  }
  void WaitReady() {
    std::istringstream in(ch.Receive());
    std::string word;
    in >> word >> addr;
    EXPECT_EQ(word, "ready");
  }
  std::string Ask(const std::string& cmd) {
    ch.Send(cmd);
    return ch.Receive();
  }
  int Finish() {
    ch.Send("exit");
    return WaitChild(pid);
  }
};

// The test process's engine with one registered MallocHost buffer.
struct Local {
  Client client;
  std::unique_ptr<TransferEngine> engine;
  void* buf = nullptr;
  MemHandle handle = nullptr;
  explicit Local(const BrokerProcess& broker, const std::string& name = "client", size_t size = kSize) {
    client = *Client::Connect({broker.socket(), name});
    engine = std::make_unique<TransferEngine>(client);
    EXPECT_TRUE(engine->Initialize(name).ok());
    buf = *client.MallocHost(size);
    EXPECT_TRUE(engine->RegisterMem({reinterpret_cast<uintptr_t>(buf), size}, MEM_HOST, handle).ok());
  }
  ~Local() {
    engine.reset();
    (void)client.FreeHost(buf);
  }
  char* data() const { return static_cast<char*>(buf); }
};

class TransferTest : public ::testing::TestWithParam<bool> {};  // pageable remote memory?

TEST_P(TransferTest, ReadAndWriteEveryByte) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", GetParam());
  Local local(broker);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  ASSERT_TRUE(local.engine->TransferSync("server", READ, {{buf, server.addr, kSize}}).ok());
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(local.data()[i], 'S') << i;
  std::memset(local.buf, 'W', kSize);
  // Many small descriptors in one batch, scattered over the range.
  std::vector<TransferOpDesc> descs;
  for (size_t off = 0; off < kSize; off += 4096) descs.push_back({buf + off, server.addr + off, 4096});
  ASSERT_TRUE(local.engine->TransferSync("server", WRITE, descs).ok());
  std::vector<char> want(kSize, 'W');
  EXPECT_EQ(server.Ask("sum"), std::to_string(Sum(want.data(), kSize)));
  EXPECT_TRUE(local.engine->Disconnect("server", 1000).ok());
  EXPECT_EQ(server.Finish(), 0);
  local.engine.reset();
  EXPECT_EQ(broker.WaitForStat("engines", 0), 0u);
}

TEST_P(TransferTest, AsyncRequestsCompleteAndArePolledInABatch) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", GetParam());
  Local local(broker);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  std::vector<TransferReq> reqs(8);
  for (size_t i = 0; i < reqs.size(); ++i) {
    size_t part = kSize / reqs.size();
    ASSERT_TRUE(local.engine->TransferAsync("server", READ, {{buf + i * part, server.addr + i * part, part}},
                                            reqs[i], 5000).ok());
  }
  std::vector<TransferStatus> st;
  std::vector<TransferReq> waiting = reqs;
  while (!waiting.empty()) {
    ASSERT_TRUE(local.engine->GetTransferStatus(waiting, st).ok());
    std::vector<TransferReq> still;
    for (size_t i = 0; i < waiting.size(); ++i) {
      EXPECT_TRUE(st[i] == TransferStatus::WAITING || st[i] == TransferStatus::COMPLETED);
      if (st[i] == TransferStatus::WAITING) still.push_back(waiting[i]);
    }
    waiting = still;
  }
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(local.data()[i], 'S') << i;
  TransferStatus s;
  EXPECT_EQ(local.engine->GetTransferStatus(reqs[0], s).code(), ErrorCode::kParamInvalid);  // reported once
  EXPECT_EQ(server.Finish(), 0);
}

INSTANTIATE_TEST_SUITE_P(BrokerAndPageable, TransferTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Pageable" : "BrokerMemory"; });

TEST(Transfer, RegistrationErrors) {
  BrokerProcess broker;
  Local local(broker);
  MemHandle h = nullptr;
  auto base = reinterpret_cast<uintptr_t>(local.buf);
  EXPECT_EQ(local.engine->RegisterMem({base, 0}, MEM_HOST, h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(local.engine->RegisterMem({base + 1, 4096}, MEM_HOST, h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(local.engine->RegisterMem({base, 4096}, MEM_HOST, h).code(), ErrorCode::kParamInvalid)
      << "overlaps the registration Local made";
  EXPECT_EQ(local.engine->RegisterMem({base, 4096}, MEM_DEVICE, h).code(), ErrorCode::kParamInvalid)
      << "host memory is not MEM_DEVICE";
  std::vector<char> stack_like(3 * 4096);
  uintptr_t unregistered = (reinterpret_cast<uintptr_t>(stack_like.data()) + 4095) & ~uintptr_t{4095};
  EXPECT_EQ(local.engine->RegisterMem({unregistered, 4096}, MEM_HOST, h).code(), ErrorCode::kParamInvalid)
      << "neither broker memory nor HostRegister'ed";
  EXPECT_EQ(local.engine->DeregisterMem(reinterpret_cast<MemHandle>(uintptr_t{999})).code(),
            ErrorCode::kParamInvalid);
  // Registered memory cannot be unmapped or unregistered underneath the engine.
  EXPECT_EQ(local.client.FreeHost(local.buf).code(), ErrorCode::kBusy);
  EXPECT_TRUE(local.engine->DeregisterMem(local.handle).ok());
  EXPECT_EQ(local.engine->DeregisterMem(local.handle).code(), ErrorCode::kParamInvalid);
  // A second engine with a live name.
  auto other = *Client::Connect({broker.socket(), "other"});
  TransferEngine dup(other);
  EXPECT_EQ(dup.Initialize("client").code(), ErrorCode::kAlreadyExists);
  EXPECT_TRUE(dup.Initialize("client-2").ok());
  EXPECT_EQ(dup.Initialize("client-3").code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(dup.Initialize("x", {{"threads", "2"}}).code(), ErrorCode::kAlreadyExists);
  TransferEngine bad_option(*Client::Connect({broker.socket(), "o"}));
  EXPECT_EQ(bad_option.Initialize("o", {{"threads", "2"}}).code(), ErrorCode::kParamInvalid);
}

TEST(Transfer, ConnectionErrorsAndTimeouts) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", false);
  Local local(broker, "client", 16 * kSize);
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  EXPECT_EQ(local.engine->TransferSync("nobody", READ, {{buf, 0x1000, 4096}}).code(), ErrorCode::kNotConnected);
  EXPECT_EQ(local.engine->Connect("nobody", 50).code(), ErrorCode::kTimeout);
  EXPECT_EQ(local.engine->Disconnect("nobody", 50).code(), ErrorCode::kNotConnected);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  EXPECT_EQ(local.engine->Connect("server", 5000).code(), ErrorCode::kAlreadyConnected);
  // Descriptors outside registered memory, on either side: nothing is copied.
  std::memset(local.buf, 'L', kSize);
  EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf, server.addr, 4096}, {buf, server.addr + kSize, 4096}}).code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf + 16 * kSize, server.addr, 4096}}).code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf, server.addr, 0}}).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(local.data()[0], 'L') << "a rejected batch copied something";
  // A timeout that passes mid-batch: TIMEOUT, then the seed's recovery.
  std::vector<TransferOpDesc> big;
  for (size_t i = 0; i < 16; ++i) big.push_back({buf + i * kSize, server.addr, kSize});
  EXPECT_EQ(local.engine->TransferSync("server", READ, big, 0).code(), ErrorCode::kTimeout);
  ASSERT_TRUE(local.engine->Disconnect("server", 1000).ok());
  ASSERT_TRUE(local.engine->Connect("server", 1000).ok());
  EXPECT_TRUE(local.engine->TransferSync("server", READ, {{buf, server.addr, kSize}}).ok());
  EXPECT_EQ(local.data()[0], 'S');
  EXPECT_EQ(server.Finish(), 0);
}

TEST(Transfer, ConnectWaitsInTheBrokerForTheRemoteToAppear) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "late", false, /*deferred=*/true);
  Local local(broker);
  Status connected;
  std::thread connecter([&] { connected = local.engine->Connect("late", 10000); });
  ASSERT_EQ(broker.WaitForStat("waiters", 1), 1u);
  server.Start();
  connecter.join();
  EXPECT_TRUE(connected.ok()) << connected.ToString();
  EXPECT_EQ(broker.Stat("waiters"), 0u);
  EXPECT_EQ(server.Finish(), 0);
}

TEST(Transfer, RegionsRegisteredAfterConnectAreVisibleAndDeregisteredOnesAreNot) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", false);
  Local local(broker);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  ASSERT_TRUE(local.engine->TransferSync("server", READ, {{buf, server.addr, 4096}}).ok());
  uintptr_t second = std::stoull(server.Ask("reg"));
  EXPECT_TRUE(local.engine->TransferSync("server", WRITE, {{buf, second, kSize}}).ok());
  EXPECT_EQ(server.Ask("dereg"), "OK");
  EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf, server.addr, 4096}}).code(), ErrorCode::kParamInvalid);
  EXPECT_TRUE(local.engine->TransferSync("server", READ, {{buf, second, 4096}}).ok());
  EXPECT_EQ(server.Finish(), 0);
}

TEST(Transfer, NotifiesReachThePeerAndAFullQueueIsAnError) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", false);
  Local local(broker);
  EXPECT_EQ(local.engine->SendNotify("server", {"block", "1"}).code(), ErrorCode::kNotConnected);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  Status st;
  int sent = 0;
  while ((st = local.engine->SendNotify("server", {"block", std::to_string(sent)})).ok()) ++sent;
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(sent, 256);
  EXPECT_EQ(server.Ask("notifies"), "256 client block 255");
  EXPECT_EQ(server.Ask("notifies"), "0");
  EXPECT_TRUE(local.engine->SendNotify("server", {"block", "again"}).ok());
  EXPECT_EQ(server.Finish(), 0);
}

// SIGKILL of the peer during large batches: the survivor neither hangs nor
// crashes, later transfers say NOT_CONNECTED, and it reconnects when a new
// process takes the name. The broker ends with nothing held.
TEST_P(TransferTest, PeerKilledDuringABatch) {
  BrokerProcess broker;
  {
    auto server = std::make_unique<ServerChild>(broker.socket(), "server", GetParam());
    auto successor = std::make_unique<ServerChild>(broker.socket(), "server", GetParam(), /*deferred=*/true);
    // 8 requests of 32 MiB each (distinct local bytes: requests run concurrently).
    // Large enough that the copy threads, which take both CPUs, cannot finish
    // them all before this thread gets to send the SIGKILL (with 8 MiB each
    // they once did, on a loaded machine).
    constexpr size_t kPerRequest = 32;
    Local local(broker, "client", 8 * kPerRequest * kSize);
    ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
    auto buf = reinterpret_cast<uintptr_t>(local.buf);
    std::vector<TransferReq> reqs(8);
    for (size_t r = 0; r < reqs.size(); ++r) {
      std::vector<TransferOpDesc> batch;
      for (size_t i = 0; i < kPerRequest; ++i)
        batch.push_back({buf + (r * kPerRequest + i) * kSize, server->addr, kSize});
      ASSERT_TRUE(local.engine->TransferAsync("server", READ, batch, reqs[r], 60000).ok());
    }
    ::kill(server->pid, SIGKILL);
    EXPECT_EQ(WaitChild(server->pid), 128 + SIGKILL);
    int completed = 0;
    for (auto r : reqs) {
      TransferStatus s = TransferStatus::WAITING;
      while (s == TransferStatus::WAITING) ASSERT_TRUE(local.engine->GetTransferStatus(r, s).ok());
      EXPECT_NE(s, TransferStatus::TIMEOUT);
      completed += s == TransferStatus::COMPLETED;
    }
    // Copies through a mapping of broker memory may finish after the death;
    // cross-memory attach to a dead process cannot.
    if (GetParam()) {
      EXPECT_LT(completed, 8);
    }
    EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf, server->addr, 4096}}).code(),
              ErrorCode::kNotConnected);
    // The name comes back with a new process; the survivor connects again.
    server = std::move(successor);
    server->Start();
    ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
    ASSERT_TRUE(local.engine->TransferSync("server", READ, {{buf, server->addr, kSize}}).ok());
    EXPECT_EQ(local.data()[kSize - 1], 'S');
    EXPECT_EQ(server->Finish(), 0);
  }
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(broker.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(broker.Stat("engines"), 0u);
}

TEST(Transfer, APeerThatFinalizesIsNoLongerConnected) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", false);
  Local local(broker);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  ASSERT_TRUE(local.engine->TransferSync("server", READ, {{buf, server.addr, 4096}}).ok());
  EXPECT_EQ(server.Ask("finalize"), "ok");
  EXPECT_EQ(local.engine->TransferSync("server", READ, {{buf, server.addr, 4096}}).code(), ErrorCode::kNotConnected);
  EXPECT_EQ(server.Finish(), 0);
}

TEST(Transfer, AnEngineCanBeInitializedAgainAfterFinalize) {
  BrokerProcess broker;
  ServerChild server(broker.socket(), "server", false);
  Local local(broker);
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  local.engine->Finalize();
  EXPECT_EQ(local.engine->Connect("server", 100).code(), ErrorCode::kParamInvalid) << "not initialized";
  ASSERT_TRUE(local.engine->Initialize("client").ok()) << "the name was given back";
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  ASSERT_TRUE(local.engine->RegisterMem({buf, kSize}, MEM_HOST, local.handle).ok());
  ASSERT_TRUE(local.engine->Connect("server", 5000).ok());
  TransferReq req = 0;
  ASSERT_TRUE(local.engine->TransferAsync("server", READ, {{buf, server.addr, kSize}}, req, 5000).ok());
  TransferStatus st = TransferStatus::WAITING;
  while (st == TransferStatus::WAITING) ASSERT_TRUE(local.engine->GetTransferStatus(req, st).ok());
  EXPECT_EQ(st, TransferStatus::COMPLETED);
  EXPECT_EQ(server.Finish(), 0);
}

// A peer that registered a read-only import: its memory can be read, never written.
TEST(Transfer, ReadOnlyMemoryOfThePeerCannotBeWritten) {
  BrokerProcess broker;
  Channel ch;
  pid_t pid = ForkChild([&] {
    ch.AsChild();
    std::string token = ch.Receive();
    auto c = *Client::Connect({broker.socket(), "reader"});
    TransferEngine engine(c);
    if (!engine.Initialize("reader").ok()) return 10;
    auto imported = *c.ImportFromShareableHandle(token);
    auto m = *MapWhole(c, imported);
    MemHandle mh = nullptr;
    if (!engine.RegisterMem({reinterpret_cast<uintptr_t>(m.data()), kSize}, MEM_HOST, mh).ok()) return 11;
    ch.Send(std::to_string(reinterpret_cast<uintptr_t>(m.data())));
    return ch.Receive() == "exit" ? 0 : 12;
  });
  ch.AsParent();
  Local local(broker);
  auto h = *local.client.MallocPhysical(kSize);
  auto map = *MapWhole(local.client, h);
  std::memset(map.data(), 'R', kSize);
  ch.Send(*local.client.ExportToShareableHandle(h, kExportReadOnly | kExportNoPidCheck));
  uintptr_t remote = std::stoull(ch.Receive());
  ASSERT_TRUE(local.engine->Connect("reader", 5000).ok());
  auto buf = reinterpret_cast<uintptr_t>(local.buf);
  EXPECT_EQ(local.engine->TransferSync("reader", WRITE, {{buf, remote, 4096}}).code(), ErrorCode::kParamInvalid);
  ASSERT_TRUE(local.engine->TransferSync("reader", READ, {{buf, remote, kSize}}).ok());
  EXPECT_EQ(local.data()[kSize - 1], 'R');
  ch.Send("exit");
  EXPECT_EQ(WaitChild(pid), 0);
}

// Engines of different users cannot connect to each other.
TEST(Transfer, AnotherUsersEngineIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a process of another uid";
  BrokerProcess broker({"--socket-group", "65534", "--allow-uid", "65534"});
  Channel ch;
  pid_t pid = ForkChild([&] {
    ch.AsChild();
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) return 10;
    auto c = Client::Connect({broker.socket(), "nobody"});
    if (!c.ok()) return 11;
    TransferEngine engine(*c);
    if (!engine.Initialize("nobody").ok()) return 12;
    ch.Send("ready");
    return ch.Receive() == "exit" ? 0 : 13;
  });
  ch.AsParent();
  Local local(broker);
  ASSERT_EQ(ch.Receive(), "ready");
  EXPECT_EQ(local.engine->Connect("nobody", 1000).code(), ErrorCode::kPermissionDenied);
  ch.Send("exit");
  EXPECT_EQ(WaitChild(pid), 0);
}

// A same-uid peer that scribbles on this engine's control block (busy counters
// for its own slot and others, a live pid where old layouts kept one) cannot
// wedge DeregisterMem: the engine waits only for the peers the broker says
// are connected, at most drain_timeout_ms, and a retry after the peer is gone
// completes.
TEST(TransferTest, AHostilePeerCannotWedgeDeregisterMem) {
  BrokerProcess b;
  auto owner = Client::Connect({b.socket(), "owner"});
  ASSERT_TRUE(owner.ok());
  TransferEngine engine(*owner);
  ASSERT_TRUE(engine.Initialize("victim", {{"drain_timeout_ms", "300"}}).ok());
  Region region = MakeRegion(*owner, kSize, /*pageable=*/false);
  MemHandle handle = nullptr;
  ASSERT_TRUE(engine.RegisterMem({reinterpret_cast<uintptr_t>(region.data()), kSize}, MEM_HOST, handle).ok());

  Channel ch;
  pid_t evil = ForkChild([&] {
    ch.AsChild();
    using namespace ipc;
    auto sock = ConnectSeqpacket(b.socket());
    if (!sock.ok()) return 10;
    uint64_t rid = 1;
    auto call = [&](Message m, Frame* f) -> Result<Envelope> {
      auto bytes = Encode({kProtocolVersion, rid++, 0, std::move(m)});
      MB_RETURN_IF_ERROR(SendFrame(sock->get(), bytes, {}));
      MB_RETURN_IF_ERROR(RecvFrame(sock->get(), f));
      return Decode(f->bytes);
    };
    Frame f;
    if (!call(HelloRequest{"evil"}, &f).ok()) return 11;
    auto control = call(MallocRequest{4096}, &f);
    if (!control.ok() || !std::holds_alternative<MallocReply>(control->body)) return 12;
    const uint64_t own_control = std::get<MallocReply>(control->body).handle;
    if (!call(EngineInitRequest{"evil", own_control}, &f).ok()) return 13;
    auto info = call(EngineConnectRequest{"victim", 1000}, &f);
    if (!info.ok() || !std::holds_alternative<EngineInfoReply>(info->body)) return 14;
    const auto& i = std::get<EngineInfoReply>(info->body);
    auto imported = call(EngineImportRequest{"victim", i.control_allocation}, &f);
    if (!imported.ok() || f.fds.size() != 1) return 15;
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f.fds[0].get(), 0);
    if (p == MAP_FAILED) return 16;
    auto* block = static_cast<EngineControlBlock*>(p);
    for (uint32_t s = 0; s < kEngineSlots; ++s) {
      block->slots[s].busy.store(1);  // "inside a transfer", in every slot
      block->slots[s].unused = 1;     // where a pid used to be trusted: init's
    }
    ch.Send("scribbled");
    ch.Receive();  // stays alive, connected and "busy" until killed
    return 0;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "scribbled");
  Status st = engine.DeregisterMem(handle);
  EXPECT_EQ(st.code(), ErrorCode::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("pid " + std::to_string(evil)), std::string::npos) << st.message();
  // The range stays locked while it may still be written: no unmap yet.
  EXPECT_EQ(owner->UnmapMem(region.mem.map).code(), ErrorCode::kBusy);
  ::kill(evil, SIGKILL);
  EXPECT_EQ(WaitChild(evil), 128 + SIGKILL);
  EXPECT_EQ(b.WaitForStat("clients_connected", 1), 1u);
  EXPECT_TRUE(engine.DeregisterMem(handle).ok());
  EXPECT_EQ(engine.DeregisterMem(handle).code(), ErrorCode::kParamInvalid);
}

}  // namespace
}  // namespace membroker::testing
