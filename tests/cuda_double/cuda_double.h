// The CUDA driver double's controls for tests. The double itself is a shared
// library named libcuda.so.1 (tests/cuda_double/), found by the same
// dlopen("libcuda.so.1") that finds the real driver when a test runs with
// LD_LIBRARY_PATH pointing at it; production code has no switch for it.
//
// A test reaches these functions with dlsym on the library the driver loader
// opened (RTLD_NOLOAD), so the same test binary also runs against a real
// driver, where they are absent and the checks that need them are skipped.
//
// Configuration by environment, read at cuInit (so a broker started by a test
// gets it too):
//   MBFAKE_CUDA_DEVICES=N          devices (default 1)
//   MBFAKE_CUDA_MEMORY=BYTES       memory per device (default 1 GiB)
//   MBFAKE_CUDA_GRANULARITY=BYTES  minimum granularity (default 2 MiB)
//   MBFAKE_CUDA_RECOMMENDED=BYTES  recommended granularity (default 2 MiB)
//   MBFAKE_CUDA_STRICT_OFFSET=0    cuMemMap takes aligned nonzero offsets, which
//                                  the driver refuses (CUDA_ERROR_NOT_SUPPORTED)
//   MBFAKE_CUDA_FAIL=CALL:N:CODE[,...]  the Nth call of CALL (counted from
//                                  cuInit) returns CODE and does nothing
#pragma once

#include <cstdint>

extern "C" {

struct mbfake_cuda_counters {
  uint64_t allocations;      // live physical allocations in this process
  uint64_t handles;          // unreleased handles (created or imported)
  uint64_t mappings;         // live cuMemMap mappings
  uint64_t reservations;     // live cuMemAddressReserve ranges
  uint64_t memfds;           // open fds in this process to any double's memory
  uint64_t host_registered;  // live cuMemHostRegister ranges
  uint64_t bad_releases;     // cuMemRelease of a handle that is not one (undefined on a GPU)
};

// The double's state in this process.
void mbfake_cuda_get_counters(mbfake_cuda_counters* out);
// The nth call (1-based, counted from now) of `call` ("cuMemCreate", ...)
// returns `code` and does nothing; nth 0 disarms.
void mbfake_cuda_fail(const char* call, int nth, int code);
// Every later call returns `code` (0 clears), like an error left by an
// earlier asynchronous launch.
void mbfake_cuda_sticky(int code);
// cuMemMap refuses nonzero offsets (1, the default, as the driver) or allows aligned ones (0).
void mbfake_cuda_strict_offset(int on);

}  // extern "C"
