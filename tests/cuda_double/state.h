// The double's state: one per process, behind one mutex, as the driver's own
// tables are per process. Physical allocations are memfds, so the fds that
// travel through SCM_RIGHTS are real and a leak or an early free shows in
// /proc/PID/fd; device virtual addresses are real PROT_NONE reservations, so
// a CPU touch of device memory faults as it does on a GPU. Bytes move only
// through the copy calls, which reach an allocation through the double's own
// view of its memfd.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace mbfake {

inline constexpr size_t kHostPage = 4096;

struct Config {
  int devices = 1;
  uint64_t memory = 1ull << 30;
  size_t granularity = 2u << 20;
  size_t recommended = 2u << 20;
  bool strict_offset = true;  // as the driver is
};

// One physical allocation: lives while a handle or a mapping holds it; its
// memfd lives on in any fd exported from it.
struct Allocation {
  Allocation(int fd, size_t size, int device, bool created);
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  int fd = -1;
  size_t size = 0;
  int device = 0;
  bool created = false;           // by cuMemCreate here (charged to the device)
  bool exportable = false;        // POSIX fd handles were requested
  unsigned char* view = nullptr;  // the double's own mapping, for copies
};

struct Mapping {
  size_t size = 0;
  size_t offset = 0;
  std::shared_ptr<Allocation> alloc;
  std::map<int, unsigned> access;  // device -> CU_MEM_ACCESS_FLAGS_*; none at first
};

struct State {
  std::mutex mu;
  Config config;
  bool initialized = false;
  int sticky = 0;
  std::map<std::string, std::pair<int, int>> faults;  // call -> (calls left, code)
  uint64_t next_handle = 0x1000;
  std::map<CUmemGenericAllocationHandle, std::shared_ptr<Allocation>> handles;
  std::map<CUdeviceptr, size_t> reservations;   // base -> size
  std::map<CUdeviceptr, Mapping> mappings;      // va -> mapping
  std::map<uintptr_t, size_t> host_registered;  // host ptr -> size
  std::map<CUdeviceptr, bool> legacy;           // cuMemAlloc'd (true) or IPC-opened (false) bases
  uint64_t allocations = 0;
  uint64_t bad_releases = 0;  // cuMemRelease of no handle: UB on a GPU
  uint64_t used[64] = {};     // bytes created per device
};

State& Get();

// A memfd named for `device` (DeviceOfFd reads it back), `size` bytes long; -1 on failure.
int NewMemfd(int device, size_t size);
// The device an fd's memory is on, from the memfd's name; -1 when the fd is
// not one of the double's.
int DeviceOfFd(int fd);
// Maps an allocation's memfd for the copy calls (the device VA stays PROT_NONE).
CUresult MapView(Allocation& a);

// The common prologue of every entry point after cuInit: not initialized,
// a sticky error or an injected fault for `call`. CUDA_SUCCESS to go on.
CUresult Enter(State& s, const char* call);

// The current context of this thread (a device's primary context), or null.
CUcontext CurrentContext();
int DeviceOf(CUcontext ctx);  // -1 for an unknown context

}  // namespace mbfake
