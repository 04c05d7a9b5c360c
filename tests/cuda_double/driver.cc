// The double's driver-wide calls: cuInit, versions, devices, primary
// contexts, error strings, cuGetProcAddress, and the test controls
// (cuda_double.h).
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_double.h"
#include "entries.h"
#include "state.h"

namespace mbfake {

namespace {

constexpr int kMaxDevices = 64;

struct PrimaryContext {
  int device = 0;
  int retains = 0;
};
PrimaryContext g_contexts[kMaxDevices];
thread_local CUcontext t_current = nullptr;

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 0);
  return end != nullptr && *end == '\0' ? n : fallback;
}

// "CALL:N:CODE,CALL:N:CODE"
void ParseFaults(State& s, const char* spec) {
  std::string all = spec != nullptr ? spec : "";
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    size_t a = item.find(':');
    size_t b = a == std::string::npos ? a : item.find(':', a + 1);
    if (b != std::string::npos)
      s.faults[item.substr(0, a)] = {std::atoi(item.substr(a + 1, b - a - 1).c_str()),
                                     std::atoi(item.substr(b + 1).c_str())};
    start = end + 1;
  }
}

CUresult Init(unsigned int flags) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  s.config.devices = static_cast<int>(EnvNumber("MBFAKE_CUDA_DEVICES", 1));
  if (s.config.devices < 0 || s.config.devices > kMaxDevices) s.config.devices = 1;
  s.config.memory = EnvNumber("MBFAKE_CUDA_MEMORY", 1ull << 30);
  s.config.granularity = EnvNumber("MBFAKE_CUDA_GRANULARITY", 2u << 20);
  s.config.recommended = EnvNumber("MBFAKE_CUDA_RECOMMENDED", s.config.granularity);
  s.config.strict_offset = EnvNumber("MBFAKE_CUDA_STRICT_OFFSET", 1) != 0;
  ParseFaults(s, std::getenv("MBFAKE_CUDA_FAIL"));
  for (int i = 0; i < kMaxDevices; ++i) g_contexts[i].device = i;
  if (s.config.devices == 0) return CUDA_ERROR_NO_DEVICE;  // and later calls: NOT_INITIALIZED
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult DriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult DeviceGetCount(int* count) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDeviceGetCount"); rc != CUDA_SUCCESS) return rc;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.config.devices;
  return CUDA_SUCCESS;
}

CUresult DeviceGet(CUdevice* device, int ordinal) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDeviceGet"); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult DeviceGetName(char* name, int len, CUdevice device) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDeviceGetName"); rc != CUDA_SUCCESS) return rc;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "membroker CUDA double %d", device);
  return CUDA_SUCCESS;
}

CUresult DeviceTotalMem(size_t* bytes, CUdevice device) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDeviceTotalMem"); rc != CUDA_SUCCESS) return rc;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = s.config.memory;
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDevicePrimaryCtxRetain"); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  ++g_contexts[device].retains;
  *ctx = reinterpret_cast<CUcontext>(&g_contexts[device]);
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRelease(CUdevice device) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuDevicePrimaryCtxRelease"); rc != CUDA_SUCCESS) return rc;
  if (device < 0 || device >= s.config.devices) return CUDA_ERROR_INVALID_DEVICE;
  if (g_contexts[device].retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --g_contexts[device].retains;
  return CUDA_SUCCESS;
}

CUresult CtxSetCurrent(CUcontext ctx) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuCtxSetCurrent"); rc != CUDA_SUCCESS) return rc;
  if (ctx != nullptr && (DeviceOf(ctx) < 0 || g_contexts[DeviceOf(ctx)].retains == 0))
    return CUDA_ERROR_INVALID_CONTEXT;
  t_current = ctx;
  return CUDA_SUCCESS;
}

CUresult CtxGetCurrent(CUcontext* ctx) {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuCtxGetCurrent"); rc != CUDA_SUCCESS) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = t_current;
  return CUDA_SUCCESS;
}

CUresult CtxSynchronize() {
  State& s = Get();
  std::lock_guard lock(s.mu);
  if (CUresult rc = Enter(s, "cuCtxSynchronize"); rc != CUDA_SUCCESS) return rc;
  return t_current != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

struct ErrorName {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

CUresult GetErrorString(CUresult code, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorName& e : kErrors)
    if (e.code == code) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult GetErrorName(CUresult code, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorName& e : kErrors)
    if (e.code == code) {
      *name = e.name;
      return CUDA_SUCCESS;
    }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

const Entry kEntries[] = {
    MBFAKE_ENTRY(cuInit, Init),
    MBFAKE_ENTRY(cuDriverGetVersion, DriverGetVersion),
    MBFAKE_ENTRY(cuDeviceGetCount, DeviceGetCount),
    MBFAKE_ENTRY(cuDeviceGet, DeviceGet),
    MBFAKE_ENTRY(cuDeviceGetName, DeviceGetName),
    MBFAKE_ENTRY(cuDeviceTotalMem, DeviceTotalMem),
    MBFAKE_ENTRY(cuDevicePrimaryCtxRetain, PrimaryCtxRetain),
    MBFAKE_ENTRY(cuDevicePrimaryCtxRelease, PrimaryCtxRelease),
    MBFAKE_ENTRY(cuCtxSetCurrent, CtxSetCurrent),
    MBFAKE_ENTRY(cuCtxGetCurrent, CtxGetCurrent),
    MBFAKE_ENTRY(cuCtxSynchronize, CtxSynchronize),
    MBFAKE_ENTRY(cuGetErrorString, GetErrorString),
    MBFAKE_ENTRY(cuGetErrorName, GetErrorName),
};

}  // namespace

State& Get() {
  static State* state = new State;  // never destroyed: calls may come from exit handlers
  return *state;
}

CUresult Enter(State& s, const char* call) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (s.sticky != 0) return static_cast<CUresult>(s.sticky);
  auto it = s.faults.find(call);
  if (it != s.faults.end() && it->second.first > 0 && --it->second.first == 0) {
    CUresult code = static_cast<CUresult>(it->second.second);
    s.faults.erase(it);
    return code;
  }
  return CUDA_SUCCESS;
}

CUcontext CurrentContext() { return t_current; }

int DeviceOf(CUcontext ctx) {
  auto* p = reinterpret_cast<PrimaryContext*>(ctx);
  if (p < &g_contexts[0] || p >= &g_contexts[kMaxDevices]) return -1;
  return p->device;
}

std::span<const Entry> DriverEntries() { return kEntries; }

}  // namespace mbfake

extern "C" {

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                                    cuuint64_t flags,
                                                                    CUdriverProcAddressQueryResult* status) {
  (void)version;
  (void)flags;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (auto table : {mbfake::DriverEntries(), mbfake::VmmEntries(), mbfake::CopyEntries(), mbfake::LegacyEntries()})
    for (const mbfake::Entry& e : table)
      if (std::strcmp(e.name, symbol) == 0) {
        *pfn = e.fn;
        if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
      }
  *pfn = nullptr;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

__attribute__((visibility("default"))) void mbfake_cuda_get_counters(mbfake_cuda_counters* out) {
  mbfake::State& s = mbfake::Get();
  std::lock_guard lock(s.mu);
  *out = {};
  out->allocations = s.allocations;
  out->handles = s.handles.size();
  out->mappings = s.mappings.size();
  out->reservations = s.reservations.size();
  out->host_registered = s.host_registered.size();
  out->bad_releases = s.bad_releases;
  // Every fd in this process to a double's memfd: the double's own, and any
  // exported one not closed yet.
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(dir)) {
      char link[256];
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
      if (n > 0 && std::string_view(link, static_cast<size_t>(n)).starts_with("/memfd:cuda-double")) ++out->memfds;
    }
    ::closedir(dir);
  }
}

__attribute__((visibility("default"))) void mbfake_cuda_fail(const char* call, int nth, int code) {
  mbfake::State& s = mbfake::Get();
  std::lock_guard lock(s.mu);
  if (nth <= 0)
    s.faults.erase(call);
  else
    s.faults[call] = {nth, code};
}

__attribute__((visibility("default"))) void mbfake_cuda_sticky(int code) {
  mbfake::State& s = mbfake::Get();
  std::lock_guard lock(s.mu);
  s.sticky = code;
}

__attribute__((visibility("default"))) void mbfake_cuda_strict_offset(int on) {
  mbfake::State& s = mbfake::Get();
  std::lock_guard lock(s.mu);
  s.config.strict_offset = on != 0;
}

}  // extern "C"
