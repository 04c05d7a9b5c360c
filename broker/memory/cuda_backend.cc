// The CUDA backend (backend.h): device memory made with cuMemCreate and
// exported as a POSIX fd. Built where the CUDA headers are; the driver itself
// is loaded at run time (ipc/cuda_driver.h), and without one every call says
// why, as UNSUPPORTED.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "memory/backend.h"
#include "membroker/ipc/cuda_driver.h"
#include "membroker/ipc/syscall.h"

#ifdef MEMBROKER_HAVE_CUDA_HEADERS
#include "membroker/ipc/cuda_api.h"
#endif

namespace membroker::broker {

namespace {

#ifdef MEMBROKER_HAVE_CUDA_HEADERS

Status DriverError(const char* call, int device, CUresult rc) {
  const ipc::CudaDriver::Api& api = *ipc::CudaDriver::Get().api();
  const ErrorCode code = rc == CUDA_ERROR_OUT_OF_MEMORY ? ErrorCode::kResourceExhausted : ErrorCode::kInternal;
  return Status(code, std::string(call) + " on device " + std::to_string(device) + ": " + ipc::CudaErrorText(api, rc));
}

// Runs `call` on this thread; where the driver wants a current context for it
// (it answers CUDA_ERROR_INVALID_CONTEXT), with the device's primary context.
template <typename Call>
CUresult WithContext(int device, Call call) {
  CUresult rc = call();
  if (rc != CUDA_ERROR_INVALID_CONTEXT) return rc;
  const ipc::CudaDriver::Api& api = *ipc::CudaDriver::Get().api();
  CUcontext ctx = nullptr;
  if (CUresult r = api.cuDevicePrimaryCtxRetain(&ctx, device); r != CUDA_SUCCESS) return r;
  if (CUresult r = api.cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return r;
  return call();  // the context stays retained and current on this thread
}

#endif

class Cuda final : public PhysicalBackend {
 public:
  std::string_view name() const override { return "cuda"; }
  // Device 0's (the handshake's table is per page policy, not per device;
  // clients ask their own driver for a device's granularity).
  ipc::Granularity Granularity(ipc::PagePolicy policy) const override {
    const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
    auto min = driver.Granularity(0, false);
    auto rec = driver.Granularity(0, true);
    return {policy, min.ok() ? *min : 0, rec.ok() ? *rec : 0};
  }
  uint64_t MaxBytes(const MemorySpec& spec) const override {
    auto g = ipc::CudaDriver::Get().Granularity(spec.device, false);
    return g.ok() && *g != 0 ? ipc::RoundUp(spec.size, *g) : 0;
  }
  Result<PhysicalMemory> Create(const MemorySpec& spec) override {
    const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
    MB_RETURN_IF_ERROR(driver.CheckDevice(spec.device));
#ifdef MEMBROKER_HAVE_CUDA_HEADERS
    MB_ASSIGN_OR_RETURN(size_t granularity, driver.Granularity(spec.device, false));
    const uint64_t size = ipc::RoundUp(spec.size, granularity);
    const ipc::CudaDriver::Api& api = *driver.api();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = spec.device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult rc = WithContext(spec.device, [&] { return api.cuMemCreate(&handle, size, &prop, 0); });
        rc != CUDA_SUCCESS)
      return DriverError("cuMemCreate", spec.device, rc);
    int fd = -1;
    CUresult rc = api.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    // The fd keeps the memory; the handle is not needed past the export.
    CUresult released = api.cuMemRelease(handle);
    if (rc != CUDA_SUCCESS) return DriverError("cuMemExportToShareableHandle", spec.device, rc);
    ipc::UniqueFd owned(fd);
    if (released != CUDA_SUCCESS) return DriverError("cuMemRelease", spec.device, released);
    PhysicalMemory mem;
    mem.fd = std::move(owned);
    mem.size = size;
    mem.page_size = granularity;
    mem.device = spec.device;
    return mem;
#else
    return Status(ErrorCode::kUnsupported, "unreachable");  // CheckDevice failed above
#endif
  }
  // The driver has no read-only shareable handle: a read-only holder gets the
  // same fd, and its client library maps it with read access only.
  Result<ipc::UniqueFd> ReadOnlyFd(const PhysicalMemory& mem) const override {
    int fd = ::fcntl(mem.fd.get(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return ipc::ErrnoStatus("fcntl", "F_DUPFD_CLOEXEC of a device memory fd", errno);
    return ipc::UniqueFd(fd);
  }
  void Release(PhysicalMemory mem) override { mem.fd.reset(); }
};

}  // namespace

PhysicalBackend& CudaBackend() {
  static Cuda backend;
  return backend;
}

}  // namespace membroker::broker
