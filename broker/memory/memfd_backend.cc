// The memfd backend (backend.h): host memory as sealed memfds.
#include "memory/backend.h"

namespace membroker::broker {

namespace {

class Memfd final : public PhysicalBackend {
 public:
  std::string_view name() const override { return "memfd"; }
  ipc::Granularity Granularity(ipc::PagePolicy policy) const override {
    return ipc::GranularityFor(policy);
  }
  uint64_t MaxBytes(const MemorySpec& spec) const override {
    return ipc::RoundUp(spec.size, ipc::PreferredPageSize(spec.policy, spec.size));
  }
  Result<PhysicalMemory> Create(const MemorySpec& spec) override {
    MB_ASSIGN_OR_RETURN(PhysicalMemory mem,
                        CreatePhysicalMemory(spec.name, spec.size, spec.policy));
    if (spec.pinned) MB_RETURN_IF_ERROR(Pin(&mem));
    return mem;
  }
  Result<ipc::UniqueFd> ReadOnlyFd(const PhysicalMemory& mem) const override {
    return ReopenReadOnly(mem.fd.get());
  }
  void Release(PhysicalMemory mem) override {
    // Unlocking and closing the last fd gives the pages back to the kernel.
    mem.lock = LockedMapping();
    mem.fd.reset();
  }
};

}  // namespace

PhysicalBackend& MemfdBackend() {
  static Memfd backend;
  return backend;
}

}  // namespace membroker::broker
