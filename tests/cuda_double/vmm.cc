// The double's virtual memory management calls (CUDA Driver API 6.14), each
// refusing what the reference (shared/reference/cuda-vmm-double.md) says the
// driver refuses, with the documented code. Where the documentation names no
// code for a refusal (mapping over a mapping, a partial unmap or access
// range), the double answers CUDA_ERROR_INVALID_VALUE; scripts/device-check
// asks a real driver.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "entries.h"
#include "state.h"

namespace mbfake {

Allocation::Allocation(int fd_in, size_t size_in, int device_in, bool created_in)
    : fd(fd_in), size(size_in), device(device_in), created(created_in) {
  ++Get().allocations;  // (called with the state's mutex held, as is the destructor)
}

Allocation::~Allocation() {
  State& s = Get();
  if (view != nullptr) ::munmap(view, size);
  if (fd >= 0) ::close(fd);
  --s.allocations;
  if (created) s.used[device] -= size;
}

namespace {

bool Aligned(uint64_t v, uint64_t to) { return to != 0 && v % to == 0; }

bool ValidDevice(const State& s, const CUmemLocation& loc) {
  return loc.type == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 && loc.id < s.config.devices;
}

}  // namespace

// Maps the memfd for the copy calls; the device VA itself stays PROT_NONE.
CUresult MapView(Allocation& a) {
  int mode = ::fcntl(a.fd, F_GETFL);
  if (mode < 0 || (mode & O_ACCMODE) != O_RDWR) return CUDA_ERROR_INVALID_VALUE;
  void* p = ::mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  a.view = static_cast<unsigned char*>(p);
  return CUDA_SUCCESS;
}

int NewMemfd(int device, size_t size) {
  char name[32];
  std::snprintf(name, sizeof name, "cuda-double:dev%d", device);
  int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

namespace {

CUmemGenericAllocationHandle NewHandle(State& s, std::shared_ptr<Allocation> a) {
  CUmemGenericAllocationHandle h = s.next_handle++;
  s.handles.emplace(h, std::move(a));
  return h;
}

CUresult GetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                  CUmemAllocationGranularity_flags option) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemGetAllocationGranularity"); rc != CUDA_SUCCESS) return rc;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !ValidDevice(s, prop->location))
    return CUDA_ERROR_INVALID_DEVICE;
  *granularity = option == CU_MEM_ALLOC_GRANULARITY_MINIMUM ? s.config.granularity : s.config.recommended;
  return CUDA_SUCCESS;
}

CUresult Create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                unsigned long long flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemCreate"); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    // Host locations are "not IPC capable": handle types must be 0. The
    // double models device memory only.
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST && prop->requestedHandleTypes != 0)
      return CUDA_ERROR_INVALID_VALUE;
    return prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT ? CUDA_ERROR_INVALID_VALUE
                                                                         : CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!ValidDevice(s, prop->location)) return CUDA_ERROR_INVALID_DEVICE;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (size == 0 || !Aligned(size, s.config.granularity)) return CUDA_ERROR_INVALID_VALUE;
  const int device = prop->location.id;
  if (size > s.config.memory - s.used[device]) return CUDA_ERROR_OUT_OF_MEMORY;

  int fd = NewMemfd(device, size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  auto a = std::make_shared<Allocation>(fd, size, device, true);
  s.used[device] += size;
  a->exportable = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  if (CUresult rc = MapView(*a); rc != CUDA_SUCCESS) return rc;
  *handle = NewHandle(s, std::move(a));
  return CUDA_SUCCESS;
}

CUresult Release(CUmemGenericAllocationHandle handle) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemRelease"); rc != CUDA_SUCCESS) return rc;
  // Allowed while mapped: the mappings keep the memory.
  if (s.handles.erase(handle) == 0) {
    ++s.bad_releases;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult Export(void* out, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                unsigned long long flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemExportToShareableHandle"); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // Only a type requested at create can be exported (openucx/ucx#11548).
  if (!it->second->exportable) return CUDA_ERROR_INVALID_VALUE;
  int fd = ::fcntl(it->second->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}

}  // namespace

int DeviceOfFd(int fd) {
  char link[256];
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  if (n <= 0) return -1;
  link[n] = '\0';
  int device = -1;
  if (std::sscanf(link, "/memfd:cuda-double:dev%d", &device) != 1) return -1;
  return device;
}

namespace {

CUresult Import(CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemImportFromShareableHandle"); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  const int device = DeviceOfFd(fd);
  struct stat st {};
  if (device < 0 || device >= s.config.devices || ::fstat(fd, &st) != 0 || st.st_size <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  // The caller keeps (and must close) its fd; the allocation holds its own.
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  auto a = std::make_shared<Allocation>(own, static_cast<size_t>(st.st_size), device, false);
  a->exportable = true;
  if (CUresult rc = MapView(*a); rc != CUDA_SUCCESS) return rc;
  *handle = NewHandle(s, std::move(a));  // a fresh handle per import
  return CUDA_SUCCESS;
}

CUresult AddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemAddressReserve"); rc != CUDA_SUCCESS) return rc;
  if (ptr == nullptr || flags != 0 || size == 0 || !Aligned(size, kHostPage) ||
      (addr != 0 && !Aligned(addr, kHostPage)))
    return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Reservations start on the granularity at least, so whole allocations map
  // at their base.
  const size_t align = std::max(alignment, s.config.granularity);
  const size_t span = size + align;
  if (span < size) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = ::mmap(reinterpret_cast<void*>(addr), span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = (raw + align - 1) / align * align;
  if (base > raw) ::munmap(p, base - raw);
  if (raw + span > base + size) ::munmap(reinterpret_cast<void*>(base + size), raw + span - (base + size));
  s.reservations.emplace(base, size);
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult AddressFree(CUdeviceptr ptr, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemAddressFree"); rc != CUDA_SUCCESS) return rc;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  ::munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

bool InsideReservation(const State& s, CUdeviceptr ptr, size_t size) {
  auto it = s.reservations.upper_bound(ptr);
  if (it == s.reservations.begin()) return false;
  --it;
  return ptr >= it->first && ptr + size >= ptr && ptr + size <= it->first + it->second;
}

bool OverlapsMapping(const State& s, CUdeviceptr ptr, size_t size) {
  auto it = s.mappings.lower_bound(ptr);
  if (it != s.mappings.end() && it->first < ptr + size) return true;
  if (it == s.mappings.begin()) return false;
  --it;
  return it->first + it->second.size > ptr;
}

CUresult Map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
             unsigned long long flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemMap"); rc != CUDA_SUCCESS) return rc;
  if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  const Allocation& a = *it->second;
  // The codes an H200's driver (580) answered (scripts/device-check's probe
  // and cuda_double_tests there): CUDA_ERROR_NOT_SUPPORTED for a misaligned
  // address, a range past the allocation, a nonzero offset ("currently must
  // be zero") and a map over a mapping.
  const size_t g = s.config.granularity;
  if (!Aligned(size, g) || (offset != 0 && !Aligned(offset, g))) return CUDA_ERROR_INVALID_VALUE;
  if (!Aligned(ptr, g)) return CUDA_ERROR_NOT_SUPPORTED;
  if (offset != 0 && s.config.strict_offset) return CUDA_ERROR_NOT_SUPPORTED;
  if (offset > a.size || size > a.size - offset) return CUDA_ERROR_NOT_SUPPORTED;
  // (That driver mapped a range running past its reservation; the double
  // refuses it, a rule membroker keeps anyway.)
  if (!InsideReservation(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  if (OverlapsMapping(s, ptr, size)) return CUDA_ERROR_NOT_SUPPORTED;
  s.mappings.emplace(ptr, Mapping{size, offset, it->second, {}});
  return CUDA_SUCCESS;
}

// The mappings that exactly tile [ptr, ptr + size), or an empty range.
std::pair<std::map<CUdeviceptr, Mapping>::iterator, std::map<CUdeviceptr, Mapping>::iterator> WholeMappings(
    State& s, CUdeviceptr ptr, size_t size) {
  auto first = s.mappings.find(ptr);
  if (first == s.mappings.end() || size == 0) return {s.mappings.end(), s.mappings.end()};
  CUdeviceptr at = ptr;
  auto it = first;
  while (it != s.mappings.end() && it->first == at && at < ptr + size) {
    at += it->second.size;
    ++it;
  }
  if (at != ptr + size) return {s.mappings.end(), s.mappings.end()};
  return {first, it};
}

CUresult Unmap(CUdeviceptr ptr, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemUnmap"); rc != CUDA_SUCCESS) return rc;
  auto [first, last] = WholeMappings(s, ptr, size);
  if (first == last) return CUDA_ERROR_INVALID_VALUE;  // no sub-ranges
  s.mappings.erase(first, last);
  return CUDA_SUCCESS;
}

CUresult SetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemSetAccess"); rc != CUDA_SUCCESS) return rc;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (!ValidDevice(s, desc[i].location)) return CUDA_ERROR_INVALID_DEVICE;
    const unsigned f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  // "a fully mapped address range containing all allocations created by cuMemMap"
  auto [first, last] = WholeMappings(s, ptr, size);
  if (first == last) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = first; it != last; ++it)
    for (size_t i = 0; i < count; ++i) it->second.access[desc[i].location.id] = desc[i].flags;
  return CUDA_SUCCESS;
}

CUresult GetInfo(size_t* free_bytes, size_t* total) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemGetInfo"); rc != CUDA_SUCCESS) return rc;
  if (free_bytes == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int device = DeviceOf(CurrentContext());
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  // Per process: the double cannot see what other processes created.
  *total = s.config.memory;
  *free_bytes = s.config.memory - s.used[device];
  return CUDA_SUCCESS;
}

CUresult HostRegister(void* p, size_t size, unsigned int flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemHostRegister"); rc != CUDA_SUCCESS) return rc;
  (void)flags;
  if (CurrentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (p == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  auto it = s.host_registered.lower_bound(at);
  if (it != s.host_registered.end() && it->first < at + size) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (it != s.host_registered.begin() && std::prev(it)->first + std::prev(it)->second > at)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  s.host_registered.emplace(at, size);
  return CUDA_SUCCESS;
}

CUresult HostUnregister(void* p) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemHostUnregister"); rc != CUDA_SUCCESS) return rc;
  if (s.host_registered.erase(reinterpret_cast<uintptr_t>(p)) == 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  return CUDA_SUCCESS;
}

const Entry kEntries[] = {
    MBFAKE_ENTRY(cuMemGetAllocationGranularity, GetAllocationGranularity),
    MBFAKE_ENTRY(cuMemCreate, Create),
    MBFAKE_ENTRY(cuMemRelease, Release),
    MBFAKE_ENTRY(cuMemExportToShareableHandle, Export),
    MBFAKE_ENTRY(cuMemImportFromShareableHandle, Import),
    MBFAKE_ENTRY(cuMemAddressReserve, AddressReserve),
    MBFAKE_ENTRY(cuMemAddressFree, AddressFree),
    MBFAKE_ENTRY(cuMemMap, Map),
    MBFAKE_ENTRY(cuMemUnmap, Unmap),
    MBFAKE_ENTRY(cuMemSetAccess, SetAccess),
    MBFAKE_ENTRY(cuMemGetInfo, GetInfo),
    MBFAKE_ENTRY(cuMemHostRegister, HostRegister),
    MBFAKE_ENTRY(cuMemHostUnregister, HostUnregister),
};

}  // namespace

std::span<const Entry> VmmEntries() { return kEntries; }

}  // namespace mbfake
