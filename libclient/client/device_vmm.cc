// device_vmm.h over the driver that ipc/cuda_driver.h loads at run time.
#include "client/device_vmm.h"

#include <map>
#include <mutex>
#include <string>

#include "membroker/ipc/cuda_driver.h"
#include "membroker/ipc/escape.h"

#ifdef MEMBROKER_HAVE_CUDA_HEADERS
#include "membroker/ipc/cuda_api.h"
#endif

namespace membroker::detail::device {

#ifdef MEMBROKER_HAVE_CUDA_HEADERS

namespace {

Result<const ipc::CudaDriver::Api*> Driver() {
  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  MB_RETURN_IF_ERROR(driver.Available());
  return driver.api();
}

Status Refused(const char* call, const std::string& what, CUresult rc) {
  const ErrorCode code = rc == CUDA_ERROR_OUT_OF_MEMORY   ? ErrorCode::kResourceExhausted
                         : rc == CUDA_ERROR_NOT_SUPPORTED ? ErrorCode::kUnsupported
                                                          : ErrorCode::kInternal;
  return Status(code, std::string(call) + "(" + what + "): " + ipc::CudaErrorText(*ipc::CudaDriver::Get().api(), rc));
}

std::string Range(uintptr_t va, size_t size) { return ipc::Hex(va) + "+" + std::to_string(size); }

// `device`'s primary context, retained the first time and kept for the
// process's life (releasing it with the last copy would tear it down and
// build it again for the next, which costs a real driver milliseconds).
Result<CUcontext> PrimaryContext(const ipc::CudaDriver::Api& cu, int device) {
  static std::mutex mu;
  static std::map<int, CUcontext> retained;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = retained.find(device); it != retained.end()) return it->second;
  CUcontext ctx = nullptr;
  if (CUresult rc = cu.cuDevicePrimaryCtxRetain(&ctx, device); rc != CUDA_SUCCESS)
    return Refused("cuDevicePrimaryCtxRetain", "device " + std::to_string(device), rc);
  retained[device] = ctx;
  return ctx;
}

CUmemAccess_flags Flags(Access access) {
  return access == Access::kReadWrite ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
         : access == Access::kRead    ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                      : CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

}  // namespace

Result<uint64_t> Import(int fd, int device) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  MB_RETURN_IF_ERROR(ipc::CudaDriver::Get().CheckDevice(device));
  CUmemGenericAllocationHandle h = 0;
  if (CUresult rc = cu->cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      rc != CUDA_SUCCESS)
    return Refused("cuMemImportFromShareableHandle", "device " + std::to_string(device), rc);
  return static_cast<uint64_t>(h);
}

Status ReleaseHandle(uint64_t handle) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  if (CUresult rc = cu->cuMemRelease(handle); rc != CUDA_SUCCESS) return Refused("cuMemRelease", "", rc);
  return Status::Ok();
}

Result<uintptr_t> Reserve(size_t size, size_t alignment, uintptr_t hint) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  CUdeviceptr va = 0;
  if (CUresult rc = cu->cuMemAddressReserve(&va, size, alignment, hint, 0); rc != CUDA_SUCCESS)
    return Refused("cuMemAddressReserve", "size=" + std::to_string(size), rc);
  return static_cast<uintptr_t>(va);
}

Status Free(uintptr_t va, size_t size) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  if (CUresult rc = cu->cuMemAddressFree(va, size); rc != CUDA_SUCCESS)
    return Refused("cuMemAddressFree", Range(va, size), rc);
  return Status::Ok();
}

Status Map(uintptr_t va, size_t size, size_t offset, uint64_t handle, int device, Access access) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  if (CUresult rc = cu->cuMemMap(va, size, offset, handle, 0); rc != CUDA_SUCCESS)
    return Refused("cuMemMap", Range(va, size) + " offset=" + std::to_string(offset), rc);
  if (access == Access::kNone) return Status::Ok();  // mappings start with no access
  Status st = SetAccess(va, size, device, access);
  if (!st.ok()) (void)cu->cuMemUnmap(va, size);
  return st;
}

Status Unmap(uintptr_t va, size_t size) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  if (CUresult rc = cu->cuMemUnmap(va, size); rc != CUDA_SUCCESS) return Refused("cuMemUnmap", Range(va, size), rc);
  return Status::Ok();
}

Status SetAccess(uintptr_t va, size_t size, int device, Access access) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = Flags(access);
  if (CUresult rc = cu->cuMemSetAccess(va, size, &desc, 1); rc != CUDA_SUCCESS)
    return Refused("cuMemSetAccess", Range(va, size) + " device " + std::to_string(device), rc);
  return Status::Ok();
}

Status Copy(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t size, int device) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  MB_RETURN_IF_ERROR(ipc::CudaDriver::Get().CheckDevice(device));
  CUcontext current = nullptr;
  const bool borrow = cu->cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr;
  if (borrow) {
    MB_ASSIGN_OR_RETURN(CUcontext primary, PrimaryContext(*cu, device));
    if (CUresult rc = cu->cuCtxSetCurrent(primary); rc != CUDA_SUCCESS)
      return Refused("cuCtxSetCurrent", "device " + std::to_string(device) + "'s primary context", rc);
  }
  const char* call = dst_device && src_device ? "cuMemcpyDtoD" : dst_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH";
  const CUresult rc = dst_device && src_device ? cu->cuMemcpyDtoD(dst, src, size)
                      : dst_device             ? cu->cuMemcpyHtoD(dst, reinterpret_cast<const void*>(src), size)
                                               : cu->cuMemcpyDtoH(reinterpret_cast<void*>(dst), src, size);
  if (borrow) (void)cu->cuCtxSetCurrent(nullptr);  // the thread is as it was
  if (rc != CUDA_SUCCESS) return Refused(call, Range(src, size) + " to " + ipc::Hex(dst), rc);
  return Status::Ok();
}

Result<bool> RegisterHost(void* ptr, size_t size) {
  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  if (!driver.Available().ok()) return false;
  const ipc::CudaDriver::Api* cu = driver.api();
  CUcontext ctx = nullptr;
  if (cu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return false;
  CUresult rc = cu->cuMemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE);
  if (rc == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) return false;  // the program's own registration
  if (rc != CUDA_SUCCESS) return Refused("cuMemHostRegister", Range(reinterpret_cast<uintptr_t>(ptr), size), rc);
  return true;
}

Status UnregisterHost(void* ptr) {
  MB_ASSIGN_OR_RETURN(const ipc::CudaDriver::Api* cu, Driver());
  if (CUresult rc = cu->cuMemHostUnregister(ptr); rc != CUDA_SUCCESS)
    return Refused("cuMemHostUnregister", ipc::Hex(reinterpret_cast<uintptr_t>(ptr)), rc);
  return Status::Ok();
}

#else  // built without the CUDA headers: CudaDriver says why

namespace {
Status Why() { return ipc::CudaDriver::Get().Available(); }
}  // namespace

Result<uint64_t> Import(int, int) { return Why(); }
Status ReleaseHandle(uint64_t) { return Why(); }
Result<uintptr_t> Reserve(size_t, size_t, uintptr_t) { return Why(); }
Status Free(uintptr_t, size_t) { return Why(); }
Status Map(uintptr_t, size_t, size_t, uint64_t, int, Access) { return Why(); }
Status Unmap(uintptr_t, size_t) { return Why(); }
Status SetAccess(uintptr_t, size_t, int, Access) { return Why(); }
Status Copy(uintptr_t, bool, uintptr_t, bool, size_t, int) { return Why(); }
Result<bool> RegisterHost(void*, size_t) { return false; }
Status UnregisterHost(void*) { return Why(); }

#endif

Result<size_t> Granularity(int device) { return ipc::CudaDriver::Get().Granularity(device, false); }

Result<uintptr_t> MapWhole(int fd, size_t size, int device, Access access) {
  MB_ASSIGN_OR_RETURN(size_t granularity, Granularity(device));
  MB_ASSIGN_OR_RETURN(uint64_t handle, Import(fd, device));
  Result<uintptr_t> va = Reserve(size, granularity, 0);
  Status st = va.ok() ? Map(*va, size, 0, handle, device, access) : va.status();
  if (!st.ok() && va.ok()) (void)Free(*va, size);
  (void)ReleaseHandle(handle);  // mapped: the mapping holds the memory; else: nothing does
  if (!st.ok()) return st;
  return va;
}

Status UnmapWhole(uintptr_t va, size_t size) {
  Status unmapped = Unmap(va, size);
  Status freed = Free(va, size);
  return unmapped.ok() ? freed : unmapped;
}

}  // namespace membroker::detail::device
