// The CUDA driver double's rules (ctest label "device"). Each test calls the
// driver through membroker's own loader (CudaDriver), so with a real driver
// first on the library path the same refusals are checked against it; the
// double's counters (cuda_double.h) are read where the double is loaded.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <vector>

#include "cuda_double.h"
#include "membroker/ipc/cuda_api.h"

namespace {

using membroker::ipc::CudaDriver;

const CudaDriver::Api& Cu() {
  const CudaDriver& d = CudaDriver::Get();
  if (!d.Available().ok()) {
    std::fprintf(stderr, "%s\n", d.Available().ToString().c_str());
    std::abort();  // the device tests run with the double (or a GPU): no driver is a setup error
  }
  return *d.api();
}

// The double's counters, or nullopt under a real driver.
std::optional<mbfake_cuda_counters> Counters() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto fn = lib ? reinterpret_cast<void (*)(mbfake_cuda_counters*)>(::dlsym(lib, "mbfake_cuda_get_counters")) : nullptr;
  if (fn == nullptr) return std::nullopt;
  mbfake_cuda_counters c{};
  fn(&c);
  return c;
}

template <typename Fn>
Fn DoubleControl(const char* name) {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<Fn>(::dlsym(lib, name)) : nullptr;
}

// A refusal whose code the documentation does not name: the double's code
// where it is loaded, any error from a real driver (device-check prints which).
void ExpectRefused(CUresult rc, CUresult double_code) {
  if (Counters())
    EXPECT_EQ(rc, double_code);
  else
    EXPECT_NE(rc, CUDA_SUCCESS);
}

CUmemAllocationProp DeviceProp(int device = 0) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

size_t Granularity() {
  size_t g = 0;
  CUmemAllocationProp p = DeviceProp();
  EXPECT_EQ(Cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  return g;
}

class DriverRules : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(Cu().cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(Cu().cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    g_ = Granularity();
    before_ = Counters();
  }
  void TearDown() override {
    // Every test gives back all it made.
    if (auto after = Counters(); after && before_) {
      EXPECT_EQ(after->allocations, before_->allocations);
      EXPECT_EQ(after->handles, before_->handles);
      EXPECT_EQ(after->mappings, before_->mappings);
      EXPECT_EQ(after->reservations, before_->reservations);
      EXPECT_EQ(after->memfds, before_->memfds);
      EXPECT_EQ(after->bad_releases, 0u);
    }
    EXPECT_EQ(Cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(Cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  }

  CUmemGenericAllocationHandle Create(size_t size) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = DeviceProp();
    EXPECT_EQ(Cu().cuMemCreate(&h, size, &p, 0), CUDA_SUCCESS);
    return h;
  }
  CUdeviceptr Reserve(size_t size) {
    CUdeviceptr va = 0;
    EXPECT_EQ(Cu().cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
    return va;
  }
  void Access(CUdeviceptr va, size_t size, CUmemAccess_flags flags) {
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = flags;
    ASSERT_EQ(Cu().cuMemSetAccess(va, size, &d, 1), CUDA_SUCCESS);
  }

  CUcontext ctx_ = nullptr;
  size_t g_ = 0;
  std::optional<mbfake_cuda_counters> before_;
};

TEST_F(DriverRules, CreateRefusesWhatTheDriverDocumentsAsInvalid) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = DeviceProp();
  EXPECT_EQ(Cu().cuMemCreate(&h, g_ + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);  // not a granularity multiple
  EXPECT_EQ(Cu().cuMemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cu().cuMemCreate(&h, g_, &p, 1), CUDA_ERROR_INVALID_VALUE);  // flags "must be zero"
  CUmemAllocationProp host = p;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;  // "not IPC capable": handle types must be 0
  EXPECT_EQ(Cu().cuMemCreate(&h, g_, &host, 0), CUDA_ERROR_INVALID_VALUE);
  int count = 0;
  ASSERT_EQ(Cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
  CUmemAllocationProp missing = DeviceProp(count);
  EXPECT_EQ(Cu().cuMemCreate(&h, g_, &missing, 0), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(DriverRules, BytesRoundTripThroughMapAccessAndCopies) {
  const size_t size = 2 * g_;
  CUmemGenericAllocationHandle h = Create(size);
  CUdeviceptr va = Reserve(size);
  ASSERT_EQ(Cu().cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
  // Mapped but not accessible yet: a copy is refused and moves nothing.
  std::vector<unsigned char> in(size), out(size, 0);
  for (size_t i = 0; i < size; ++i) in[i] = static_cast<unsigned char>(i * 131 + 7);
  if (Counters()) {
    EXPECT_EQ(Cu().cuMemcpyHtoD(va, in.data(), size), CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  Access(va, size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(Cu().cuMemcpyHtoD(va, in.data(), size), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemcpyDtoH(out.data(), va, size), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  // Device to device inside the range: the second half takes the first's bytes.
  ASSERT_EQ(Cu().cuMemcpyDtoD(va + g_, va, g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemcpyDtoH(out.data(), va + g_, g_), CUDA_SUCCESS);
  EXPECT_EQ(0, std::memcmp(out.data(), in.data(), g_));
  // Release while mapped is allowed; the mapping keeps the memory.
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemcpyDtoH(out.data(), va, g_), CUDA_SUCCESS);
  EXPECT_EQ(0, std::memcmp(out.data(), in.data(), g_));
  ASSERT_EQ(Cu().cuMemUnmap(va, size), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, size), CUDA_SUCCESS);
}

TEST_F(DriverRules, MapOnlyInsideAReservationWhereNothingIsMapped) {
  const size_t size = 2 * g_;
  CUmemGenericAllocationHandle h = Create(size);
  CUdeviceptr va = Reserve(2 * size);
  // (The codes an H200's driver answered.)
  EXPECT_EQ(Cu().cuMemMap(va + 4096, g_, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // misaligned address
  EXPECT_EQ(Cu().cuMemMap(va, size + g_, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // past the allocation
  EXPECT_EQ(Cu().cuMemMap(va, size, 0, h, 1), CUDA_ERROR_INVALID_VALUE);       // flags
  // Past the reservation: the double refuses it; that driver mapped it.
  const CUresult past = Cu().cuMemMap(va + 3 * g_, size, 0, h, 0);
  if (Counters()) {
    EXPECT_EQ(past, CUDA_ERROR_INVALID_VALUE);
  } else if (past == CUDA_SUCCESS) {
    ASSERT_EQ(Cu().cuMemUnmap(va + 3 * g_, size), CUDA_SUCCESS);
  }
  ASSERT_EQ(Cu().cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(Cu().cuMemMap(va + g_, g_, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // over a mapping
  // Access and unmap take whole mappings only.
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ExpectRefused(Cu().cuMemSetAccess(va, g_, &d, 1), CUDA_ERROR_INVALID_VALUE);
  ExpectRefused(Cu().cuMemUnmap(va, g_), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(Cu().cuMemUnmap(va, size), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(Cu().cuMemAddressFree(va, size), CUDA_ERROR_INVALID_VALUE);  // not the reserved size
  ASSERT_EQ(Cu().cuMemAddressFree(va, 2 * size), CUDA_SUCCESS);
}

TEST_F(DriverRules, ReadAccessRefusesWrites) {
  CUmemGenericAllocationHandle h = Create(g_);
  CUdeviceptr va = Reserve(g_);
  ASSERT_EQ(Cu().cuMemMap(va, g_, 0, h, 0), CUDA_SUCCESS);
  Access(va, g_, CU_MEM_ACCESS_FLAGS_PROT_READ);
  std::vector<unsigned char> buf(g_, 1);
  EXPECT_EQ(Cu().cuMemcpyDtoH(buf.data(), va, g_), CUDA_SUCCESS);
  if (Counters()) {
    EXPECT_EQ(Cu().cuMemcpyHtoD(va, buf.data(), g_), CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  ASSERT_EQ(Cu().cuMemUnmap(va, g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, g_), CUDA_SUCCESS);
}

// A device address is not host memory: touching it from the CPU faults, also
// after cuMemSetAccess (the double keeps it PROT_NONE, as a GPU's is to the CPU).
TEST_F(DriverRules, TouchingDeviceMemoryFromTheCpuFaults) {
  CUmemGenericAllocationHandle h = Create(g_);
  CUdeviceptr va = Reserve(g_);
  ASSERT_EQ(Cu().cuMemMap(va, g_, 0, h, 0), CUDA_SUCCESS);
  Access(va, g_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // the fault itself, not a sanitizer's report of it
    volatile unsigned char* p = reinterpret_cast<unsigned char*>(va);
    p[0] = 1;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  ASSERT_EQ(Cu().cuMemUnmap(va, g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, g_), CUDA_SUCCESS);
}

// Export, import in another process, copy: the fd is real, each import is a
// fresh handle, and the memory outlives the exporter's release while an fd
// or handle holds it.
TEST_F(DriverRules, AnExportedFdCarriesTheMemoryToAnotherProcess) {
  CUmemGenericAllocationHandle h = Create(g_);
  int fd = -1;
  ASSERT_EQ(Cu().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  ASSERT_GE(fd, 0);
  CUdeviceptr va = Reserve(g_);
  ASSERT_EQ(Cu().cuMemMap(va, g_, 0, h, 0), CUDA_SUCCESS);
  Access(va, g_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  std::vector<unsigned char> in(g_, 0x5a);
  ASSERT_EQ(Cu().cuMemcpyHtoD(va, in.data(), g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemUnmap(va, g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);  // only the fd holds the memory now

  CUmemGenericAllocationHandle a = 0, b = 0;
  ASSERT_EQ(Cu().cuMemImportFromShareableHandle(&a, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  if (Counters()) {
    ASSERT_EQ(Cu().cuMemImportFromShareableHandle(&b, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    EXPECT_NE(a, b);  // a fresh handle per import
    ASSERT_EQ(Cu().cuMemRelease(b), CUDA_SUCCESS);
  }
  ASSERT_EQ(Cu().cuMemMap(va, g_, 0, a, 0), CUDA_SUCCESS);
  Access(va, g_, CU_MEM_ACCESS_FLAGS_PROT_READ);
  std::vector<unsigned char> out(g_);
  ASSERT_EQ(Cu().cuMemcpyDtoH(out.data(), va, g_), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  ASSERT_EQ(Cu().cuMemUnmap(va, g_), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(a), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, g_), CUDA_SUCCESS);
  ::close(fd);  // import does not close it; the caller does
}

TEST_F(DriverRules, ExportNeedsTheHandleTypeRequestedAtCreate) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = DeviceProp();
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  ASSERT_EQ(Cu().cuMemCreate(&h, g_, &p, 0), CUDA_SUCCESS);
  int fd = -1;
  EXPECT_NE(Cu().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
}

// Fault injection (the double only): an injected error is returned and the
// call does nothing; the next call succeeds.
TEST_F(DriverRules, InjectedFaultsFailOnceAndLeaveNothing) {
  auto fail = DoubleControl<void (*)(const char*, int, int)>("mbfake_cuda_fail");
  if (fail == nullptr) GTEST_SKIP() << "a real driver: no fault injection";
  fail("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY);
  CUmemGenericAllocationHandle h1 = Create(g_), h2 = 0;
  CUmemAllocationProp p = DeviceProp();
  EXPECT_EQ(Cu().cuMemCreate(&h2, g_, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Counters()->allocations, before_->allocations + 1);
  ASSERT_EQ(Cu().cuMemCreate(&h2, g_, &p, 0), CUDA_SUCCESS);  // OOM, then success
  CUdeviceptr va = Reserve(g_);
  fail("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cu().cuMemMap(va, g_, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Counters()->mappings, before_->mappings);
  auto sticky = DoubleControl<void (*)(int)>("mbfake_cuda_sticky");
  sticky(CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(Cu().cuMemRelease(h1), CUDA_ERROR_ILLEGAL_ADDRESS);
  sticky(0);
  ASSERT_EQ(Cu().cuMemRelease(h1), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemRelease(h2), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, g_), CUDA_SUCCESS);
}

TEST_F(DriverRules, NonzeroMapOffsetsAreRefused) {
  CUmemGenericAllocationHandle h = Create(2 * g_);
  CUdeviceptr va = Reserve(g_);
  EXPECT_EQ(Cu().cuMemMap(va, g_, g_, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // "currently must be zero"
  if (auto strict = DoubleControl<void (*)(int)>("mbfake_cuda_strict_offset")) {
    strict(0);  // the double's looser mode, for a driver that may take them one day
    ASSERT_EQ(Cu().cuMemMap(va, g_, g_, h, 0), CUDA_SUCCESS);
    ASSERT_EQ(Cu().cuMemUnmap(va, g_), CUDA_SUCCESS);
    strict(1);
  }
  ASSERT_EQ(Cu().cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemAddressFree(va, g_), CUDA_SUCCESS);
}

// The legacy calls the device hand-off benchmark compares membroker with
// (bench/device_handoff.cc opens a handle in a second process, its consumer).
template <typename Fn>
Fn Legacy(const char* name) {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get = lib ? reinterpret_cast<GetProc>(::dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found{};
  if (get == nullptr || get(name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<Fn>(fn);
}

TEST_F(DriverRules, LegacyIpcHandlesOpenInAnotherProcessOnly) {
  auto alloc = Legacy<decltype(&::cuMemAlloc)>("cuMemAlloc");
  auto free_ = Legacy<decltype(&::cuMemFree)>("cuMemFree");
  auto get = Legacy<decltype(&::cuIpcGetMemHandle)>("cuIpcGetMemHandle");
  auto open = Legacy<decltype(&::cuIpcOpenMemHandle)>("cuIpcOpenMemHandle");
  auto close = Legacy<decltype(&::cuIpcCloseMemHandle)>("cuIpcCloseMemHandle");
  ASSERT_TRUE(alloc && free_ && get && open && close);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 5000), CUDA_SUCCESS);  // any size, usable at once
  std::vector<unsigned char> in(5000, 0x3c), out(5000);
  ASSERT_EQ(Cu().cuMemcpyHtoD(p, in.data(), in.size()), CUDA_SUCCESS);
  ASSERT_EQ(Cu().cuMemcpyDtoH(out.data(), p, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  CUipcMemHandle h{};
  ASSERT_EQ(get(&h, p + 256), CUDA_SUCCESS);  // an address inside the allocation (an H200's driver takes it)
  ASSERT_EQ(get(&h, p), CUDA_SUCCESS);
  CUdeviceptr again = 0;
  // Not in the process that made it (the code an H200's driver answered).
  EXPECT_EQ(open(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
  ExpectRefused(close(p), CUDA_ERROR_INVALID_VALUE);  // never opened
  ExpectRefused(free_(p + 256), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(free_(p), CUDA_SUCCESS);
}

TEST(DriverContext, CopiesNeedACurrentContext) {
  const CudaDriver::Api& cu = Cu();
  if (!Counters()) GTEST_SKIP() << "the double's rule";
  std::vector<unsigned char> buf(16);
  ASSERT_EQ(cu.cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuMemcpyDtoH(buf.data(), 0x1000, 16), CUDA_ERROR_INVALID_CONTEXT);
}

}  // namespace
