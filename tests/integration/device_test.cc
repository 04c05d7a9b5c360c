// Device memory end to end (ctest label "device"): the real broker and real
// client processes, the CUDA driver double where no GPU is (tests/cuda_double,
// first on LD_LIBRARY_PATH) and the real driver where scripts/device-check
// runs these same tests. Device bytes are read and written only through the
// driver's copies. Without a driver, device requests say why (UNSUPPORTED).
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <filesystem>
#include <string>
#include <vector>

#include "broker_process.h"
#include "net_engines.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"
#include "membroker/ipc/cuda_driver.h"
#ifdef MEMBROKER_HAVE_CUDA_HEADERS
#include "membroker/ipc/cuda_api.h"
#include "../cuda_double/cuda_double.h"
#endif

namespace membroker::testing {
namespace {

AllocationProp OnDevice(int id) {
  AllocationProp p;
  p.location = MemLocation{MemLocation::kDevice, id};
  return p;
}

TEST(Device, RequestsSayWhyTheyCannotBeServed) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "device"});
  ASSERT_TRUE(c.ok());
  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  std::printf("CUDA here: %s (%d devices, driver %d)\n", driver.Available().ToString().c_str(), driver.device_count(),
              driver.driver_version());
  if (!driver.Available().ok()) {
    // The broker's reason is the driver's: no libcuda, no device, no headers.
    auto h = c->MallocPhysical(2 << 20, OnDevice(0));
    EXPECT_EQ(h.code(), ErrorCode::kUnsupported);
    EXPECT_NE(h.status().message().find("device memory is unavailable here"), std::string::npos)
        << h.status().ToString();
    auto g = c->GetAllocationGranularity(OnDevice(0), GranularityOption::kMinimum);
    EXPECT_EQ(g.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(g.status().message(), driver.Available().message());
    EXPECT_EQ(c->ReserveMemAddress(2 << 20, 0, nullptr, kReserveDevice).code(), ErrorCode::kUnsupported);
  }
  // A device this machine does not have is named.
  const int missing = driver.device_count() + 3;
  auto none = c->MallocPhysical(4096, OnDevice(missing));
  EXPECT_EQ(none.code(), ErrorCode::kUnsupported);
  if (driver.Available().ok()) {
    EXPECT_NE(none.status().message().find("no CUDA device " + std::to_string(missing)), std::string::npos);
  }
  EXPECT_EQ(c->MallocPhysical(4096, OnDevice(-5)).code(), ErrorCode::kParamInvalid);
  AllocationProp pinned = OnDevice(0);
  pinned.pinned = true;
  if (driver.Available().ok()) {
    EXPECT_EQ(c->MallocPhysical(4096, pinned).code(), ErrorCode::kParamInvalid);
  }
  // Nothing was made, nothing is charged, and host memory works as before.
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("device_bytes"), 0u);
  EXPECT_TRUE(c->MallocPhysical(4096).ok());
  EXPECT_TRUE(c->Ping().ok());
}

#ifdef MEMBROKER_HAVE_CUDA_HEADERS

const ipc::CudaDriver::Api* DriverOrNull() {
  const ipc::CudaDriver& d = ipc::CudaDriver::Get();
  return d.Available().ok() ? d.api() : nullptr;
}

// The double's controls where it is loaded; null under a real driver.
template <typename Fn>
Fn DoubleControl(const char* name) {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<Fn>(::dlsym(lib, name)) : nullptr;
}
bool HaveDouble() { return DoubleControl<void*>("mbfake_cuda_get_counters") != nullptr; }

// Fds to the double's device memory that a process holds (the broker's
// exported fds): a leak or an early free shows here.
size_t DeviceFdsOf(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code lec;
    if (std::filesystem::read_symlink(e.path(), lec).string().starts_with("/memfd:cuda-double")) ++n;
  }
  return n;
}

unsigned char Pattern(size_t i, unsigned seed) { return static_cast<unsigned char>(i * 131 + seed); }

class DeviceMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = DriverOrNull();
    if (cu_ == nullptr) GTEST_SKIP() << ipc::CudaDriver::Get().Available().ToString();
    CUcontext ctx = nullptr;
    ASSERT_EQ(cu_->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(cu_->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    auto g = ipc::CudaDriver::Get().Granularity(0, false);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    g_ = *g;
  }
  void TearDown() override {
    if (cu_ != nullptr) (void)cu_->cuDevicePrimaryCtxRelease(0);
  }

  void Fill(const Mapping& m, unsigned seed) {
    std::vector<unsigned char> bytes(m.size());
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = Pattern(i, seed);
    ASSERT_EQ(cu_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(m.data()), bytes.data(), bytes.size()), CUDA_SUCCESS);
  }
  // The index of the first byte that is not Pattern(seed), or -1.
  long FirstWrongByte(const Mapping& m, unsigned seed) {
    std::vector<unsigned char> bytes(m.size());
    if (cu_->cuMemcpyDtoH(bytes.data(), reinterpret_cast<CUdeviceptr>(m.data()), bytes.size()) != CUDA_SUCCESS)
      return 0;
    for (size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != Pattern(i, seed)) return static_cast<long>(i);
    return -1;
  }

  const ipc::CudaDriver::Api* cu_ = nullptr;
  size_t g_ = 0;
};

// A peer process (device_peer) with a pipe to its stdin and one from its stdout.
struct Peer {
  pid_t pid = -1;
  int in = -1;  // closing it ends a "hold"
  int out = -1;

  Peer(const std::string& socket, const std::string& token, unsigned seed, const char* mode) {
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) std::abort();
    std::string path = BinaryPath("device_peer"), seed_text = std::to_string(seed);
    std::fflush(nullptr);
    pid = ::fork();
    if (pid == 0) {
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      ::execl(path.c_str(), path.c_str(), socket.c_str(), token.c_str(), seed_text.c_str(), mode, nullptr);
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    in = to[1];
    out = from[0];
  }
  ~Peer() {
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      (void)WaitChild(pid);
    }
  }
  // Its next line, or "" at its end or after 60 s (a bound, not a timing).
  std::string Line() {
    std::string line;
    char ch;
    while (true) {
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, 60000) != 1 || ::read(out, &ch, 1) != 1 || ch == '\n') return line;
      line += ch;
    }
  }
  int Wait() {
    int code = WaitChild(pid);
    pid = -1;
    return code;
  }
};

TEST_F(DeviceMemory, BytesCrossProcessesThroughTheBroker) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "device"});
  ASSERT_TRUE(c.ok());
  AllocationProp prop = OnDevice(0);
  prop.exported = true;
  prop.export_flags = kExportNoPidCheck;
  auto h = c->MallocPhysical(2 * g_, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->device(), 0);
  EXPECT_EQ(h->size(), 2 * g_);
  EXPECT_EQ(b.Stat("device_bytes"), 2 * g_);
  auto r = c->ReserveMemAddress(h->size(), 0, nullptr, kReserveDevice);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Device memory maps only into device reservations, and host memory never there.
  auto host = c->MallocPhysical(g_);
  auto host_range = c->ReserveMemAddress(h->size());
  ASSERT_TRUE(host.ok() && host_range.ok());
  EXPECT_EQ(c->MapMem(host_range->base(), h->size(), 0, *h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c->MapMem(r->base(), g_, 0, *host).code(), ErrorCode::kParamInvalid);

  auto m = c->MapMem(r->base(), h->size(), 0, *h);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Fill(*m, 7);
  {
    Peer peer(b.socket(), h->export_token(), 7, "check");  // checks 7, writes 8
    EXPECT_EQ(peer.Line(), "OK");
    EXPECT_EQ(peer.Wait(), 0);
  }
  EXPECT_EQ(FirstWrongByte(*m, 8), -1);
  // A read-only export is mapped read-only by the importer's library.
  auto ro = c->ExportToShareableHandle(*h, kExportNoPidCheck | kExportReadOnly);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  {
    Peer peer(b.socket(), *ro, 8, "readonly");
    EXPECT_EQ(peer.Line(), "OK");
    EXPECT_EQ(peer.Wait(), 0);
  }
  // Access changes go to the driver.
  EXPECT_TRUE(c->MemSetAccess(m->data(), m->size(), Access::kRead).ok());
  if (HaveDouble()) {
    std::vector<unsigned char> one(16, 1);
    EXPECT_NE(cu_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(m->data()), one.data(), one.size()), CUDA_SUCCESS);
  }
  EXPECT_TRUE(c->MemSetAccess(m->data(), m->size(), Access::kReadWrite).ok());
  Fill(*m, 9);
  EXPECT_EQ(FirstWrongByte(*m, 9), -1);

  ASSERT_TRUE(c->UnmapMem(*m).ok());
  ASSERT_TRUE(c->ReleaseMemAddress(*r).ok());
  ASSERT_TRUE(c->FreePhysical(*h).ok());
  EXPECT_EQ(b.WaitForStat("device_bytes", 0), 0u);
  if (HaveDouble()) {
    EXPECT_EQ(DeviceFdsOf(b.pid()), 0u);
  }
}

TEST_F(DeviceMemory, ASigkilledHolderLeavesNothingBehind) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "creator"});
  ASSERT_TRUE(c.ok());
  AllocationProp prop = OnDevice(0);
  prop.exported = true;
  prop.export_flags = kExportNoPidCheck;
  auto h = c->MallocPhysical(g_, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto r = c->ReserveMemAddress(h->size(), 0, nullptr, kReserveDevice);
  auto m = c->MapMem(r->base(), h->size(), 0, *h);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Fill(*m, 3);
  Peer peer(b.socket(), h->export_token(), 3, "hold");
  ASSERT_EQ(peer.Line(), "HOLDING");
  // The creator lets go; the holder's import keeps the memory.
  ASSERT_TRUE(c->UnmapMem(*m).ok());
  ASSERT_TRUE(c->ReleaseMemAddress(*r).ok());
  ASSERT_TRUE(c->FreePhysical(*h).ok());
  EXPECT_EQ(b.Stat("device_bytes"), g_);
  ::kill(peer.pid, SIGKILL);
  EXPECT_EQ(peer.Wait(), 128 + SIGKILL);
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(b.Stat("device_bytes"), 0u);
  if (HaveDouble()) {
    EXPECT_EQ(DeviceFdsOf(b.pid()), 0u);
  }
}

TEST_F(DeviceMemory, BudgetsAndQuotasRefuseBeforeAnythingIsMade) {
  BrokerProcess b(
      {"--max-device-bytes", "0=" + std::to_string(3 * g_), "--quota-client", "device=" + std::to_string(2 * g_)});
  auto c1 = Client::Connect({b.socket(), "one"});
  auto c2 = Client::Connect({b.socket(), "two"});
  ASSERT_TRUE(c1.ok() && c2.ok());
  auto a = c1->MallocPhysical(g_, OnDevice(0));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto over_quota = c1->MallocPhysical(2 * g_, OnDevice(0));
  EXPECT_EQ(over_quota.code(), ErrorCode::kQuotaExceeded) << over_quota.status().ToString();
  EXPECT_NE(over_quota.status().message().find("device bytes"), std::string::npos);
  auto b2 = c2->MallocPhysical(2 * g_, OnDevice(0));
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  auto over_budget = c2->MallocPhysical(g_, OnDevice(0));
  EXPECT_EQ(over_budget.code(), ErrorCode::kResourceExhausted) << over_budget.status().ToString();
  EXPECT_NE(over_budget.status().message().find("device 0 budget"), std::string::npos);
  EXPECT_EQ(b.Stat("device_bytes"), 3 * g_);
  EXPECT_EQ(b.Stat("allocations_live"), 2u);
  // Host memory does not count against a device's budget.
  EXPECT_TRUE(c1->MallocPhysical(3 * g_).ok());
}

TEST_F(DeviceMemory, DriverFaultsAreClearErrorsThatLeaveNothing) {
  if (!HaveDouble()) GTEST_SKIP() << "a real driver: faults cannot be injected";
  // The broker's driver: its first cuMemCreate runs out of memory, its second
  // export fails.
  ::setenv("MBFAKE_CUDA_FAIL", "cuMemCreate:1:2,cuMemExportToShareableHandle:2:1", 1);
  BrokerProcess b;
  ::unsetenv("MBFAKE_CUDA_FAIL");
  auto c = Client::Connect({b.socket(), "faults"});
  ASSERT_TRUE(c.ok());
  auto oom = c->MallocPhysical(g_, OnDevice(0));
  EXPECT_EQ(oom.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(oom.status().message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << oom.status().ToString();
  auto ok = c->MallocPhysical(g_, OnDevice(0));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto bad_export = c->MallocPhysical(g_, OnDevice(0));
  EXPECT_EQ(bad_export.code(), ErrorCode::kInternal);
  EXPECT_NE(bad_export.status().message().find("cuMemExportToShareableHandle"), std::string::npos)
      << bad_export.status().ToString();
  EXPECT_EQ(b.Stat("device_bytes"), g_);
  EXPECT_EQ(DeviceFdsOf(b.pid()), 1u);

  // This process's driver: a failed map leaves nothing mapped, then works.
  auto fail = DoubleControl<void (*)(const char*, int, int)>("mbfake_cuda_fail");
  auto r = c->ReserveMemAddress(g_, 0, nullptr, kReserveDevice);
  ASSERT_TRUE(r.ok());
  fail("cuMemSetAccess", 1, CUDA_ERROR_INVALID_VALUE);
  auto m = c->MapMem(r->base(), g_, 0, *ok);
  EXPECT_EQ(m.code(), ErrorCode::kInternal);
  EXPECT_NE(m.status().message().find("cuMemSetAccess"), std::string::npos) << m.status().ToString();
  m = c->MapMem(r->base(), g_, 0, *ok);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(c->UnmapMem(*m).ok());
  ASSERT_TRUE(c->ReleaseMemAddress(*r).ok());
  ASSERT_TRUE(c->FreePhysical(*ok).ok());
  EXPECT_EQ(b.WaitForStat("device_bytes", 0), 0u);
  EXPECT_EQ(DeviceFdsOf(b.pid()), 0u);
}

// Pinned host memory is registered with the driver where the program has a
// current context (cuMemHostRegister), and never makes one of its own.
TEST_F(DeviceMemory, PinnedHostMemoryIsRegisteredWithTheDriverOfACudaProgram) {
  auto counters = DoubleControl<void (*)(mbfake_cuda_counters*)>("mbfake_cuda_get_counters");
  if (counters == nullptr) GTEST_SKIP() << "a real driver: its registrations cannot be counted";
  auto registered = [&] {
    mbfake_cuda_counters n{};
    counters(&n);
    return n.host_registered;
  };
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "pinned"});
  ASSERT_TRUE(c.ok());
  auto p = c->MallocHost(1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(registered(), 1u);
  void* own = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(own, MAP_FAILED);
  ASSERT_TRUE(c->HostRegister(own, 1 << 20).ok());
  EXPECT_EQ(registered(), 2u);
  // A device copy from it, as a CUDA program makes one.
  auto h = c->MallocPhysical(g_, OnDevice(0));
  auto r = c->ReserveMemAddress(g_, 0, nullptr, kReserveDevice);
  auto m = c->MapMem(r->base(), g_, 0, *h);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::memset(own, 0x3c, 4096);
  ASSERT_EQ(cu_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(m->data()), own, 4096), CUDA_SUCCESS);
  ASSERT_TRUE(c->HostUnregister(own).ok());
  ASSERT_TRUE(c->FreeHost(*p).ok());
  EXPECT_EQ(registered(), 0u);
  // A thread with no current context: pinned (mlock) only.
  std::thread([&] {
    auto q = c->MallocHost(1 << 20);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(registered(), 0u);
    EXPECT_TRUE(c->FreeHost(*q).ok());
  }).join();
  EXPECT_EQ(b.Stat("pinned_bytes"), 0u);
  ::munmap(own, 1 << 20);
}

// The transfer engine does not move device memory yet, and says so.
// The transfer engine between two engines of this host with device memory on
// either side (MEM_DEVICE): device to host, host to device and device to
// device, READ and WRITE, at offsets; from a thread with no current context
// too (the engine borrows the device's primary context). Every byte checked
// with the driver's copies; nothing left mapped or held after.
TEST_F(DeviceMemory, TheTransferEngineMovesDeviceMemoryOnThisHost) {
  BrokerProcess b;
  auto a = Client::Connect({b.socket(), "prefill"});
  auto d = Client::Connect({b.socket(), "decode"});
  ASSERT_TRUE(a.ok() && d.ok());
  const size_t n = 2 * g_;
  // Memory, its range and its mapping, alive together for the whole test.
  struct Held {
    PhysicalHandle handle;
    Reservation range;
    Mapping map;
    const Mapping* operator->() const { return &map; }
    const Mapping& operator*() const { return map; }
  };
  auto mapped = [&](Client& c, bool device) -> Result<Held> {
    Held held;
    MB_ASSIGN_OR_RETURN(held.handle, device ? c.MallocPhysical(n, OnDevice(0)) : c.MallocPhysical(n));
    MB_ASSIGN_OR_RETURN(held.range, c.ReserveMemAddress(n, 0, nullptr, device ? kReserveDevice : 0));
    MB_ASSIGN_OR_RETURN(held.map, c.MapMem(held.range.base(), n, 0, held.handle));
    return held;
  };
  auto a_dev = mapped(*a, true);
  auto d_dev = mapped(*d, true);
  auto d_host = mapped(*d, false);
  ASSERT_TRUE(a_dev.ok() && d_dev.ok() && d_host.ok());
  auto at = [](const Result<Held>& m, size_t off = 0) { return reinterpret_cast<uintptr_t>((*m)->data()) + off; };
  auto host_holds = [&](unsigned seed) {
    const auto* p = static_cast<const unsigned char*>((*d_host)->data());
    for (size_t i = 0; i < n; ++i)
      if (p[i] != Pattern(i, seed)) return static_cast<long>(i);
    return -1L;
  };
  auto fill_host = [&](unsigned seed) {
    auto* p = static_cast<unsigned char*>((*d_host)->data());
    for (size_t i = 0; i < n; ++i) p[i] = Pattern(i, seed);
  };

  TransferEngine ea(*a), ed(*d);
  ASSERT_TRUE(ea.Initialize("dev-prefill").ok());
  ASSERT_TRUE(ed.Initialize("dev-decode").ok());
  MemHandle ra{}, rd{}, rh{};
  // Device memory is MEM_DEVICE, host memory MEM_HOST: each refused as the other.
  Status as_host = ea.RegisterMem({at(a_dev), n}, MEM_HOST, ra);
  EXPECT_EQ(as_host.code(), ErrorCode::kParamInvalid);
  EXPECT_NE(as_host.message().find("register it as MEM_DEVICE"), std::string::npos) << as_host.ToString();
  Status as_device = ed.RegisterMem({at(d_host), n}, MEM_DEVICE, rh);
  EXPECT_EQ(as_device.code(), ErrorCode::kParamInvalid);
  EXPECT_NE(as_device.message().find("is not device memory"), std::string::npos) << as_device.ToString();
  ASSERT_TRUE(ea.RegisterMem({at(a_dev), n}, MEM_DEVICE, ra).ok());
  ASSERT_TRUE(ed.RegisterMem({at(d_dev), n}, MEM_DEVICE, rd).ok());
  ASSERT_TRUE(ed.RegisterMem({at(d_host), n}, MEM_HOST, rh).ok());
  ASSERT_TRUE(ed.Connect("dev-prefill", 10000).ok());
  ASSERT_TRUE(ea.Connect("dev-decode", 10000).ok());

  // Remote device -> local host, and back.
  Fill(**a_dev, 3);
  ASSERT_TRUE(ed.TransferSync("dev-prefill", READ, {{at(d_host), at(a_dev), n}}, 10000).ok());
  EXPECT_EQ(host_holds(3), -1);
  fill_host(4);
  ASSERT_TRUE(ed.TransferSync("dev-prefill", WRITE, {{at(d_host), at(a_dev), n}}, 10000).ok());
  EXPECT_EQ(FirstWrongByte(**a_dev, 4), -1);
  // Remote device -> local device, and local device -> remote device.
  ASSERT_TRUE(ed.TransferSync("dev-prefill", READ, {{at(d_dev), at(a_dev), n}}, 10000).ok());
  EXPECT_EQ(FirstWrongByte(**d_dev, 4), -1);
  Fill(**d_dev, 5);
  ASSERT_TRUE(ed.TransferSync("dev-prefill", WRITE, {{at(d_dev), at(a_dev), n}}, 10000).ok());
  EXPECT_EQ(FirstWrongByte(**a_dev, 5), -1);
  // Remote host -> local device (the other engine's host memory), in pieces at
  // offsets, from a thread that has no current context.
  fill_host(6);
  std::thread([&] {
    Status st = ea.TransferSync("dev-decode", READ,
                                {{at(a_dev), at(d_host), 4096}, {at(a_dev, 4096), at(d_host, 4096), n - 4096}}, 10000);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }).join();
  EXPECT_EQ(FirstWrongByte(**a_dev, 6), -1);
  // A range past the registration is refused, and nothing moves.
  EXPECT_EQ(ed.TransferSync("dev-prefill", READ, {{at(d_dev), at(a_dev, g_), n}}, 10000).code(),
            ErrorCode::kParamInvalid);

  ASSERT_TRUE(ed.Disconnect("dev-prefill", 10000).ok());
  ASSERT_TRUE(ea.Disconnect("dev-decode", 10000).ok());
  ASSERT_TRUE(ea.DeregisterMem(ra).ok());
  ASSERT_TRUE(ed.DeregisterMem(rd).ok());
  ASSERT_TRUE(ed.DeregisterMem(rh).ok());
  ea.Finalize();
  ed.Finalize();
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

// Device memory to and from an engine reached over the network (at another
// broker, as another host's is): this engine's device ranges go through host
// staging buffers (transfer/staged_transfer.h), in batches of 8 MiB, so 20 MiB
// take three; many small descriptors gather into one batch; host and device
// descriptors mix in one call. The peer's device memory is offered too, and its
// transport copies each piece with its driver: device to device across hosts.
// A bad descriptor anywhere in a staged transfer moves nothing.
TEST_F(DeviceMemory, DeviceMemoryCrossesHostsThroughHostStaging) {
  BrokerProcess here, there;
  auto a = Client::Connect({here.socket(), "listener"});
  auto r = Client::Connect({there.socket(), "remote"});
  ASSERT_TRUE(a.ok() && r.ok());
  const std::string secret = SecretFile(here.dir(), "device-secret");
  TransferEngine ea(*a), er(*r);
  const std::string address = ListenOnLoopback(ea, "dev-listener", secret);
  if (address.empty()) {
    Status st = TransferEngine(*a).Initialize("probe", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret}});
    MB_UCX_OR_SKIP(st);
    FAIL() << st.ToString();
  }
  ASSERT_TRUE(er.Initialize("dev-remote", {{"secret_file", secret}}).ok());
  const size_t size = 10 * g_;  // 20 MiB on a 2 MiB granularity: three batches
  auto device_range = [&](Client& c, Reservation* range, Mapping* map, PhysicalHandle* h) -> Status {
    MB_ASSIGN_OR_RETURN(*h, c.MallocPhysical(size, OnDevice(0)));
    MB_ASSIGN_OR_RETURN(*range, c.ReserveMemAddress(size, 0, nullptr, kReserveDevice));
    MB_ASSIGN_OR_RETURN(*map, c.MapMem(range->base(), size, 0, *h));
    return Status::Ok();
  };
  PhysicalHandle ah, rh;
  Reservation ar, rr;
  Mapping am, rm;
  ASSERT_TRUE(device_range(*a, &ar, &am, &ah).ok());
  ASSERT_TRUE(device_range(*r, &rr, &rm, &rh).ok());
  const auto a_dev = reinterpret_cast<uintptr_t>(am.data()), r_dev = reinterpret_cast<uintptr_t>(rm.data());
  MemHandle a_reg{}, r_reg{};
  ASSERT_TRUE(ea.RegisterMem({a_dev, size}, MEM_DEVICE, a_reg, "dev").ok());
  ASSERT_TRUE(er.RegisterMem({r_dev, size}, MEM_DEVICE, r_reg).ok());
  Memory a_host = Register(*a, ea, size), r_host = Register(*r, er, 1 << 16);
  auto host_wrong = [&](const Memory& m, size_t from, size_t len, unsigned seed, size_t pattern_from) -> long {
    for (size_t i = 0; i < len; ++i)
      if (static_cast<unsigned char>(m.data()[from + i]) != Pattern(pattern_from + i, seed)) return static_cast<long>(i);
    return -1;
  };

  ASSERT_TRUE(er.Connect(address, 10000).ok());
  ConnectionInfo info;
  ASSERT_TRUE(er.GetConnectionInfo(address, info).ok());
  EXPECT_EQ(info.path, "ucx+staged");  // er has device memory registered
  std::vector<RegionInfo> regions;
  ASSERT_TRUE(er.GetRemoteRegions(address, regions, 10000).ok());
  EXPECT_TRUE(std::any_of(regions.begin(), regions.end(), [](const RegionInfo& x) { return x.name == "dev"; }))
      << "the device range was not offered over the network";

  // One descriptor of 20 MiB, device to the other host's host memory, and back.
  Fill(rm, 11);
  ASSERT_TRUE(er.TransferSync(address, WRITE, {{r_dev, a_host.addr(), size}}, 30000).ok());
  EXPECT_EQ(host_wrong(a_host, 0, size, 11, 0), -1);
  for (size_t i = 0; i < size; ++i) a_host.data()[i] = static_cast<char>(Pattern(i, 12));
  ASSERT_TRUE(er.TransferSync(address, READ, {{r_dev, a_host.addr(), size}}, 30000).ok());
  EXPECT_EQ(FirstWrongByte(rm, 12), -1);

  // 64 scattered 4 KiB descriptors (one batch), written then read back elsewhere.
  Fill(rm, 13);
  std::vector<TransferOpDesc> blocks;
  for (size_t k = 0; k < 64; ++k)
    blocks.push_back({r_dev + (k * 37 % 64) * 8 * 4096, a_host.addr() + k * 4096, 4096});
  ASSERT_TRUE(er.TransferSync(address, WRITE, blocks, 30000).ok());
  for (size_t k = 0; k < 64; ++k)
    ASSERT_EQ(host_wrong(a_host, k * 4096, 4096, 13, (k * 37 % 64) * 8 * 4096), -1) << "block " << k;
  Fill(rm, 14);
  ASSERT_TRUE(er.TransferSync(address, READ, blocks, 30000).ok());
  EXPECT_EQ(FirstWrongByte(rm, 13) >= 0, true);  // the blocks came back over the new pattern
  {
    std::vector<unsigned char> got(4096);
    for (size_t k = 0; k < 64; ++k) {
      const size_t at = (k * 37 % 64) * 8 * 4096;
      ASSERT_EQ(cu_->cuMemcpyDtoH(got.data(), r_dev + at, got.size()), CUDA_SUCCESS);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], Pattern(at + i, 13)) << "block " << k;
    }
  }

  // Host and device descriptors in one call.
  Fill(rm, 15);
  for (size_t i = 0; i < 4096; ++i) r_host.data()[i] = static_cast<char>(Pattern(i, 16));
  ASSERT_TRUE(er.TransferSync(address, WRITE, {{r_host.addr(), a_host.addr(), 4096}, {r_dev, a_host.addr() + 4096, 4096}},
                              30000)
                  .ok());
  EXPECT_EQ(host_wrong(a_host, 0, 4096, 16, 0), -1);
  EXPECT_EQ(host_wrong(a_host, 4096, 4096, 15, 0), -1);

  // The other host's device memory: from host memory, from device memory (both
  // sides staged), back into device memory, and a batch of small blocks.
  for (size_t i = 0; i < 4096; ++i) r_host.data()[i] = static_cast<char>(Pattern(i, 17));
  ASSERT_TRUE(er.TransferSync(address, WRITE, {{r_host.addr(), a_dev + g_, 4096}}, 30000).ok());
  {
    std::vector<unsigned char> got(4096);
    ASSERT_EQ(cu_->cuMemcpyDtoH(got.data(), a_dev + g_, got.size()), CUDA_SUCCESS);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], Pattern(i, 17));
  }
  Fill(rm, 18);
  ASSERT_TRUE(er.TransferSync(address, WRITE, {{r_dev, a_dev, size}}, 30000).ok());  // device to device
  EXPECT_EQ(FirstWrongByte(am, 18), -1);
  Fill(am, 19);
  ASSERT_TRUE(er.TransferSync(address, READ, {{r_dev, a_dev, size}}, 30000).ok());
  EXPECT_EQ(FirstWrongByte(rm, 19), -1);
  std::memset(r_host.data(), 0, 1 << 16);
  std::vector<TransferOpDesc> far_blocks;
  for (size_t k = 0; k < 16; ++k) far_blocks.push_back({r_host.addr() + k * 4096, a_dev + k * 3 * 4096, 4096});
  ASSERT_TRUE(er.TransferSync(address, READ, far_blocks, 30000).ok());  // one batch, gathered from device memory
  for (size_t k = 0; k < 16; ++k)
    ASSERT_EQ(host_wrong(r_host, k * 4096, 4096, 19, k * 3 * 4096), -1) << "block " << k;

  // A bad descriptor after a good one moves nothing (the good one's
  // destination keeps its bytes).
  std::memset(a_host.data(), 0x5a, 4096);
  Status bad = er.TransferSync(address, WRITE, {{r_dev, a_host.addr(), 4096}, {r_dev + 4096, a_dev + size, 4096}},
                               10000);
  EXPECT_EQ(bad.code(), ErrorCode::kParamInvalid);
  EXPECT_NE(bad.message().find("descriptor 1"), std::string::npos) << bad.ToString();
  EXPECT_EQ(a_host.data()[0], 0x5a);
  EXPECT_EQ(a_host.data()[4095], 0x5a);
  er.Finalize();
  ea.Finalize();
}

// A take-over keeps host memory; device memory stays with the processes that
// hold it (their driver handles and fds) and the new broker does not know it:
// the client's reattach reports it refused, and its mapping works on.
TEST_F(DeviceMemory, ARestartLeavesDeviceMemoryWithItsHolders) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "holder"});
  ASSERT_TRUE(c.ok());
  auto host = c->MallocPhysical(4096);
  AllocationProp prop = OnDevice(0);
  prop.exported = true;
  auto h = c->MallocPhysical(g_, prop);
  ASSERT_TRUE(host.ok() && h.ok()) << h.status().ToString();
  auto r = c->ReserveMemAddress(h->size(), 0, nullptr, kReserveDevice);
  auto m = c->MapMem(r->base(), h->size(), 0, *h);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Fill(*m, 5);
  ASSERT_TRUE(c->Publish("dev/tensor", *h).ok());

  EXPECT_EQ(b.TakeOver(), 0);
  ASSERT_TRUE(c->WaitForReattach(1, 10000).ok());
  const ReattachReport report = c->last_reattach();
  EXPECT_EQ(report.handles, 1u);          // the host allocation
  EXPECT_EQ(report.handles_refused, 1u);  // the device one
  EXPECT_EQ(b.Stat("allocations_live"), 1u);
  EXPECT_EQ(b.Stat("device_bytes"), 0u);
  EXPECT_EQ(b.Stat("named_objects"), 0u);
  EXPECT_EQ(FirstWrongByte(*m, 5), -1);
  if (HaveDouble()) {
    EXPECT_EQ(DeviceFdsOf(b.pid()), 0u);
  }
  ASSERT_TRUE(c->UnmapMem(*m).ok());
  ASSERT_TRUE(c->ReleaseMemAddress(*r).ok());
  EXPECT_EQ(b.Admin("check"), "tables: consistent\n");
}

#endif  // MEMBROKER_HAVE_CUDA_HEADERS

}  // namespace
}  // namespace membroker::testing
