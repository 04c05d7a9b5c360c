#include "client/client_core.h"
#include "client/device_vmm.h"
#include "client/hangup_watcher.h"

#include <sys/mman.h>

#include <new>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/page_policy.h"
#include "membroker/ipc/ranges.h"
#include "membroker/ipc/syscall.h"

namespace membroker::detail {

namespace {
constexpr uintptr_t kPage = 4096;

// Puts [va, va+size) back to an inaccessible, reserved state.
Status ReserveFixed(uintptr_t va, size_t size) {
  void* out = nullptr;
  return ipc::CheckedCall("mmap", "reserve " + ipc::Hex(va) + "+" + std::to_string(size), &out, [&] {
    return ::mmap(reinterpret_cast<void*>(va), size, PROT_NONE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  });
}
}  // namespace

ClientCore::~ClientCore() {
  if (CurrentPid() != owner_pid_) {
    // A forked child's copy: the reattach thread and the connection are the
    // parent's. Neither is stopped, joined or told goodbye; this copy's fds
    // just close. The thread handle is parked where no destructor runs (a
    // joinable std::thread's would terminate the process).
    alignas(std::thread) static unsigned char parked[sizeof(std::thread)];
    if (reattacher_.joinable()) new (parked) std::thread(std::move(reattacher_));
    return;
  }
  HangupWatcher::Get().Forget(this);  // no reattach starts after this
  if (reattacher_.joinable()) {
    const uint64_t one = 1;
    if (::write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) {
      // An eventfd write fails only on overflow: the reattach has been told already.
    }
    reattacher_.join();
    HangupWatcher::Get().Forget(this);  // a reattach that finished meanwhile watched again
  }
  // Unmap before the connection closes: the broker releases our references
  // when it sees the socket close.
  for (auto& [base, r] : reservations_) ::munmap(reinterpret_cast<void*>(base), r.size);
  (void)conn_.SendOneWay(ipc::GoodbyeRequest{});
}

Result<size_t> ClientCore::Granularity(PagePolicy policy, GranularityOption option) const {
  for (const auto& g : granularities_)
    if (static_cast<uint8_t>(g.policy) == static_cast<uint8_t>(policy))
      return static_cast<size_t>(option == GranularityOption::kMinimum ? g.minimum
                                                                         : g.recommended);
  return Status(ErrorCode::kParamInvalid, "unknown page policy");
}

void ClientCore::AddHandle(uint64_t id, ipc::UniqueFd fd, uint64_t size, uint64_t page_size, bool read_only,
                           uint64_t fixed_address, bool pinned, bool created, int device) {
  std::lock_guard<std::mutex> lk(mu_);
  HeldAllocation& h = handles_[id];
  h.device = device;
  h.pinned = pinned;
  h.created = created;
  h.fd = std::move(fd);
  h.size = size;
  h.page_size = page_size;
  h.read_only = read_only;
  h.fixed_address = fixed_address;
}

bool ClientCore::HoldsUnfreed(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = handles_.find(id);
  return it != handles_.end() && !it->second.user_released;
}

Status ClientCore::FreeHandle(uint64_t id) {
  Frees frees;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end() || it->second.user_released)
      return Status(ErrorCode::kInvalidHandle, "handle " + std::to_string(id) + " is not held (already freed?)");
    it->second.user_released = true;
    if (it->second.mappings > 0) return Status::Ok();  // released with the last mapping
    ForgetHandle(it, &frees);
  }
  return SendFrees(frees);
}

void ClientCore::ForgetHandle(std::unordered_map<uint64_t, HeldAllocation>::iterator it, Frees* frees) {
  const uint64_t id = it->first;
  const bool detached = it->second.detached;
  if (it->second.cu_handle != 0) (void)device::ReleaseHandle(it->second.cu_handle);  // its mappings are gone
  handles_.erase(it);
  if (!detached) frees->push_back(id);  // (a detached handle the broker does not know)
}

void ClientCore::DropMappingRef(uint64_t handle, Frees* frees) {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  if (--it->second.mappings == 0 && it->second.user_released) ForgetHandle(it, frees);
}

Status ClientCore::SendFrees(const Frees& frees) {
  Status first = Status::Ok();
  for (uint64_t id : frees) {
    Status st = conn_.SendOneWay(ipc::FreeRequest{id});
    if (st.code() == ErrorCode::kNotConnected && options_.reattach) {
      // No broker now: the next one, if it takes this handle back, hears of it.
      journal_.AddLostFree(id);
      continue;
    }
    if (first.ok()) first = st;
  }
  return first;
}

Result<void*> ClientCore::Reserve(size_t size, size_t alignment, void* expected, uint32_t flags) {
  if (size == 0 || size % kPage != 0)
    return Status(ErrorCode::kParamInvalid,
                  "reservation size " + std::to_string(size) + " must be a non-zero multiple of 4096");
  if (flags & ~(kReserveFixed | kReserveDevice))
    return Status(ErrorCode::kParamInvalid, "unknown reserve flags " + std::to_string(flags));
  if ((flags & kReserveFixed) && expected == nullptr)
    return Status(ErrorCode::kParamInvalid, "kReserveFixed needs an expected address");
  if (flags & kReserveDevice) return ReserveDevice(size, alignment, expected, flags);
  if (alignment == 0) {
    // The largest page size that divides size, so huge pages can map at base.
    alignment = size % ipc::kHuge1GPageSize == 0   ? ipc::kHuge1GPageSize
                : size % ipc::kHuge2MPageSize == 0 ? ipc::kHuge2MPageSize
                                                   : kPage;
    if (expected != nullptr) alignment = kPage;  // the caller chose the address
  }
  if ((alignment & (alignment - 1)) != 0 || alignment < kPage)
    return Status(ErrorCode::kParamInvalid,
                  "alignment " + std::to_string(alignment) + " must be a power of two >= 4096");
  const int mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  uintptr_t base = 0;
  if (expected != nullptr && reinterpret_cast<uintptr_t>(expected) % alignment == 0) {
    void* p = ::mmap(expected, size, PROT_NONE, mflags | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == expected) base = reinterpret_cast<uintptr_t>(p);
    else if (p != MAP_FAILED) ::munmap(p, size);  // old kernels treat it as a hint
  }
  if (base == 0 && (flags & kReserveFixed))
    return Status(ErrorCode::kAddressInUse,
                  "range " + ipc::Hex(reinterpret_cast<uintptr_t>(expected)) + "+" + std::to_string(size) +
                      " is not free in this process (or not aligned to " + std::to_string(alignment) + ")");
  if (base == 0) {
    // Over-reserve, then trim both ends to the alignment.
    size_t span = size + (alignment > kPage ? alignment : 0);
    if (span < size) return Status(ErrorCode::kParamInvalid, "reservation size overflows");
    void* p = nullptr;
    MB_RETURN_IF_ERROR(ipc::CheckedCall("mmap", "reserve size=" + std::to_string(span), &p,
                                        [&] { return ::mmap(nullptr, span, PROT_NONE, mflags, -1, 0); }));
    uintptr_t raw = reinterpret_cast<uintptr_t>(p);
    base = (raw + alignment - 1) & ~(alignment - 1);
    if (base > raw) ::munmap(p, base - raw);
    if (raw + span > base + size) ::munmap(reinterpret_cast<void*>(base + size), raw + span - base - size);
  }
  std::lock_guard<std::mutex> lk(mu_);
  reservations_[base] = ReservationState{size, false, {}};
  return reinterpret_cast<void*>(base);
}

Result<void*> ClientCore::ReserveDevice(size_t size, size_t alignment, void* expected, uint32_t flags) {
  if (alignment != 0 && (alignment & (alignment - 1)) != 0)
    return Status(ErrorCode::kParamInvalid, "alignment " + std::to_string(alignment) + " must be a power of two");
  const uintptr_t hint = reinterpret_cast<uintptr_t>(expected);
  MB_ASSIGN_OR_RETURN(uintptr_t base, device::Reserve(size, alignment, hint));
  if ((flags & kReserveFixed) && base != hint) {
    (void)device::Free(base, size);
    return Status(ErrorCode::kAddressInUse, "the driver did not reserve device range " + ipc::Hex(hint) + "+" +
                                                std::to_string(size) + " (it offered " + ipc::Hex(base) + ")");
  }
  std::lock_guard<std::mutex> lk(mu_);
  reservations_[base] = ReservationState{size, true, {}};
  return reinterpret_cast<void*>(base);
}

Status ClientCore::Release(void* base_ptr, bool force) {
  Frees frees;
  MB_RETURN_IF_ERROR(ReleaseReservation(reinterpret_cast<uintptr_t>(base_ptr), force, &frees));
  return SendFrees(frees);
}

Status ClientCore::ReleaseReservation(uintptr_t base, bool force, Frees* frees) {
  void* base_ptr = reinterpret_cast<void*>(base);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = reservations_.find(base);
  if (it == reservations_.end())
    return Status(ErrorCode::kNotFound, "no reservation starts at " + ipc::Hex(base));
  if (!it->second.mappings.empty() && !force)
    return Status(ErrorCode::kBusy, std::to_string(it->second.mappings.size()) +
                                        " mapping(s) still inside the reservation at " + ipc::Hex(base) +
                                        "; unmap them first");
  MB_RETURN_IF_ERROR(CheckNotEngineRange(base, it->second.size, "released"));
  std::vector<uint64_t> handles;
  for (auto& [va, m] : it->second.mappings) handles.push_back(m.handle);
  if (it->second.device) {
    for (auto& [va, m] : it->second.mappings) MB_RETURN_IF_ERROR(device::Unmap(va, m.size));
    it->second.mappings.clear();
    MB_RETURN_IF_ERROR(device::Free(base, it->second.size));
  } else {
    MB_RETURN_IF_ERROR(
        ipc::CheckedCall<int>("munmap", ipc::Hex(base), nullptr, [&] { return ::munmap(base_ptr, it->second.size); }));
  }
  reservations_.erase(it);
  for (uint64_t h : handles) DropMappingRef(h, frees);
  return Status::Ok();
}

ReservationState* ClientCore::FindReservation(uintptr_t va, size_t size) {
  auto it = ipc::Containing(reservations_, va, size, [](const ReservationState& r) { return r.size; });
  return it == reservations_.end() ? nullptr : &it->second;
}

Result<uint64_t> ClientCore::Map(void* va_ptr, size_t size, size_t offset, uint64_t handle,
                                 uint32_t flags) {
  uintptr_t va = reinterpret_cast<uintptr_t>(va_ptr);
  std::lock_guard<std::mutex> lk(mu_);
  auto h = handles_.find(handle);
  if (h == handles_.end() || h->second.user_released)
    return Status(ErrorCode::kInvalidHandle,
                  "handle " + std::to_string(handle) + " is not held (freed or never held)");
  const uint64_t page = h->second.page_size;
  if (size == 0 || size % page != 0 || offset % page != 0 || va % page != 0)
    return Status(ErrorCode::kParamInvalid,
                  "address " + ipc::Hex(va) + ", size " + std::to_string(size) + " and offset " +
                      std::to_string(offset) + " must be multiples of the page size " +
                      std::to_string(page) + " (size non-zero)");
  if (offset > h->second.size || size > h->second.size - offset)
    return Status(ErrorCode::kOutOfRange, "offset " + std::to_string(offset) + " + size " +
                                              std::to_string(size) + " passes the allocation's " +
                                              std::to_string(h->second.size) + " bytes");
  if (flags & ~kMapPopulate)
    return Status(ErrorCode::kParamInvalid, "unknown map flags " + std::to_string(flags));
  if (h->second.fixed_address != 0 && va != h->second.fixed_address + offset)
    return Status(ErrorCode::kParamInvalid,
                  "a same-address allocation maps only at its fixed address " +
                      ipc::Hex(h->second.fixed_address + offset));
  ReservationState* r = FindReservation(va, size);
  if (r == nullptr)
    return Status(ErrorCode::kOutOfRange,
                  "range " + ipc::Hex(va) + "+" + std::to_string(size) + " is not inside one reservation");
  if (ipc::Overlaps(r->mappings, va, size, [](const MappingState& m) { return m.size; }))
    return Status(ErrorCode::kOverlap, "range " + ipc::Hex(va) + "+" + std::to_string(size) +
                                           " overlaps a mapping in this reservation");
  HeldAllocation& held = h->second;
  if (r->device != (held.device >= 0))
    return Status(ErrorCode::kParamInvalid, held.device >= 0
                                                ? "device memory maps only into a device reservation (kReserveDevice)"
                                                : "host memory does not map into a device reservation");
  if (r->device) {
    if (held.cu_handle == 0) {
      MB_ASSIGN_OR_RETURN(held.cu_handle, device::Import(held.fd.get(), held.device));
    }
    MB_RETURN_IF_ERROR(device::Map(va, size, offset, held.cu_handle, held.device,
                                   held.read_only ? Access::kRead : Access::kReadWrite));
    uint64_t map_id = next_map_id_++;
    r->mappings[va] = MappingState{size, handle, map_id, offset};
    ++held.mappings;
    return map_id;
  }
  int prot = PROT_READ | (h->second.read_only ? 0 : PROT_WRITE);
  void* out = nullptr;
  MB_RETURN_IF_ERROR(ipc::CheckedCall(
      "mmap", "map " + ipc::Hex(va) + "+" + std::to_string(size) + " offset=" + std::to_string(offset), &out,
      [&] {
        return ::mmap(va_ptr, size, prot,
                      MAP_SHARED | MAP_FIXED | ((flags & kMapPopulate) ? MAP_POPULATE : 0),
                      h->second.fd.get(), static_cast<off_t>(offset));
      }));
  uint64_t map_id = next_map_id_++;
  r->mappings[va] = MappingState{size, handle, map_id, offset};
  ++h->second.mappings;
  return map_id;
}

Status ClientCore::Unmap(void* va_ptr, uint64_t map_id) {
  uintptr_t va = reinterpret_cast<uintptr_t>(va_ptr);
  Frees frees;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ReservationState* r = FindReservation(va, 1);
    auto m = r ? r->mappings.find(va) : decltype(r->mappings.end()){};
    if (r == nullptr || m == r->mappings.end() || (map_id != 0 && m->second.map_id != map_id))
      return Status(ErrorCode::kNotMapped, "nothing is mapped at " + ipc::Hex(va));
    MB_RETURN_IF_ERROR(CheckNotEngineRange(va, m->second.size, "unmapped"));
    MB_RETURN_IF_ERROR(r->device ? device::Unmap(va, m->second.size) : ReserveFixed(va, m->second.size));
    uint64_t handle = m->second.handle;
    r->mappings.erase(m);
    DropMappingRef(handle, &frees);
  }
  return SendFrees(frees);
}

Status ClientCore::SetAccess(void* va_ptr, size_t size, Access access) {
  if (access != Access::kNone && access != Access::kRead && access != Access::kReadWrite)
    return Status(ErrorCode::kParamInvalid, "unknown access value " + std::to_string(static_cast<int>(access)));
  uintptr_t va = reinterpret_cast<uintptr_t>(va_ptr);
  if (size == 0 || size % kPage != 0 || va % kPage != 0)
    return Status(ErrorCode::kParamInvalid, "address and size must be page-aligned (size non-zero)");
  std::lock_guard<std::mutex> lk(mu_);
  ReservationState* r = FindReservation(va, size);
  if (r == nullptr)
    return Status(ErrorCode::kNotMapped, "range is not inside one reservation");
  // Every byte of the range must be mapped; read-write needs writable handles.
  uintptr_t cursor = va;
  auto it = r->mappings.upper_bound(va);
  if (it != r->mappings.begin()) --it;
  for (; it != r->mappings.end() && cursor < va + size; ++it) {
    if (it->first > cursor) break;
    if (it->first + it->second.size <= cursor) continue;
    auto held = handles_.find(it->second.handle);  // a mapping keeps its handle entry
    if (access == Access::kReadWrite && held != handles_.end() && held->second.read_only)
      return Status(ErrorCode::kPermissionDenied,
                    "the mapping at " + ipc::Hex(it->first) + " is of a read-only import");
    cursor = it->first + it->second.size;
  }
  if (cursor < va + size) return Status(ErrorCode::kNotMapped, ipc::Hex(cursor) + " is not mapped");
  if (access != Access::kReadWrite) MB_RETURN_IF_ERROR(CheckNotEngineRange(va, size, "protected"));
  if (r->device) {
    auto first = r->mappings.upper_bound(va);
    --first;  // the range is mapped, so a mapping starts at or before va
    auto held = handles_.find(first->second.handle);
    return device::SetAccess(va, size, held != handles_.end() ? held->second.device : 0, access);
  }
  int prot = access == Access::kNone ? PROT_NONE
             : access == Access::kRead ? PROT_READ
                                       : PROT_READ | PROT_WRITE;
  return ipc::CheckedCall<int>("mprotect", ipc::Hex(va) + "+" + std::to_string(size), nullptr,
                               [&] { return ::mprotect(va_ptr, size, prot); });
}

void ClientCore::AddHostAlloc(void* ptr, uint64_t handle) {
  std::lock_guard<std::mutex> lk(mu_);
  host_allocs_[reinterpret_cast<uintptr_t>(ptr)] = handle;
}

Status ClientCore::FreeHostAlloc(void* ptr) {
  uint64_t handle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = host_allocs_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == host_allocs_.end())
      return Status(ErrorCode::kInvalidHandle,
                    "pointer " + ipc::Hex(reinterpret_cast<uintptr_t>(ptr)) +
                        " did not come from MallocHost (or was freed already)");
    handle = it->second;
  }
  // Unmapping drops the last mapping; the handle then goes with FreeHandle.
  MB_RETURN_IF_ERROR(Release(ptr, /*force=*/true));
  {
    std::lock_guard<std::mutex> lk(mu_);
    host_allocs_.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  return FreeHandle(handle);
}

Status ClientCore::AddHostRegistration(void* ptr, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  host_regs_[reinterpret_cast<uintptr_t>(ptr)] = size;
  return Status::Ok();
}

void ClientCore::NoteCudaRegistered(void* ptr) {
  std::lock_guard<std::mutex> lk(mu_);
  cuda_registered_.insert(reinterpret_cast<uintptr_t>(ptr));
}

bool ClientCore::TakeCudaRegistered(void* ptr) {
  std::lock_guard<std::mutex> lk(mu_);
  return cuda_registered_.erase(reinterpret_cast<uintptr_t>(ptr)) != 0;
}

Result<size_t> ClientCore::TakeHostRegistration(void* ptr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = host_regs_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == host_regs_.end())
    return Status(ErrorCode::kNotFound, "no HostRegister starts at " + ipc::Hex(reinterpret_cast<uintptr_t>(ptr)));
  size_t size = it->second;
  MB_RETURN_IF_ERROR(CheckNotEngineRange(it->first, size, "unregistered"));
  host_regs_.erase(it);
  return size;
}

Status ClientCore::CheckNotEngineRange(uintptr_t va, size_t size, const char* what) const {
  if (!ipc::Overlaps(engine_ranges_, va, size, [](const EngineRegistration& r) { return r.size; }))
    return Status::Ok();
  return Status(ErrorCode::kBusy, "range " + ipc::Hex(va) + "+" + std::to_string(size) +
                                      " is registered with a transfer engine and cannot be " + what +
                                      " (DeregisterMem it first)");
}

Result<EngineRange> ClientCore::PinForEngine(uintptr_t va, size_t size, const std::string& name, bool device) {
  std::lock_guard<std::mutex> lk(mu_);
  EngineRange found;
  bool ok = false;
  const std::string range = "range " + ipc::Hex(va) + "+" + std::to_string(size);
  ReservationState* r = FindReservation(va, size);
  if (device && (r == nullptr || !r->device))
    return Status(ErrorCode::kParamInvalid, range + " is not device memory mapped through membroker (MEM_DEVICE)");
  if (r != nullptr) {
    if (r->device && !device)
      return Status(ErrorCode::kParamInvalid, range + " is device memory: register it as MEM_DEVICE, not MEM_HOST");
    auto m = ipc::Containing(r->mappings, va, size, [](const MappingState& m) { return m.size; });
    if (m != r->mappings.end()) {
      auto held = handles_.find(m->second.handle);
      found = EngineRange{m->second.handle, m->second.offset + (va - m->first),
                          held != handles_.end() && held->second.read_only,
                          held != handles_.end() ? held->second.device : -1};
      ok = true;
    }
  } else {
    ok = ipc::Containing(host_regs_, va, size, [](size_t n) { return n; }) != host_regs_.end();
  }
  if (!ok)
    return Status(ErrorCode::kParamInvalid,
                  "range " + ipc::Hex(va) + "+" + std::to_string(size) +
                      " is neither inside one mapping of broker memory nor inside one "
                      "HostRegister range");
  engine_ranges_[va] = EngineRegistration{size, found, 0, name};
  return found;
}

void ClientCore::ForgetEngineRange(uintptr_t va) {
  std::lock_guard<std::mutex> lk(mu_);
  engine_ranges_.erase(va);
}

uint64_t ClientCore::EngineRegion(uintptr_t va) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = engine_ranges_.find(va);
  return it == engine_ranges_.end() ? 0 : it->second.region;
}

void ClientCore::SetEngineRegion(uintptr_t va, uint64_t region) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = engine_ranges_.find(va); it != engine_ranges_.end()) it->second.region = region;
}

Result<int> ClientCore::WakeFd() {
  bool made = false;
  MB_ASSIGN_OR_RETURN(int fd, wake_.Open(&made));
  if (!made) return fd;
  const int sending = wake_.sending();
  Status st = conn_.Call(ipc::WakeRequest{}, std::chrono::milliseconds(0), {&sending, 1}).status();
  if (!st.ok()) {
    wake_.Close();
    return st;
  }
  // A reader that got the fd from another thread meanwhile looks again now:
  // what was queued before the broker had the socket sent no byte.
  wake_.Poke();
  return fd;
}

}  // namespace membroker::detail
