// The client's device memory path: the CUDA driver's VMM calls behind
// MallocPhysical, ImportFromShareableHandle, ReserveMemAddress(kReserveDevice),
// MapMem, MemSetAccess, UnmapMem and ReleaseMemAddress for memory on a CUDA
// device. ClientCore keeps the bookkeeping (what is mapped where); these
// functions only talk to the driver, and say why when there is none
// (UNSUPPORTED) or when it refuses (the driver's error name and text).
#pragma once

#include <cstddef>
#include <cstdint>

#include "membroker/client.h"
#include "membroker/status.h"

namespace membroker::detail::device {

// A driver handle for the memory behind `fd` (cuMemImportFromShareableHandle;
// the fd stays the caller's). Each import is a fresh handle.
Result<uint64_t> Import(int fd, int device);
Status ReleaseHandle(uint64_t handle);

// Device virtual addresses (cuMemAddressReserve / cuMemAddressFree).
Result<uintptr_t> Reserve(size_t size, size_t alignment, uintptr_t hint);
Status Free(uintptr_t va, size_t size);

// cuMemMap, then cuMemSetAccess for `device` (undone if that fails).
Status Map(uintptr_t va, size_t size, size_t offset, uint64_t handle, int device, Access access);
Status Unmap(uintptr_t va, size_t size);
Status SetAccess(uintptr_t va, size_t size, int device, Access access);

// Host memory registered with the driver (cuMemHostRegister, portable), so
// device copies from and to it run at full speed: only where this thread has
// a current context (a CUDA program's), so that membroker never creates a
// context behind a program's back. true when this call registered it; false
// without a driver or a context, or when the program registered it itself.
Result<bool> RegisterHost(void* ptr, size_t size);
Status UnregisterHost(void* ptr);

// The memory behind `fd` (size bytes on `device`) mapped whole at a fresh
// device reservation with `access` (a transfer engine's view of a peer's
// memory); the mapping keeps the memory, the driver handle is released.
// Nothing is left behind on failure. UnmapWhole undoes it.
Result<uintptr_t> MapWhole(int fd, size_t size, int device, Access access);
Status UnmapWhole(uintptr_t va, size_t size);

// A copy of `size` bytes where at least one side is device memory (dst_device,
// src_device: which), with cuMemcpyDtoD, HtoD or DtoH. It runs in the calling
// thread's current context; a thread without one (an engine's caller that is
// no CUDA program, a worker thread) borrows `device`'s primary context, the
// one the CUDA runtime uses, retained once per process and current only for
// the copy.
Status Copy(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t size, int device);

// The minimum granularity of `device`'s memory.
Result<size_t> Granularity(int device);

}  // namespace membroker::detail::device
