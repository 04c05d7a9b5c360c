// The CUDA driver's entry points as membroker loads them (cuda_driver.h),
// for the code built with the CUDA toolkit's headers: the broker's device
// backend, the client's device path and the device tests. Each member has the
// driver's own type (decltype of cuda.h's declaration), and is looked up by
// the name cuGetProcAddress expects; cuda.h's versioned names (cuMemGetInfo
// is cuMemGetInfo_v2) apply to the members and the lookups alike.
#pragma once

#include <cuda.h>

#include <string>

#include "membroker/ipc/cuda_driver.h"

#define MEMBROKER_CUDA_ENTRY_POINTS(X) \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceTotalMem)                  \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease)         \
  X(cuCtxSetCurrent)                   \
  X(cuCtxGetCurrent)                   \
  X(cuGetErrorString)                  \
  X(cuGetErrorName)                    \
  X(cuMemGetAllocationGranularity)     \
  X(cuMemCreate)                       \
  X(cuMemRelease)                      \
  X(cuMemExportToShareableHandle)      \
  X(cuMemImportFromShareableHandle)    \
  X(cuMemAddressReserve)               \
  X(cuMemAddressFree)                  \
  X(cuMemMap)                          \
  X(cuMemUnmap)                        \
  X(cuMemSetAccess)                    \
  X(cuMemGetInfo)                      \
  X(cuMemHostRegister)                 \
  X(cuMemHostUnregister)               \
  X(cuMemcpyHtoD)                      \
  X(cuMemcpyDtoH)                      \
  X(cuMemcpyDtoD)                      \
  X(cuMemsetD8)

namespace membroker::ipc {

struct CudaDriver::Api {
#define MEMBROKER_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  MEMBROKER_CUDA_ENTRY_POINTS(MEMBROKER_CUDA_MEMBER)
#undef MEMBROKER_CUDA_MEMBER
};

// "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", from the driver's own tables.
std::string CudaErrorText(const CudaDriver::Api& api, CUresult rc);

}  // namespace membroker::ipc
