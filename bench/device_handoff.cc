// Producer -> consumer hand-off of one device buffer between two processes,
// measured side by side for membroker and the two ways CUDA programs do it
// without a broker:
//   membroker  the producer's buffer comes from the broker (MallocPhysical on
//              the device, exported: its token comes with it); the consumer
//              imports the token, reserves device addresses and maps it (the
//              broker is on the control path)
//   vmm+fd     the floor: cuMemCreate with POSIX fd handles, the fd passed with
//              SCM_RIGHTS, cuMemImportFromShareableHandle, cuMemAddressReserve,
//              cuMemMap, cuMemSetAccess in a bare pair of processes
//   cuda-ipc   legacy CUDA IPC: cuMemAlloc, cuIpcGetMemHandle, the 64-byte
//              handle sent, cuIpcOpenMemHandle
// The clock starts when the producer holds a filled buffer and stops when the
// consumer can use it: mapped, accessible, and its first and last bytes read
// back with cuMemcpyDtoH and checked (a stale or wrong mapping fails the run).
// What follows (unmapping, closing, freeing) is off the clock, and so is what
// precedes: making the buffer and its fd (membroker's broker exports what it
// creates; the floor exports as it creates). Each method's line gives the
// medians of its steps too: the offer's way to the consumer, the import, the
// map (reserve, map, access), the check. Both processes
// are fresh executions (a forked child cannot use a driver its parent
// initialised); CLOCK_MONOTONIC is one clock for both. The methods alternate
// within each round, so a drifting machine weighs on all three alike.
//   bench_device_handoff --broker MEMBROKERD [--sizes 4K,1M,64M,1G] [--rounds N] [--quick]
// Prints one JSON object per (method, size), then one per size with the ratios.
// Exits non-zero on any error (a driver call, a wrong byte).
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "broker_launch.h"
#include "membroker/client.h"
#include "membroker/ipc/cuda_api.h"
#include "payload.h"
#include "raw_fd.h"

using namespace membroker;
using bench::NowNs;

namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_device_handoff: %s\n", why.c_str());
  std::exit(1);
}

// The driver: membroker's loader for the VMM calls, and the legacy calls
// (not part of membroker's device path) looked up the same way.
struct Driver {
  const ipc::CudaDriver::Api* vmm = nullptr;
  decltype(&::cuMemAlloc) MemAlloc = nullptr;
  decltype(&::cuMemFree) MemFree = nullptr;
  decltype(&::cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
  decltype(&::cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
};
Driver g_cu;

void Check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) Die(std::string(what) + ": " + ipc::CudaErrorText(*g_cu.vmm, rc));
}

void LoadDriver() {
  const ipc::CudaDriver& d = ipc::CudaDriver::Get();
  if (!d.Available().ok()) Die(d.Available().ToString());
  g_cu.vmm = d.api();
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get = lib ? reinterpret_cast<GetProc>(::dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
  if (get == nullptr) Die("no cuGetProcAddress_v2");
  auto load = [&](const char* name, auto** fn) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found{};
    if (get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || p == nullptr)
      Die(std::string("the driver has no ") + name);
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  load("cuMemAlloc", &g_cu.MemAlloc);
  load("cuMemFree", &g_cu.MemFree);
  load("cuIpcGetMemHandle", &g_cu.IpcGetMemHandle);
  load("cuIpcOpenMemHandle", &g_cu.IpcOpenMemHandle);
  load("cuIpcCloseMemHandle", &g_cu.IpcCloseMemHandle);
  load("cuCtxSynchronize", &g_cu.CtxSynchronize);
  CUcontext ctx = nullptr;
  Check(g_cu.vmm->cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  Check(g_cu.vmm->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

size_t Granularity() {
  static size_t g = [] {
    auto r = ipc::CudaDriver::Get().Granularity(0, false);
    if (!r.ok()) Die(r.status().ToString());
    return *r;
  }();
  return g;
}
size_t RoundUp(size_t n) { return (n + Granularity() - 1) / Granularity() * Granularity(); }

CUmemAllocationProp VmmProp() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

void SetReadWrite(CUdeviceptr va, size_t size) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Check(g_cu.vmm->cuMemSetAccess(va, size, &a, 1), "cuMemSetAccess");
}

void FillDevice(CUdeviceptr va, size_t size, unsigned char value) {
  Check(g_cu.vmm->cuMemsetD8(va, value, size), "cuMemsetD8");
  Check(g_cu.CtxSynchronize(), "cuCtxSynchronize");
}

// The consumer's proof of access: the first and last bytes, read back.
bool Verify(CUdeviceptr va, size_t size, unsigned char value) {
  unsigned char head[64], tail[64];
  const size_t n = std::min<size_t>(size, sizeof head);
  Check(g_cu.vmm->cuMemcpyDtoH(head, va, n), "cuMemcpyDtoH");
  Check(g_cu.vmm->cuMemcpyDtoH(tail, va + size - n, n), "cuMemcpyDtoH");
  for (size_t i = 0; i < n; ++i)
    if (head[i] != value || tail[i] != value) return false;
  return true;
}

// What crosses the control socket: the producer's offer, the consumer's answers.
struct OfferMessage {
  int method = 0;
  uint64_t size = 0;  // the buffer's size (a VMM method's is rounded to the granularity)
  unsigned char value = 0;
  char token[128] = {};  // membroker's export token, or cuda-ipc's handle
};
// The consumer's clock at each step of a take, for the steps table: the offer
// received, the memory imported, mapped with access set, and checked (the
// end of the hand-off; 0 on failure).
enum Step { kReceived, kImported, kMapped, kDone, kSteps };
const char* const kStepNames[kSteps] = {"send_us", "import_us", "map_us", "check_us"};
struct AnswerMessage {
  uint64_t at_ns[kSteps] = {};
  char error[120] = {};
};
uint64_t g_imported_ns = 0;  // set by each Take after its import step

void Send(int sock, const void* m, size_t n, int fd = -1) {
  if (bench::RawSend(sock, m, n, fd) != static_cast<ssize_t>(n)) Die("the control socket failed");
}
template <typename M>
M Recv(int sock, int* fd = nullptr) {
  M m;
  int got = -1;
  if (bench::RawRecv(sock, &m, sizeof m, &got) != static_cast<ssize_t>(sizeof m)) Die("the control socket closed");
  if (fd != nullptr)
    *fd = got;
  else if (got >= 0)
    ::close(got);
  return m;
}

// One way of handing a device buffer over.
class Method {
 public:
  virtual ~Method() = default;
  virtual const char* name() const = 0;
  virtual size_t BufferSize(size_t size) const { return RoundUp(size); }
  // Producer, not timed: a buffer of `size` bytes, every byte `value`.
  virtual void Prepare(size_t size, unsigned char value) = 0;
  // Producer, timed: hand it over (fill `offer`, send it).
  virtual void Offer(int sock, OfferMessage& offer) = 0;
  // Producer, not timed, once the consumer let go: free the buffer.
  virtual void Release() = 0;
  // Consumer, timed: take the offered buffer; its device address.
  virtual CUdeviceptr Take(const OfferMessage& offer, int fd) = 0;
  // Consumer, not timed: let go of it.
  virtual void Drop() = 0;
};

class BrokerMethod : public Method {
 public:
  explicit BrokerMethod(std::string socket) : socket_(std::move(socket)) {}
  const char* name() const override { return "membroker"; }
  void Prepare(size_t size, unsigned char value) override {
    Connect();
    AllocationProp prop;
    prop.location = MemLocation{MemLocation::kDevice, 0};
    prop.exported = true;
    prop.export_flags = kExportNoPidCheck;
    handle_ = Must(client_.MallocPhysical(size, prop), "MallocPhysical");
    range_ = Must(client_.ReserveMemAddress(handle_.size(), 0, nullptr, kReserveDevice), "ReserveMemAddress");
    map_ = Must(client_.MapMem(range_.base(), handle_.size(), 0, handle_), "MapMem");
    FillDevice(reinterpret_cast<CUdeviceptr>(map_.data()), handle_.size(), value);
  }
  void Offer(int sock, OfferMessage& offer) override {
    // The token came with the allocation (prop.exported): no round trip here.
    const std::string& t = handle_.export_token();
    if (t.empty() || t.size() >= sizeof offer.token) Die("no export token that fits the offer");
    std::memcpy(offer.token, t.data(), t.size());
    Send(sock, &offer, sizeof offer);
  }
  void Release() override {
    map_ = Mapping();
    range_ = Reservation();
    handle_ = PhysicalHandle();
  }
  CUdeviceptr Take(const OfferMessage& offer, int) override {
    Connect();
    handle_ = Must(client_.ImportFromShareableHandle(offer.token), "ImportFromShareableHandle");
    g_imported_ns = NowNs();  // (the driver's import comes with the first MapMem)
    range_ = Must(client_.ReserveMemAddress(handle_.size(), 0, nullptr, kReserveDevice), "ReserveMemAddress");
    map_ = Must(client_.MapMem(range_.base(), handle_.size(), 0, handle_), "MapMem");
    return reinterpret_cast<CUdeviceptr>(map_.data());
  }
  void Drop() override { Release(); }

 private:
  template <typename T>
  static T Must(Result<T> r, const char* what) {
    if (!r.ok()) Die(std::string("membroker: ") + what + ": " + r.status().ToString());
    return std::move(*r);
  }
  void Connect() {
    if (!client_.connected()) client_ = Must(Client::Connect({socket_, "device-handoff"}), "Connect");
  }
  std::string socket_;
  Client client_;
  PhysicalHandle handle_;
  Reservation range_;
  Mapping map_;
};

class VmmFdMethod : public Method {
 public:
  const char* name() const override { return "vmm+fd"; }
  void Prepare(size_t size, unsigned char value) override {
    size_ = size;
    CUmemAllocationProp prop = VmmProp();
    Check(g_cu.vmm->cuMemCreate(&handle_, size, &prop, 0), "cuMemCreate");
    // Exported as it is made, as the broker exports what it creates: the
    // hand-off passes an fd that exists.
    Check(g_cu.vmm->cuMemExportToShareableHandle(&fd_, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
    MapHere(size);
    FillDevice(va_, size, value);
  }
  void Offer(int sock, OfferMessage& offer) override { Send(sock, &offer, sizeof offer, fd_); }
  void Release() override {
    ::close(fd_);
    Unmap();
  }
  CUdeviceptr Take(const OfferMessage& offer, int fd) override {
    if (fd < 0) Die("vmm+fd: no fd came");
    size_ = offer.size;
    Check(g_cu.vmm->cuMemImportFromShareableHandle(&handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
    g_imported_ns = NowNs();
    ::close(fd);
    MapHere(size_);
    return va_;
  }
  void Drop() override { Unmap(); }

 private:
  void MapHere(size_t size) {
    Check(g_cu.vmm->cuMemAddressReserve(&va_, size, Granularity(), 0, 0), "cuMemAddressReserve");
    Check(g_cu.vmm->cuMemMap(va_, size, 0, handle_, 0), "cuMemMap");
    SetReadWrite(va_, size);
  }
  void Unmap() {
    Check(g_cu.vmm->cuMemUnmap(va_, size_), "cuMemUnmap");
    Check(g_cu.vmm->cuMemRelease(handle_), "cuMemRelease");
    Check(g_cu.vmm->cuMemAddressFree(va_, size_), "cuMemAddressFree");
  }
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  size_t size_ = 0;
  int fd_ = -1;
};

class CudaIpcMethod : public Method {
 public:
  const char* name() const override { return "cuda-ipc"; }
  size_t BufferSize(size_t size) const override { return size; }  // cuMemAlloc takes any size
  void Prepare(size_t size, unsigned char value) override {
    Check(g_cu.MemAlloc(&va_, size), "cuMemAlloc");
    FillDevice(va_, size, value);
  }
  void Offer(int sock, OfferMessage& offer) override {
    CUipcMemHandle h{};
    Check(g_cu.IpcGetMemHandle(&h, va_), "cuIpcGetMemHandle");
    static_assert(sizeof h <= sizeof offer.token);
    std::memcpy(offer.token, &h, sizeof h);
    Send(sock, &offer, sizeof offer);
  }
  void Release() override { Check(g_cu.MemFree(va_), "cuMemFree"); }
  CUdeviceptr Take(const OfferMessage& offer, int) override {
    CUipcMemHandle h{};
    std::memcpy(&h, offer.token, sizeof h);
    Check(g_cu.IpcOpenMemHandle(&va_, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
    g_imported_ns = NowNs();  // (opened is mapped: no map step)
    return va_;
  }
  void Drop() override { Check(g_cu.IpcCloseMemHandle(va_), "cuIpcCloseMemHandle"); }

 private:
  CUdeviceptr va_ = 0;
};

std::vector<std::unique_ptr<Method>> Methods(const std::string& socket) {
  std::vector<std::unique_ptr<Method>> m;
  m.push_back(std::make_unique<BrokerMethod>(socket));
  m.push_back(std::make_unique<VmmFdMethod>());
  m.push_back(std::make_unique<CudaIpcMethod>());
  return m;
}

// The consumer process: takes offers until the producer closes the socket.
int Consumer(int sock, const std::string& socket) {
  LoadDriver();
  auto methods = Methods(socket);
  for (;;) {
    OfferMessage offer;
    int fd = -1;
    if (bench::RawRecv(sock, &offer, sizeof offer, &fd) != static_cast<ssize_t>(sizeof offer)) return 0;
    if (offer.method < 0 || offer.method >= static_cast<int>(methods.size())) Die("an offer of no method");
    Method& m = *methods[offer.method];
    AnswerMessage a;
    a.at_ns[kReceived] = NowNs();
    CUdeviceptr va = m.Take(offer, fd);
    a.at_ns[kImported] = g_imported_ns;
    a.at_ns[kMapped] = NowNs();
    if (Verify(va, offer.size, offer.value))
      a.at_ns[kDone] = NowNs();
    else
      std::snprintf(a.error, sizeof a.error, "%s: the consumer read wrong bytes", m.name());
    Send(sock, &a, sizeof a);
    m.Drop();
    Send(sock, &a, sizeof a);  // let go: the producer may free now
  }
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

int RoundsFor(size_t size, bool quick) {
  const int full = size <= (1u << 20) ? 200 : size <= (64u << 20) ? 50 : 10;
  return quick ? std::max(3, full / 10) : full;
}

}  // namespace

int main(int argc, char** argv) {
  std::string broker, socket, sizes = "4K,1M,64M,1G";
  int rounds = 0, consumer_fd = -1;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing a value after " + a);
      return argv[++i];
    };
    if (a == "--broker") broker = next();
    else if (a == "--sizes") sizes = next();
    else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--quick") quick = true;
    else if (a == "--consumer") consumer_fd = std::atoi(next().c_str());
    else if (a == "--socket") socket = next();
    else Die("usage: bench_device_handoff --broker MEMBROKERD [--sizes 4K,1M,64M,1G] [--rounds N] [--quick]");
  }
  if (consumer_fd >= 0) return Consumer(consumer_fd, socket);
  if (broker.empty()) Die("--broker MEMBROKERD is required");

  // A folder of its own: the broker leaves its state file beside its socket.
  const std::string dir = "/tmp/membroker-devbench-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0700) != 0) Die("mkdir " + dir);
  socket = dir + "/broker.sock";
  const pid_t broker_pid = bench::LaunchBroker(broker, {"--socket", socket, "--log-level", "warn"});
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) Die("socketpair");
  const pid_t consumer = ::fork();
  if (consumer == 0) {
    ::close(sv[0]);
    std::string self = "/proc/self/exe", fd = std::to_string(sv[1]);
    ::execl(self.c_str(), argv[0], "--consumer", fd.c_str(), "--socket", socket.c_str(), nullptr);
    _exit(127);
  }
  ::close(sv[1]);
  const int sock = sv[0];
  LoadDriver();  // after the fork: the consumer is a fresh execution anyway
  auto methods = Methods(socket);

  const std::vector<size_t> list = bench::ParseSizes(sizes);
  int failed = 0;
  for (size_t size : list) {
    const int n = rounds > 0 ? rounds : RoundsFor(size, quick);
    std::vector<std::vector<double>> us(methods.size());
    std::vector<std::vector<std::vector<double>>> steps(methods.size(), std::vector<std::vector<double>>(kSteps));
    for (int r = 0; r < n; ++r) {
      for (size_t k = 0; k < methods.size(); ++k) {
        Method& m = *methods[k];
        OfferMessage offer;
        offer.method = static_cast<int>(k);
        offer.size = m.BufferSize(size);
        offer.value = static_cast<unsigned char>(1 + (r * 3 + k) % 251);
        m.Prepare(offer.size, offer.value);
        const uint64_t t0 = NowNs();
        m.Offer(sock, offer);
        AnswerMessage a = Recv<AnswerMessage>(sock);
        (void)Recv<AnswerMessage>(sock);  // the consumer let go
        m.Release();
        if (a.at_ns[kDone] == 0) {
          std::fprintf(stderr, "bench_device_handoff: %s\n", a.error);
          ++failed;
          continue;
        }
        us[k].push_back((a.at_ns[kDone] - t0) / 1e3);
        for (int st = 0; st < kSteps; ++st)
          steps[k][st].push_back((a.at_ns[st] - (st == 0 ? t0 : a.at_ns[st - 1])) / 1e3);
      }
    }
    std::vector<double> median(methods.size());
    for (size_t k = 0; k < methods.size(); ++k) {
      if (us[k].empty()) continue;
      median[k] = Percentile(us[k], 0.5);
      std::string step_medians;
      for (int st = 0; st < kSteps; ++st) {
        char b[64];
        std::snprintf(b, sizeof b, ",\"%s\":%.1f", kStepNames[st], Percentile(steps[k][st], 0.5));
        step_medians += b;
      }
      std::printf(
          "{\"bench\":\"device_handoff\",\"method\":\"%s\",\"size\":%zu,\"buffer\":%zu,\"rounds\":%zu,"
          "\"median_us\":%.1f,\"p10_us\":%.1f,\"p90_us\":%.1f%s}\n",
          methods[k]->name(), size, methods[k]->BufferSize(size), us[k].size(), median[k], Percentile(us[k], 0.1),
          Percentile(us[k], 0.9), step_medians.c_str());
    }
    if (median[0] > 0 && median[1] > 0 && median[2] > 0)
      std::printf("{\"bench\":\"device_handoff\",\"size\":%zu,\"membroker_vs_floor\":%.2f,\"membroker_vs_cuda_ipc\":%.2f}\n",
                  size, median[0] / median[1], median[0] / median[2]);
    std::fflush(stdout);
  }
  ::close(sock);
  int status = 0;
  if (::waitpid(consumer, &status, 0) != consumer || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench_device_handoff: the consumer failed (status %d)\n", status);
    ++failed;
  }
  ::kill(broker_pid, SIGTERM);
  ::waitpid(broker_pid, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return failed == 0 ? 0 : 1;
}
