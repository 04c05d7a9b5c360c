// The double's copies (cuMemcpyHtoD/DtoH/DtoD and cuMemsetD8): the only way
// tests and membroker touch device bytes, as on a GPU. A copy needs a current
// context; the device range must be mapped, and the context's device must
// have been given access (read for a source, read-write for a destination),
// else CUDA_ERROR_ILLEGAL_ADDRESS, the fault a GPU's copy engine would take.
#include <algorithm>
#include <cstring>
#include <vector>

#include "entries.h"
#include "state.h"

namespace mbfake {

namespace {

// Calls `each(bytes, n)` for the pieces of [ptr, ptr + size), in order.
template <typename Each>
CUresult Walk(State& s, CUdeviceptr ptr, size_t size, bool write, Each each) {
  const int device = DeviceOf(CurrentContext());
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (ptr + size < ptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr at = ptr;
  while (at < ptr + size) {
    auto it = s.mappings.upper_bound(at);
    if (it == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    const Mapping& m = it->second;
    if (at >= it->first + m.size) return CUDA_ERROR_INVALID_VALUE;  // not mapped
    auto access = m.access.find(device);
    const unsigned need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
    if (access == m.access.end() || (access->second & need) != need) return CUDA_ERROR_ILLEGAL_ADDRESS;
    const size_t n = std::min<size_t>(ptr + size - at, it->first + m.size - at);
    each(m.alloc->view + m.offset + (at - it->first), n);
    at += n;
  }
  return CUDA_SUCCESS;
}

// Checks the whole range before moving a byte, so a refused copy changes nothing.
CUresult Check(State& s, CUdeviceptr ptr, size_t size, bool write) {
  return Walk(s, ptr, size, write, [](unsigned char*, size_t) {});
}

CUresult HtoD(CUdeviceptr dst, const void* src, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemcpyHtoD"); rc != CUDA_SUCCESS) return rc;
  if (src == nullptr && size != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = Check(s, dst, size, true); rc != CUDA_SUCCESS) return rc;
  const auto* from = static_cast<const unsigned char*>(src);
  return Walk(s, dst, size, true, [&](unsigned char* to, size_t n) {
    std::memcpy(to, from, n);
    from += n;
  });
}

CUresult DtoH(void* dst, CUdeviceptr src, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemcpyDtoH"); rc != CUDA_SUCCESS) return rc;
  if (dst == nullptr && size != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = Check(s, src, size, false); rc != CUDA_SUCCESS) return rc;
  auto* to = static_cast<unsigned char*>(dst);
  return Walk(s, src, size, false, [&](unsigned char* from, size_t n) {
    std::memcpy(to, from, n);
    to += n;
  });
}

CUresult DtoD(CUdeviceptr dst, CUdeviceptr src, size_t size) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemcpyDtoD"); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = Check(s, src, size, false); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = Check(s, dst, size, true); rc != CUDA_SUCCESS) return rc;
  // Through a bounce buffer, so overlapping ranges (or one allocation mapped
  // twice) copy as memmove would.
  std::vector<unsigned char> bounce(std::min<size_t>(size, 4u << 20));
  for (size_t done = 0; done < size;) {
    const size_t n = std::min(bounce.size(), size - done);
    unsigned char* in = bounce.data();
    (void)Walk(s, src + done, n, false, [&](unsigned char* from, size_t k) {
      std::memcpy(in, from, k);
      in += k;
    });
    const unsigned char* out = bounce.data();
    (void)Walk(s, dst + done, n, true, [&](unsigned char* to, size_t k) {
      std::memcpy(to, out, k);
      out += k;
    });
    done += n;
  }
  return CUDA_SUCCESS;
}

CUresult SetD8(CUdeviceptr dst, unsigned char value, size_t count) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuMemsetD8"); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = Check(s, dst, count, true); rc != CUDA_SUCCESS) return rc;
  return Walk(s, dst, count, true, [&](unsigned char* to, size_t n) { std::memset(to, value, n); });
}

const Entry kEntries[] = {
    MBFAKE_ENTRY(cuMemcpyHtoD, HtoD),
    MBFAKE_ENTRY(cuMemcpyDtoH, DtoH),
    MBFAKE_ENTRY(cuMemcpyDtoD, DtoD),
    MBFAKE_ENTRY(cuMemsetD8, SetD8),
};

}  // namespace

std::span<const Entry> CopyEntries() { return kEntries; }

}  // namespace mbfake
