// Memfd-backed physical memory (memfd.h).
#include "memory/memfd.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <utility>

#include "membroker/ipc/syscall.h"
#include "memory/memory_limits.h"

namespace membroker::broker {

using ipc::kHuge1GPageSize;
using ipc::kHuge2MPageSize;
using ipc::kMaxAllocationBytes;
using ipc::kNormalPageSize;
using ipc::PagePolicy;
using ipc::PreferredPageSize;
using ipc::RoundUp;
using ipc::UniqueFd;

namespace {

// Built with ThreadSanitizer (GCC says so one way, clang another): see CreateMemfd.
#if defined(__SANITIZE_THREAD__)
constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kUnderTsan = true;
#else
constexpr bool kUnderTsan = false;
#endif
#else
constexpr bool kUnderTsan = false;
#endif

unsigned HugeFlags(uint64_t page_size) {
  if (page_size == kHuge2MPageSize) return MFD_HUGETLB | MFD_HUGE_2MB;
  if (page_size == kHuge1GPageSize) return MFD_HUGETLB | MFD_HUGE_1GB;
  return 0;
}

// writable: where to map the memory read-write before it is sealed against
// any further writer (F_SEAL_FUTURE_WRITE), or nullptr for memory every
// holder may write.
Result<PhysicalMemory> CreateWithPageSize(const std::string& name, uint64_t size, uint64_t page_size,
                                          void** writable, const std::function<Status(int fd)>& fill) {
  uint64_t rounded = RoundUp(size, page_size);
  if (rounded == 0 || rounded > kMaxAllocationBytes)
    return Status(ErrorCode::kParamInvalid, "size " + std::to_string(size) + " is too large");
  // Normal pages are charged to the broker's memory cgroup (huge pages to
  // hugetlb's): never ask for more than it can give.
  static const CgroupHeadroom headroom(MemoryAvailable());
  if (page_size == kNormalPageSize) MB_RETURN_IF_ERROR(headroom.Check(rounded));
  std::string args = "size=" + std::to_string(rounded) + ", page_size=" + std::to_string(page_size);
  MB_ASSIGN_OR_RETURN(UniqueFd fd, CreateMemfd(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | HugeFlags(page_size), args));
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("ftruncate", args, nullptr, [&] {
    return ::ftruncate(fd.get(), static_cast<off_t>(rounded));
  }));
  const char* fcall = page_size == kNormalPageSize ? "fallocate" : "fallocate(huge)";
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>(fcall, args, nullptr, [&] {
    return ::fallocate(fd.get(), 0, 0, static_cast<off_t>(rounded));
  }));
  if (fill) MB_RETURN_IF_ERROR(fill(fd.get()));
  unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  void* map = nullptr;
  if (writable != nullptr) {
    MB_RETURN_IF_ERROR(ipc::CheckedCall(
        "mmap", args, &map, [&] { return ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0); }));
    seals |= F_SEAL_FUTURE_WRITE;  // this mapping keeps writing; nothing made later can
  }
  Status sealed =
      ipc::CheckedCall<int>("fcntl(F_ADD_SEALS)", args, nullptr, [&] { return ::fcntl(fd.get(), F_ADD_SEALS, seals); });
  if (!sealed.ok()) {
    if (map != nullptr) ::munmap(map, rounded);
    return sealed;
  }
  if (writable != nullptr) *writable = map;
  return PhysicalMemory{std::move(fd), rounded, page_size, false, {}};
}

}  // namespace

Result<PhysicalMemory> CreatePhysicalMemory(const std::string& name, uint64_t size, PagePolicy policy,
                                            void** writable, const std::function<Status(int fd)>& fill) {
  if (size == 0) return Status(ErrorCode::kParamInvalid, "size must not be zero");
  if (size > kMaxAllocationBytes)
    return Status(ErrorCode::kParamInvalid, "size " + std::to_string(size) +
                                                " exceeds the per-allocation limit of " +
                                                std::to_string(kMaxAllocationBytes));
  const uint64_t page = PreferredPageSize(policy, size);
  auto mem = CreateWithPageSize(name, size, page, writable, fill);
  if (mem.ok() || policy != PagePolicy::kHugeFirst || page == kNormalPageSize) return mem;
  auto normal = CreateWithPageSize(name, size, kNormalPageSize, writable, fill);
  if (normal.ok()) normal->fell_back = true;
  return normal;
}

LockedMapping& LockedMapping::operator=(LockedMapping&& o) noexcept {
  if (this != &o) {
    if (addr_) ::munmap(addr_, size_);
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

LockedMapping::~LockedMapping() {
  if (addr_) ::munmap(addr_, size_);  // munmap also unlocks
}

Status Pin(PhysicalMemory* mem) {
  std::string args = "size=" + std::to_string(mem->size);
  void* p = nullptr;
  MB_RETURN_IF_ERROR(ipc::CheckedCall("mmap", args, &p, [&] {
    return ::mmap(nullptr, mem->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                  mem->fd.get(), 0);
  }));
  LockedMapping lock(p, mem->size);
  Status st = ipc::CheckedCall<int>("mlock", args, nullptr, [&] { return ::mlock(p, mem->size); });
  if (!st.ok()) {
    return Status(st.code() == ErrorCode::kPermissionDenied ? ErrorCode::kResourceExhausted
                                                            : st.code(),
                  st.message() + " (hint: raise membrokerd's RLIMIT_MEMLOCK or give it CAP_IPC_LOCK)");
  }
  mem->lock = std::move(lock);
  return Status::Ok();
}

uint64_t FreeHugePages(uint64_t page_size) {
  std::string path = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_size >> 10) +
                     "kB/free_hugepages";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  unsigned long long n = 0;
  if (std::fscanf(f, "%llu", &n) != 1) n = 0;
  std::fclose(f);
  return n;
}

Result<UniqueFd> CreateMemfd(const std::string& name, unsigned flags, const std::string& args) {
  const char* call = (flags & MFD_HUGETLB) != 0 ? "memfd_create(huge)" : "memfd_create";
  int raw = -1;
  MB_RETURN_IF_ERROR(ipc::CheckedCall(call, args, &raw, [&] { return ::memfd_create(name.c_str(), flags); }));
  if constexpr (kUnderTsan) {
    std::array<char, 64> path{};
    std::snprintf(path.data(), path.size(), "/proc/self/fd/%d", raw);
    const int seen = ::open(path.data(), O_RDWR | ((flags & MFD_CLOEXEC) != 0 ? O_CLOEXEC : 0));
    const int err = errno;
    (void)::syscall(SYS_close, raw);  // unseen, as its creation was
    if (seen < 0) return ipc::ErrnoStatus("open", path.data(), err);
    raw = seen;
  }
  return UniqueFd(raw);
}

Result<UniqueFd> ReopenReadOnly(int fd) {
  std::array<char, 64> path{};
  std::snprintf(path.data(), path.size(), "/proc/self/fd/%d", fd);
  int raw = -1;
  MB_RETURN_IF_ERROR(ipc::CheckedCall("open", path.data(), &raw,
                                 [&] { return ::open(path.data(), O_RDONLY | O_CLOEXEC); }));
  return UniqueFd(raw);
}

}  // namespace membroker::broker
