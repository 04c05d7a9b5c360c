// Broker restart: clients reattach by themselves to the next broker on their
// socket and keep their handles (ids unchanged), mappings, exports, names and
// subscriptions, transfer engines and their connections; what a client
// presents is checked, so nobody gets memory they were never given
// (docs/RESTART.md).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "readable.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"
#include "raw_client.h"

namespace membroker::testing {
namespace {

using ipc::MallocReply;
using ipc::ReattachHandle;
using ipc::ReattachReply;
using ipc::ReattachRequest;
using ipc::ReattachResult;
using ipc::RestoreExportRequest;
using ipc::UniqueFd;
using ipc::kFeatureReattach;
using ipc::kMaxReattachHandles;
using ipc::kProtocolVersion;

constexpr int kClients = 8;
constexpr size_t kSize = 64 << 10;
constexpr int kPlain = 0, kExported = 1, kSameAddress = 2, kKinds = 3;
// ThreadSanitizer's shadow memory covers the same-address window: there the
// third allocation is an ordinary one.
#if defined(__SANITIZE_THREAD__)
constexpr bool kWithSameAddress = false;
#else
constexpr bool kWithSameAddress = true;
#endif

uint8_t Pattern(int client, int kind, size_t i) { return static_cast<uint8_t>(client * 31 + kind * 7 + i); }

bool HasPattern(const void* data, int client, int kind) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < kSize; ++i)
    if (p[i] != Pattern(client, kind, i)) return false;
  return true;
}

// Waits (bounded) for on_reattach to have run.
struct ReattachSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void Set() {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
    cv.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(20), [&] { return done; });
  }
};

std::string EngineName(int index) { return "holder-" + std::to_string(index % kClients); }

// One of the eight holders: three allocations mapped and filled, one
// exported, one published, a subscription, an engine that registered the
// plain allocation and host-registered scratch memory and is connected to
// the next holder's engine; even-numbered ones keep requests in flight
// across the broker's death. Exit codes name the failed step.
int Holder(const std::string& socket, int index, Channel& ch) {
  ReattachSignal reattached;
  ConnectOptions options{socket, "holder-" + std::to_string(index)};
  options.on_reattach = [&](const ReattachReport&) { reattached.Set(); };
  auto c = Client::Connect(options);
  if (!c.ok()) return 10;
  std::vector<PhysicalHandle> handles;
  std::vector<Reservation> ranges;
  std::vector<Mapping> maps;
  for (int kind = 0; kind < kKinds; ++kind) {
    AllocationProp prop;
    prop.same_address = kWithSameAddress && kind == kSameAddress;
    auto h = c->MallocPhysical(kSize, prop);
    if (!h.ok()) return 11;
    auto r = prop.same_address ? c->ReserveMemAddress(kSize, 0, h->fixed_address(), kReserveFixed)
                               : c->ReserveMemAddress(kSize);
    if (!r.ok()) return 12;
    auto m = c->MapMem(r->base(), kSize, 0, *h);
    if (!m.ok()) return 13;
    for (size_t i = 0; i < kSize; ++i) m->as<uint8_t>()[i] = Pattern(index, kind, i);
    handles.push_back(std::move(*h));
    ranges.push_back(std::move(*r));
    maps.push_back(std::move(*m));
  }
  const std::vector<uint64_t> ids = {handles[0].id(), handles[1].id(), handles[2].id()};
  const void* fixed = handles[kSameAddress].fixed_address();
  auto token = c->ExportToShareableHandle(handles[kExported], kExportNoPidCheck);
  if (!token.ok()) return 14;
  if (!c->Publish("restart/" + std::to_string(index), handles[kPlain]).ok()) return 15;
  if (!c->Subscribe("restart/").ok()) return 16;
  void* scratch = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED || !c->HostRegister(scratch, kSize).ok()) return 40;
  TransferEngine engine(*c);
  MemHandle registered, scratch_registered;
  if (!engine.Initialize(EngineName(index)).ok()) return 41;
  if (!engine.RegisterMem({reinterpret_cast<uintptr_t>(maps[kPlain].data()), kSize}, MEM_HOST, registered, "plain").ok() ||
      !engine.RegisterMem({reinterpret_cast<uintptr_t>(scratch), kSize}, MEM_HOST, scratch_registered).ok())
    return 42;
  if (!engine.Connect(EngineName(index + 1), 20000).ok()) return 43;

  std::atomic<bool> stop{false};
  std::atomic<int> wrong_errors{0};
  std::thread busy;
  if (index % 2 == 0)
    busy = std::thread([&] {
      while (!stop) {
        auto h = c->MallocPhysical(4096);
        if (h.ok()) continue;  // freed at once by its destructor
        if (h.code() != ErrorCode::kNotConnected) ++wrong_errors;
      }
    });
  ch.Send("ready " + *token + " " + std::to_string(reinterpret_cast<uintptr_t>(maps[kPlain].data())));
  const std::string restarted = ch.Receive();
  if (restarted.rfind("restarted ", 0) != 0) return 17;
  const uintptr_t next_plain = std::stoull(restarted.substr(10));
  if (!reattached.Wait()) return 18;
  stop = true;
  if (busy.joinable()) busy.join();
  if (wrong_errors != 0) return 19;
  const ReattachReport report = c->last_reattach();
  // Four handles at least (the busy loop may have held one), none refused;
  // export, name, subscription, host registration, engine and its two
  // ranges restored.
  if (report.handles < 4 || report.handles_refused != 0 || report.failed != 0 || report.restored != 7) return 20;
  if (c->reattaches() != 1 || c->client_id() != report.client_id) return 21;
  // Same ids, same bytes, same fixed address; the broker serves them again.
  for (int kind = 0; kind < kKinds; ++kind) {
    if (handles[kind].id() != ids[kind]) return 22;
    if (!HasPattern(maps[kind].data(), index, kind)) return 23;
    if (!c->ExportToShareableHandle(handles[kind], kExportNoPidCheck).ok()) return 24;
  }
  if (handles[kSameAddress].fixed_address() != fixed) return 25;
  auto fresh = c->MallocPhysical(4096);
  if (!fresh.ok()) return 26;
  // Transfers work again: the connection to the next holder's engine is made
  // again at the new broker (waiting for that engine to be back); READ
  // brings its bytes, WRITE puts them back unchanged.
  const std::vector<TransferOpDesc> all = {{reinterpret_cast<uintptr_t>(scratch), next_plain, kSize}};
  if (Status st = engine.TransferSync(EngineName(index + 1), READ, all, 20000); !st.ok()) {
    std::fprintf(stderr, "holder %d READ: %s\n", index, st.ToString().c_str());
    return 44;
  }
  if (!HasPattern(scratch, (index + 1) % kClients, kPlain)) return 45;
  if (!engine.TransferSync(EngineName(index + 1), WRITE, all, 20000).ok()) return 46;
  if (!engine.SendNotify(EngineName(index + 1), {"restarted", "ok"}).ok()) return 47;
  // The next holder's range kept its name through its reattach.
  std::vector<RegionInfo> regions;
  if (!engine.GetRemoteRegions(EngineName(index + 1), regions, 20000).ok() ||
      std::none_of(regions.begin(), regions.end(),
                   [&](const RegionInfo& r) { return r.name == "plain" && r.address == next_plain; }))
    return 51;
  // Ranges registered before and after the restart are deregistered cleanly.
  MemHandle later;
  if (!engine.RegisterMem({reinterpret_cast<uintptr_t>(maps[kExported].data()), kSize}, MEM_HOST, later).ok() ||
      !engine.DeregisterMem(later).ok() || !engine.DeregisterMem(scratch_registered).ok())
    return 48;
  ch.Send("ok");
  if (ch.Receive() != "notifies") return 49;
  std::vector<Notify> notifies;
  if (!engine.GetNotifies(notifies).ok() || notifies.size() != 1 || notifies[0].remote_engine != EngineName(index - 1 + kClients))
    return 50;
  ch.Send("ok");
  return ch.Receive() == "exit" ? 0 : 27;
}

// SIGKILLs the children not waited for yet when a test ends early (each holds
// the others' channel ends, so none would see EOF).
struct KillLeftOver {
  std::vector<pid_t>& pids;
  ~KillLeftOver() {
    for (pid_t& p : pids)
      if (p > 0) {
        ::kill(p, SIGKILL);
        (void)WaitChild(p);
      }
  }
};

TEST(Restart, EightClientsReattachAfterSigkillWithEverythingTheyHeld) {
  BrokerProcess b;
  const size_t idle_fds = b.FdCount();
  std::vector<Channel> channels(kClients);
  std::vector<pid_t> pids;
  KillLeftOver kill_left_over{pids};
  for (int i = 0; i < kClients; ++i)
    pids.push_back(ForkChild([&, i] {
      channels[i].AsChild();
      return Holder(b.socket(), i, channels[i]);
    }));
  std::vector<std::string> tokens, plain_addresses;
  for (int i = 0; i < kClients; ++i) {
    channels[i].AsParent();
    std::istringstream line(channels[i].Receive());
    std::string ready, token, address;
    line >> ready >> token >> address;
    ASSERT_EQ(ready, "ready") << "holder " << i << " said '" << line.str() << "'";
    tokens.push_back(token);
    plain_addresses.push_back(address);
  }
  ASSERT_EQ(b.Stat("allocations_live") >= kClients * kKinds, true);

  b.Kill();  // mid-request for the busy holders
  b.Restart();
  for (int i = 0; i < kClients; ++i) channels[i].Send("restarted " + plain_addresses[(i + 1) % kClients]);
  for (int i = 0; i < kClients; ++i) ASSERT_EQ(channels[i].Receive(), "ok") << "holder " << i;
  for (auto& ch : channels) ch.Send("notifies");  // every notify was sent
  for (int i = 0; i < kClients; ++i) ASSERT_EQ(channels[i].Receive(), "ok") << "holder " << i;

  // Another process reads what the holders re-presented: the old tokens and
  // the names work again.
  auto reader = Client::Connect({b.socket(), "reader"});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  for (int i = 0; i < kClients; ++i) {
    auto imported = reader->ImportFromShareableHandle(tokens[i]);
    ASSERT_TRUE(imported.ok()) << "holder " << i << ": " << imported.status().ToString();
    auto named = reader->Lookup("restart/" + std::to_string(i));
    ASSERT_TRUE(named.ok()) << "holder " << i << ": " << named.status().ToString();
    for (auto [handle, kind] : {std::pair<PhysicalHandle*, int>{&*imported, kExported}, {&*named, kPlain}}) {
      auto m = MapWhole(*reader, *handle);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_TRUE(HasPattern(m->data(), i, kind)) << "holder " << i << " kind " << kind;
    }
  }
  // The broker's tables equal what the holders hold: three each and the
  // engine's control block, adopted, and the one made after the restart.
  EXPECT_EQ(b.WaitForStat("allocations_live", kClients * (kKinds + 2)), uint64_t{kClients * (kKinds + 2)});
  EXPECT_GE(b.Stat("handles_adopted"), uint64_t{kClients * kKinds});
  EXPECT_EQ(b.Stat("reattach_refused"), 0u);
  EXPECT_EQ(b.Stat("clients_reattached"), uint64_t{kClients});
  EXPECT_EQ(b.Stat("exports_restored"), uint64_t{kClients});
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");

  for (auto& ch : channels) ch.Send("exit");
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(WaitChild(pids[i]), 0) << "holder " << i;
    pids[i] = 0;
  }
  reader = Client();
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(b.WaitForStat("bytes_returning", 0), 0u);
  EXPECT_EQ(b.FdCount(), idle_fds);
}

// A forged memfd: sealed and sized as the broker's, with a name in the
// broker's format but a tag made without its key.
UniqueFd ForgedMemory(const char* name) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

// Presents handles; the reply's results.
std::vector<ReattachResult> Present(RawClient& raw, std::vector<ReattachHandle> handles, std::vector<int> fds) {
  EXPECT_TRUE(raw.SendMsg(ReattachRequest{std::move(handles)}, 0, kProtocolVersion, fds).ok());
  auto r = raw.Next();
  EXPECT_TRUE(r.ok());
  if (!r.ok() || !std::holds_alternative<ReattachReply>(r->body)) {
    ADD_FAILURE() << "no ReattachReply";
    return {};
  }
  return std::get<ReattachReply>(r->body).results;
}

// `count` allocations of 4 KiB, with their ids and fds as a raw client sees them.
void AllocateRaw(RawClient& first, size_t count, std::vector<uint64_t>* ids, std::vector<UniqueFd>* fds) {
  for (size_t i = 0; i < count; ++i) {
    ASSERT_TRUE(first.SendMsg(ipc::MallocRequest{4096, ipc::PagePolicy::kNormalOnly, 0, 0}).ok());
    ipc::Frame f;
    auto m = first.Next(&f);
    ASSERT_TRUE(m.ok() && std::holds_alternative<MallocReply>(m->body));
    ids->push_back(std::get<MallocReply>(m->body).handle);
    fds->push_back(std::move(f.fds[0]));
  }
}

TEST(Restart, PresentedMemoryIsCheckedAndRefusalsChangeNothing) {
  BrokerProcess b;
  // Memory from the first broker, with its fds, as a raw client sees them.
  RawClient first(b.socket());
  first.Hello();
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> ids;
  ASSERT_NO_FATAL_FAILURE(AllocateRaw(first, 2, &ids, &fds));
  b.Kill();
  b.Restart();
  auto bystander = Client::Connect({b.socket(), "bystander"});
  ASSERT_TRUE(bystander.ok());

  // Without the reattach hello: out of protocol.
  RawClient plain(b.socket());
  plain.Hello();
  int f0 = fds[0].get();
  ASSERT_TRUE(plain.SendMsg(ReattachRequest{{{ids[0], true, false, 0}}}, 0, kProtocolVersion, {&f0, 1}).ok());
  EXPECT_EQ(ErrorOf(plain.Next()), ErrorCode::kProtocolError);

  RawClient raw(b.socket());
  raw.Hello(kFeatureReattach);
  UniqueFd own = ForgedMemory("membroker:client1");
  UniqueFd tagged = ForgedMemory("membroker:client1:0123456789abcdef.0123456789abcdef");
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);
  auto results = Present(raw,
                         {{ids[0], true, false, 0},        // a memfd it made: not a broker's
                          {ids[0], true, false, 0},        // a forged tag
                          {ids[0], true, false, 0},        // not memory at all
                          {999999999, true, false, 0},     // genuine memory, an id never given out
                          {ids[0], true, false, 0},        // genuine: taken back
                          {ids[0], true, false, 0},        // again: held already
                          {ids[0], true, false, 0}},       // other genuine memory under that id
                         {own.get(), tagged.get(), pipe_r.get(), fds[0].get(), fds[0].get(), fds[0].get(),
                          fds[1].get()});
  ASSERT_EQ(results.size(), 7u);
  EXPECT_EQ(results[0].code, ErrorCode::kPermissionDenied) << results[0].message;
  EXPECT_EQ(results[1].code, ErrorCode::kPermissionDenied) << results[1].message;
  EXPECT_EQ(results[2].code, ErrorCode::kPermissionDenied) << results[2].message;
  EXPECT_EQ(results[3].code, ErrorCode::kInvalidHandle) << results[3].message;
  EXPECT_EQ(results[4].code, ErrorCode::kOk) << results[4].message;
  EXPECT_EQ(results[5].code, ErrorCode::kAlreadyExists) << results[5].message;
  EXPECT_EQ(results[6].code, ErrorCode::kInvalidHandle) << results[6].message;
  EXPECT_EQ(b.Stat("allocations_live"), 1u);
  EXPECT_EQ(b.Stat("reattach_refused"), 6u);

  // Exports: only of handles held, only well-formed tokens.
  ASSERT_TRUE(raw.SendMsg(RestoreExportRequest{ids[1], std::string(32, 'a'), kExportNoPidCheck, {}}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
  ASSERT_TRUE(raw.SendMsg(RestoreExportRequest{ids[0], "not-a-token", kExportNoPidCheck, {}}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);

  // A flood of forged memory: every handle refused, nothing else changes, and
  // the others are served meanwhile.
  std::vector<UniqueFd> forged;
  std::vector<int> forged_fds;
  std::vector<ReattachHandle> forged_handles;
  for (size_t i = 0; i < kMaxReattachHandles; ++i) {
    forged.push_back(ForgedMemory("membroker:client1:0123456789abcdef.0123456789abcdef"));
    forged_fds.push_back(forged.back().get());
    forged_handles.push_back({ids[1], true, false, 0});
  }
  RawClient flood(b.socket());
  flood.Hello(kFeatureReattach);
  for (int round = 0; round < 100; ++round) {
    auto r = Present(flood, forged_handles, forged_fds);
    ASSERT_EQ(r.size(), kMaxReattachHandles);
    for (const auto& one : r) {
      ASSERT_EQ(one.code, ErrorCode::kPermissionDenied);
    }
    if (round % 10 == 0) {
      EXPECT_TRUE(bystander->Ping().ok());
    }
  }
  EXPECT_EQ(b.Stat("allocations_live"), 1u);
  EXPECT_EQ(b.Stat("reattach_refused"), 6u + 100 * kMaxReattachHandles);

  // Fds that do not match the handles: a protocol violation, that client alone.
  RawClient miscounted(b.socket());
  miscounted.Hello(kFeatureReattach);
  ASSERT_TRUE(miscounted.SendMsg(ReattachRequest{{{ids[1], true, false, 0}, {ids[1], true, false, 0}}}, 0,
                                 kProtocolVersion, {&f0, 1})
                  .ok());
  EXPECT_FALSE(miscounted.Next().ok());  // closed
  EXPECT_TRUE(bystander->Ping().ok());
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

// A batch with many fds the broker does not know has their names' tags read
// on a worker thread: genuine and forged memory mixed is decided one by one,
// in order, as in a small batch; a client that hangs up before its answer
// leaves nothing behind.
TEST(Restart, ALargeBatchIsCheckedOffTheLoopAndDecidedInOrder) {
  BrokerProcess b;
  constexpr size_t kGenuine = 24, kLeft = 8;
  RawClient first(b.socket());
  first.Hello();
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> ids;
  ASSERT_NO_FATAL_FAILURE(AllocateRaw(first, kGenuine + kLeft, &ids, &fds));
  b.Kill();
  b.Restart();
  auto bystander = Client::Connect({b.socket(), "bystander"});
  ASSERT_TRUE(bystander.ok());

  // Genuine and forged in turn, the forged ones under ids not taken yet.
  std::vector<UniqueFd> forged;
  std::vector<ReattachHandle> handles;
  std::vector<int> presented;
  for (size_t i = 0; i < kGenuine; ++i) {
    forged.push_back(ForgedMemory("membroker:client1:0123456789abcdef.0123456789abcdef"));
    handles.push_back({ids[i], true, false, 0});
    presented.push_back(fds[i].get());
    handles.push_back({ids[kGenuine + i % kLeft], true, false, 0});
    presented.push_back(forged.back().get());
  }
  RawClient raw(b.socket());
  raw.Hello(kFeatureReattach);
  auto results = Present(raw, handles, presented);
  ASSERT_EQ(results.size(), 2 * kGenuine);
  for (size_t i = 0; i < kGenuine; ++i) {
    EXPECT_EQ(results[2 * i].code, ErrorCode::kOk) << i << ": " << results[2 * i].message;
    EXPECT_EQ(results[2 * i + 1].code, ErrorCode::kPermissionDenied) << i << ": " << results[2 * i + 1].message;
  }
  EXPECT_EQ(b.Stat("handles_adopted"), kGenuine);
  EXPECT_EQ(b.Stat("reattach_refused"), kGenuine);
  EXPECT_TRUE(bystander->Ping().ok());

  // The rest, with forged memory enough to go to a worker, from a client that
  // hangs up without reading: whether its answer was decided first or not,
  // the memory it presented is not kept.
  {
    RawClient gone(b.socket());
    gone.Hello(kFeatureReattach);
    std::vector<ReattachHandle> rest;
    std::vector<int> rest_fds;
    for (size_t i = 0; i < kLeft; ++i) {
      rest.push_back({ids[kGenuine + i], true, false, 0});
      rest_fds.push_back(fds[kGenuine + i].get());
      rest.push_back({ids[kGenuine + i], true, false, 0});
      rest_fds.push_back(forged[i].get());
    }
    ASSERT_TRUE(gone.SendMsg(ReattachRequest{std::move(rest)}, 0, kProtocolVersion, rest_fds).ok());
  }
  fds.resize(kGenuine);  // this process's copies of the rest go too
  EXPECT_EQ(b.WaitForStat("clients_connected", 2), 2u);
  EXPECT_EQ(b.WaitForStat("allocations_live", kGenuine), kGenuine);
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

// A kicked client is told so and stays away; a client with reattach off too.
// Memory a client maps and registers with its engine.
struct EngineMemory {
  PhysicalHandle handle;
  WholeMapping mem;
  MemHandle registered = nullptr;
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(mem.data()); }
};

EngineMemory Registered(Client& c, TransferEngine& engine) {
  EngineMemory m;
  auto h = c.MallocPhysical(kSize);
  EXPECT_TRUE(h.ok());
  m.handle = std::move(*h);
  m.mem = *MapWhole(c, m.handle);
  EXPECT_TRUE(engine.RegisterMem({m.address(), kSize}, MEM_HOST, m.registered).ok());
  return m;
}

TEST(Restart, AnEngineThatDoesNotComeBackIsNotConnectedAndConnectStartsOver) {
  BrokerProcess b;
  auto a = Client::Connect({b.socket(), "a"});
  ConnectOptions gone_options{b.socket(), "gone"};
  gone_options.reattach = false;  // its engine never comes back
  auto gone = Client::Connect(gone_options);
  ASSERT_TRUE(a.ok() && gone.ok());
  TransferEngine ea(*a), eb(*gone);
  ASSERT_TRUE(ea.Initialize("a").ok());
  ASSERT_TRUE(eb.Initialize("b").ok());
  EngineMemory ma = Registered(*a, ea), mb = Registered(*gone, eb);
  ASSERT_TRUE(ea.Connect("b").ok());
  const std::vector<TransferOpDesc> one = {{ma.address(), mb.address(), 4096}};
  ASSERT_TRUE(ea.TransferSync("b", READ, one).ok());

  b.Kill();
  b.Restart();
  ASSERT_TRUE(a->WaitForReattach(1, 20000).ok());
  // The connection is made again on first use, waiting for "b" until the
  // transfer's deadline: it is not back, so NOT_CONNECTED, as for an exited peer.
  Status st = ea.TransferSync("b", READ, one, 300);
  EXPECT_EQ(st.code(), ErrorCode::kNotConnected) << st.ToString();
  EXPECT_NE(st.message().find("not back after the broker restarted"), std::string::npos) << st.ToString();
  EXPECT_EQ(ea.TransferSync("b", READ, one, 300).code(), ErrorCode::kNotConnected);

  // A new "b" at the new broker: Connect starts over and transfers work.
  auto again = Client::Connect({b.socket(), "b-again"});
  ASSERT_TRUE(again.ok());
  TransferEngine eb2(*again);
  ASSERT_TRUE(eb2.Initialize("b").ok());
  EngineMemory mb2 = Registered(*again, eb2);
  std::memset(mb2.mem.data(), 0x5a, 4096);
  ASSERT_TRUE(ea.Connect("b").ok());
  ASSERT_TRUE(ea.TransferSync("b", READ, {{ma.address(), mb2.address(), 4096}}).ok());
  EXPECT_EQ(static_cast<uint8_t*>(ma.mem.data())[4095], 0x5a);
  // "a" itself came back whole: its registered memory is deregistered cleanly.
  EXPECT_TRUE(ea.DeregisterMem(ma.registered).ok());
}

TEST(Restart, ReattachOffStaysDisconnected) {
  BrokerProcess b;
  ConnectOptions off{b.socket(), "no-reattach"};
  off.reattach = false;
  auto c = Client::Connect(off);
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  b.Kill();
  b.Restart();
  EXPECT_EQ(c->Ping().code(), ErrorCode::kNotConnected);
  // A client that reattaches shows the new broker is there, and the old one's
  // memory was not taken back by anyone.
  auto other = Client::Connect({b.socket(), "later"});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(c->reattaches(), 0u);
}

// The wake fd an event loop polls is the same fd after a broker restart, and
// it wakes for the new broker's events: the reattach gives the new broker the
// socket's sending end, and wakes the loop once so it looks again.
TEST(Restart, TheWakeFdKeepsWorkingAcrossARestart) {
  BrokerProcess b;
  auto watcher = Client::Connect({b.socket(), "watcher"});
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE(watcher->Subscribe("w/").ok());
  auto fd = watcher->WakeFd();
  ASSERT_TRUE(fd.ok());
  watcher->DrainWakeFd();
  b.Kill();
  b.Restart();
  ASSERT_TRUE(watcher->WaitForReattach(1, 30'000).ok());
  EXPECT_EQ(*watcher->WakeFd(), *fd);
  EXPECT_TRUE(Readable(*fd, 30'000)) << "no wake after the reattach";
  watcher->DrainWakeFd();
  auto maker = Client::Connect({b.socket(), "maker"});
  ASSERT_TRUE(maker.ok());
  auto h = maker->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(maker->Publish("w/after", *h).ok());
  ASSERT_TRUE(Readable(*fd, 30'000)) << "no wake for the new broker's event";
  watcher->DrainWakeFd();
  auto got = watcher->WaitEvents(0);
  ASSERT_TRUE(got.ok());
  ASSERT_FALSE(got->events.empty());
  EXPECT_EQ(got->events.back().name, "w/after");
}

}  // namespace
}  // namespace membroker::testing

namespace membroker::testing {
namespace {

constexpr int kLoopers = 3;

// A client that runs every kind of request in a loop until told to stop; it
// reports how many failed and the longest call.
int Looper(const std::string& socket, int index, Channel& ch) {
  ConnectOptions options{socket, "looper-" + std::to_string(index)};
  auto c = Client::Connect(options);
  if (!c.ok()) return 10;
  AllocationProp prop;
  prop.exported = true;
  prop.export_flags = kExportNoPidCheck;
  auto h = c->MallocPhysical(kSize, prop);
  if (!h.ok()) return 11;
  auto m = MapWhole(*c, *h);
  if (!m.ok()) return 12;
  for (size_t i = 0; i < kSize; ++i) m->as<uint8_t>()[i] = Pattern(index, kExported, i);
  const std::string name = "loop/" + std::to_string(index);
  if (!c->Publish(name, *h).ok()) return 13;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, failed{0}, longest_us{0};
  std::string first_failure;
  std::mutex failure_mu;
  std::thread loop([&] {
    for (uint64_t n = 0; !stop; ++n) {
      const auto start = std::chrono::steady_clock::now();
      Status st;
      switch (n % 5) {
        case 0: st = c->Ping(); break;
        case 1: st = c->MallocPhysical(4096).status(); break;
        case 2: {  // a fresh export of a fresh allocation (exports die with it)
          auto x = c->MallocPhysical(4096);
          st = x.ok() ? c->ExportToShareableHandle(*x).status() : x.status();
          break;
        }
        case 3: st = c->ImportFromShareableHandle(h->export_token()).status(); break;
        case 4: st = c->Lookup(name).status(); break;
      }
      // Importing and looking up what this client holds already: ALREADY_EXISTS is the answer.
      if (!st.ok() && st.code() != ErrorCode::kAlreadyExists) {
        ++failed;
        std::lock_guard<std::mutex> lk(failure_mu);
        if (first_failure.empty()) first_failure = st.ToString();
      }
      const auto us = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
      if (us > longest_us) longest_us = us;
      if (++calls == 500) ch.Send("looping");
    }
  });
  const std::string cmd = ch.Receive();
  stop = true;
  loop.join();
  if (cmd != "stop") return 14;
  if (!c->WaitForReattach(1, 10000).ok() || c->reattaches() != 1) return 15;
  if (!HasPattern(m->data(), index, kExported)) return 16;
  std::ostringstream out;
  out << "ok " << failed << " " << longest_us << " " << first_failure;
  ch.Send(out.str());
  return ch.Receive() == "exit" ? 0 : 17;
}

TEST(TakeOver, RequestsRunAcrossTheHandOverAndNothingIsLost) {
  BrokerProcess b;
  // A persistent name whose publisher has gone: only the broker holds it.
  {
    auto p = Client::Connect({b.socket(), "publisher"});
    ASSERT_TRUE(p.ok());
    auto h = p->MallocPhysical(kSize);
    ASSERT_TRUE(h.ok());
    auto m = MapWhole(*p, *h);
    ASSERT_TRUE(m.ok());
    for (size_t i = 0; i < kSize; ++i) m->as<uint8_t>()[i] = Pattern(9, kPlain, i);
    ASSERT_TRUE(p->Publish("keep/persistent", *h, kPublishPersist).ok());
  }
  std::vector<Channel> channels(kLoopers);
  std::vector<pid_t> pids;
  for (int i = 0; i < kLoopers; ++i)
    pids.push_back(ForkChild([&, i] {
      channels[i].AsChild();
      return Looper(b.socket(), i, channels[i]);
    }));
  for (int i = 0; i < kLoopers; ++i) {
    channels[i].AsParent();
    ASSERT_EQ(channels[i].Receive(), "looping") << "looper " << i;
  }
  const pid_t old_pid = b.pid();
  EXPECT_EQ(b.TakeOver(), 0) << "the old broker must exit 0 after handing over";
  EXPECT_NE(b.pid(), old_pid);
  for (auto& ch : channels) ch.Send("stop");
  for (int i = 0; i < kLoopers; ++i) {
    std::istringstream in(channels[i].Receive());
    std::string ok, failure;
    uint64_t failed = 1, longest_us = 0;
    in >> ok >> failed >> longest_us;
    std::getline(in, failure);
    EXPECT_EQ(ok, "ok") << "looper " << i;
    EXPECT_EQ(failed, 0u) << "looper " << i << " had failed requests, the first:" << failure;
    std::printf("looper %d: longest call %.1f ms across the take-over\n", i, longest_us / 1000.0);
  }
  // What the old broker held is all here: the persistent name, the tokens.
  auto reader = Client::Connect({b.socket(), "reader"});
  ASSERT_TRUE(reader.ok());
  auto kept = reader->Lookup("keep/persistent");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  auto m = MapWhole(*reader, *kept);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(HasPattern(m->data(), 9, kPlain));
  auto names = reader->ListNames("loop/");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), size_t{kLoopers});
  EXPECT_EQ(b.Stat("clients_reattached"), uint64_t{kLoopers});
  EXPECT_EQ(b.Stat("reattach_refused"), 0u);
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
  for (auto& ch : channels) ch.Send("exit");
  for (int i = 0; i < kLoopers; ++i) EXPECT_EQ(WaitChild(pids[i]), 0) << "looper " << i;
  EXPECT_EQ(b.WaitForStat("clients_connected", 1), 1u);
  // Left: the persistent object (its own reference) and the reader's import of it.
  EXPECT_EQ(b.WaitForStat("allocations_live", 1), 1u);
  ASSERT_TRUE(reader->Unpublish("keep/persistent").ok());
  *m = WholeMapping();
  kept = PhysicalHandle();
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
}

TEST(TakeOver, WhatNobodyReattachesToGoesAfterTheGrace) {
  BrokerProcess b({"--reattach-grace-ms", "300"});
  ConnectOptions off{b.socket(), "stays-away"};
  off.reattach = false;
  auto c = Client::Connect(off);
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(c->Publish("gone/soon", *h).ok());
  EXPECT_EQ(b.TakeOver(), 0);
  // Kept for the grace: the name and its memory are there...
  auto other = Client::Connect({b.socket(), "other"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(b.Stat("named_objects"), 1u);
  // ...then, with nobody back for them, released.
  EXPECT_EQ(b.WaitForStat("named_objects", 0), 0u);
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(c->Ping().code(), ErrorCode::kNotConnected);
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

// A child forked after Connect that drops its copy of the parent's Client
// stops nothing of the parent's: its watcher still reattaches the parent.
TEST(Restart, AForkedChildDroppingItsCopyLeavesTheParentsClientAlone) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "parent"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  pid_t child = ForkChild([&] {
    *h = PhysicalHandle();
    *c = Client();  // the child's copy of the core goes here
    return 0;
  });
  ASSERT_EQ(WaitChild(child), 0);
  EXPECT_TRUE(c->Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 1u);  // the child's copy freed nothing
  b.Kill();
  b.Restart();
  ASSERT_TRUE(c->WaitForReattach(1, 10000).ok());
  EXPECT_TRUE(c->Ping().ok());
  EXPECT_EQ(b.Stat("handles_adopted"), 1u);
}

TEST(TakeOver, WithoutABrokerToTakeOverItFailsClearly) {
  const RunResult r = RunBrokerExpectingExit({"--socket", "/tmp/membroker-nobody-here.sock", "--take-over"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no broker to take over"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace membroker::testing
