// The CUDA driver, loaded at run time and never linked: dlopen("libcuda.so.1")
// and every entry point through cuGetProcAddress, so the broker, the client
// library and the tests build and run on machines without a GPU. Where the
// driver, a device or (at build time) the CUDA toolkit's headers are missing,
// Available() and CheckDevice() say why, as UNSUPPORTED.
#pragma once

#include <cstddef>
#include <string>

#include "membroker/status.h"

namespace membroker::ipc {

class CudaDriver {
 public:
  // Loaded (and cuInit called) once per process, on first use.
  static const CudaDriver& Get();

  // OK, or UNSUPPORTED: built without the CUDA headers, no libcuda.so.1,
  // cuInit failed (no device, driver too old).
  Status Available() const { return status_; }
  int device_count() const { return devices_; }
  // UNSUPPORTED "no device N" unless device N exists.
  Status CheckDevice(int device) const;
  // The VMM granularity of device memory on `device` (minimum or recommended).
  Result<size_t> Granularity(int device, bool recommended) const;
  // Device N's memory (cuDeviceTotalMem): the default of its budget.
  Result<uint64_t> TotalMemory(int device) const;
  // The driver's version as cuDriverGetVersion gives it (e.g. 12040), or 0.
  int driver_version() const { return version_; }

  struct Api;  // the entry points (cuda_driver.cc); null without a driver
  const Api* api() const { return api_; }

 private:
  CudaDriver();
  Status status_;
  int devices_ = 0;
  int version_ = 0;
  const Api* api_ = nullptr;
};

}  // namespace membroker::ipc
