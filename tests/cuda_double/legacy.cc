// The double's legacy allocations and legacy IPC (cuMemAlloc, cuMemFree,
// cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle): what programs
// used before the VMM calls, and the peer the device hand-off benchmark
// measures membroker against. The rules kept are the documented ones:
//   - a legacy allocation is mapped and accessible to its device at once;
//   - cuMemFree takes an allocation's base address only; cuIpcGetMemHandle
//     any address inside one (an H200's driver, 580, gave a handle for an
//     interior address), and the handle opens at the allocation's base;
//   - a handle opens in another process only: in the process that made it
//     the driver answered CUDA_ERROR_INVALID_CONTEXT (on that H200 too); and
//     opening needs a current context;
//   - what cuIpcOpenMemHandle mapped is undone by cuIpcCloseMemHandle only.
// A handle names the exporter's pid and the memfd's fd number; the importer
// opens it through /proc, so an exporter that is gone cannot be opened
// (CUDA_ERROR_INVALID_VALUE), as its memory is gone on a GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "entries.h"
#include "state.h"

namespace mbfake {

namespace {

constexpr char kMagic[8] = {'m', 'b', 'f', 'a', 'k', 'e', 'i', 'p'};

struct IpcPayload {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t size;
  int32_t device;
};
static_assert(sizeof(IpcPayload) <= sizeof(CUipcMemHandle));

size_t PageRound(size_t n) { return (n + kHostPage - 1) / kHostPage * kHostPage; }

// A PROT_NONE range for `a`, mapped for `device`'s access, as the driver
// returns a legacy allocation or an opened handle: ready for copies at once.
CUresult MapLegacy(State& s, std::shared_ptr<Allocation> a, int device, bool allocated, CUdeviceptr* out) {
  const size_t span = PageRound(a->size);
  void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(p);
  const size_t size = a->size;
  s.mappings.emplace(va, Mapping{size, 0, std::move(a), {{device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}}});
  s.legacy.emplace(va, allocated);
  *out = va;
  return CUDA_SUCCESS;
}

// Undoes MapLegacy for a base of the given kind.
CUresult UnmapLegacy(State& s, CUdeviceptr va, bool allocated) {
  auto it = s.legacy.find(va);
  if (it == s.legacy.end() || it->second != allocated) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mappings.find(va);
  ::munmap(reinterpret_cast<void*>(va), PageRound(m->second.size));
  s.mappings.erase(m);
  s.legacy.erase(it);
  return CUDA_SUCCESS;
}

CUresult MemAlloc(CUdeviceptr* dptr, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemAlloc"); rc != CUDA_SUCCESS) return rc;
  const int device = DeviceOf(CurrentContext());
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (size > s.config.memory - s.used[device]) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = NewMemfd(device, size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  auto a = std::make_shared<Allocation>(fd, size, device, true);
  s.used[device] += size;
  if (CUresult rc = MapView(*a); rc != CUDA_SUCCESS) return rc;
  return MapLegacy(s, std::move(a), device, true, dptr);
}

CUresult MemFree(CUdeviceptr dptr) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemFree"); rc != CUDA_SUCCESS) return rc;
  return UnmapLegacy(s, dptr, true);
}

CUresult IpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuIpcGetMemHandle"); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The cuMemAlloc allocation that holds dptr.
  auto it = s.legacy.upper_bound(dptr);
  if (it == s.legacy.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  const Mapping& m = s.mappings.at(it->first);
  if (!it->second || dptr >= it->first + m.size) return CUDA_ERROR_INVALID_VALUE;
  const Allocation& a = *m.alloc;
  IpcPayload p{};
  std::memcpy(p.magic, kMagic, sizeof kMagic);
  p.pid = static_cast<int32_t>(::getpid());
  p.fd = a.fd;
  p.size = a.size;
  p.device = a.device;
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &p, sizeof p);
  return CUDA_SUCCESS;
}

CUresult IpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuIpcOpenMemHandle"); rc != CUDA_SUCCESS) return rc;
  const int device = DeviceOf(CurrentContext());
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == nullptr || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload p{};
  std::memcpy(&p, handle.reserved, sizeof p);
  if (std::memcmp(p.magic, kMagic, sizeof kMagic) != 0 || p.device < 0 || p.device >= s.config.devices)
    return CUDA_ERROR_INVALID_VALUE;
  if (p.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(p.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // the exporter or its allocation is gone
  struct stat st {};
  if (DeviceOfFd(fd) != p.device || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != p.size) {
    ::close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto a = std::make_shared<Allocation>(fd, p.size, p.device, false);
  if (CUresult rc = MapView(*a); rc != CUDA_SUCCESS) return rc;
  return MapLegacy(s, std::move(a), device, false, dptr);
}

CUresult IpcCloseMemHandle(CUdeviceptr dptr) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuIpcCloseMemHandle"); rc != CUDA_SUCCESS) return rc;
  return UnmapLegacy(s, dptr, false);
}

const Entry kEntries[] = {
    MBFAKE_ENTRY(cuMemAlloc, MemAlloc),
    MBFAKE_ENTRY(cuMemFree, MemFree),
    MBFAKE_ENTRY(cuIpcGetMemHandle, IpcGetMemHandle),
    MBFAKE_ENTRY(cuIpcOpenMemHandle, IpcOpenMemHandle),
    MBFAKE_ENTRY(cuIpcCloseMemHandle, IpcCloseMemHandle),
};

}  // namespace

std::span<const Entry> LegacyEntries() { return kEntries; }

}  // namespace mbfake
