#include "membroker/ipc/cuda_driver.h"

#include <dlfcn.h>

#include <string>

#ifdef MEMBROKER_HAVE_CUDA_HEADERS
#include "membroker/ipc/cuda_api.h"
#endif

namespace membroker::ipc {

#ifdef MEMBROKER_HAVE_CUDA_HEADERS

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

Status Unsupported(const std::string& why) {
  return Status(ErrorCode::kUnsupported, "device memory is unavailable here: " + why);
}

}  // namespace

std::string CudaErrorText(const CudaDriver::Api& api, CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  std::string out;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(rc, &name) == CUDA_SUCCESS && name != nullptr) out = name;
  out += (out.empty() ? "CUresult " : " (") + std::to_string(static_cast<int>(rc)) + (out.empty() ? "" : ")");
  if (api.cuGetErrorString != nullptr && api.cuGetErrorString(rc, &text) == CUDA_SUCCESS && text != nullptr)
    out += std::string(": ") + text;
  return out;
}

CudaDriver::CudaDriver() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = ::dlerror();
    status_ = Unsupported(std::string("no CUDA driver (") + (e ? e : "libcuda.so.1 not found") + ")");
    return;
  }
  // (Kept loaded for the life of the process, as the driver expects.)
  auto get = reinterpret_cast<GetProcAddress>(::dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    status_ = Unsupported("the CUDA driver has no cuGetProcAddress_v2 (older than CUDA 12)");
    return;
  }
  static Api api;
  std::string missing;
  auto load = [&](const char* name, auto** fn) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found{};
    if (get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || p == nullptr)
      missing += std::string(missing.empty() ? "" : ", ") + name;
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
#define MEMBROKER_CUDA_LOAD(name) load(#name, &api.name);
  MEMBROKER_CUDA_ENTRY_POINTS(MEMBROKER_CUDA_LOAD)
#undef MEMBROKER_CUDA_LOAD
  if (!missing.empty()) {
    status_ = Unsupported("the CUDA driver lacks entry points membroker needs: " + missing);
    return;
  }
  (void)api.cuDriverGetVersion(&version_);
  if (CUresult rc = api.cuInit(0); rc != CUDA_SUCCESS) {
    status_ = Unsupported("cuInit failed: " + CudaErrorText(api, rc));
    return;
  }
  if (CUresult rc = api.cuDeviceGetCount(&devices_); rc != CUDA_SUCCESS || devices_ == 0) {
    status_ = Unsupported(rc != CUDA_SUCCESS ? "cuDeviceGetCount failed: " + CudaErrorText(api, rc) : "no CUDA device");
    devices_ = 0;
    return;
  }
  api_ = &api;
}

Result<size_t> CudaDriver::Granularity(int device, bool recommended) const {
  MB_RETURN_IF_ERROR(CheckDevice(device));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  CUresult rc = api_->cuMemGetAllocationGranularity(
      &g, &prop, recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc != CUDA_SUCCESS)
    return Status(ErrorCode::kUnsupported, "cuMemGetAllocationGranularity on device " + std::to_string(device) + ": " +
                                               CudaErrorText(*api_, rc));
  return g;
}

Result<uint64_t> CudaDriver::TotalMemory(int device) const {
  MB_RETURN_IF_ERROR(CheckDevice(device));
  size_t bytes = 0;
  if (CUresult rc = api_->cuDeviceTotalMem(&bytes, device); rc != CUDA_SUCCESS)
    return Status(ErrorCode::kUnsupported,
                  "cuDeviceTotalMem on device " + std::to_string(device) + ": " + CudaErrorText(*api_, rc));
  return bytes;
}

#else  // built without the CUDA toolkit's headers

struct CudaDriver::Api {};

CudaDriver::CudaDriver()
    : status_(ErrorCode::kUnsupported,
              "device memory is unavailable here: membroker was built without the CUDA headers "
              "(configure with MEMBROKER_CUDA=ON and the CUDA toolkit installed)") {}

Result<size_t> CudaDriver::Granularity(int device, bool) const {
  MB_RETURN_IF_ERROR(CheckDevice(device));
  return Status(ErrorCode::kUnsupported, "unreachable");
}

Result<uint64_t> CudaDriver::TotalMemory(int device) const {
  MB_RETURN_IF_ERROR(CheckDevice(device));
  return Status(ErrorCode::kUnsupported, "unreachable");
}

#endif

const CudaDriver& CudaDriver::Get() {
  static const CudaDriver driver;
  return driver;
}

Status CudaDriver::CheckDevice(int device) const {
  MB_RETURN_IF_ERROR(status_);
  if (device < 0 || device >= devices_)
    return Status(ErrorCode::kUnsupported,
                  "no CUDA device " + std::to_string(device) + " (this machine has " + std::to_string(devices_) + ")");
  return Status::Ok();
}

}  // namespace membroker::ipc
