#include "restart/fd_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "membroker/ipc/syscall.h"
#include "memory/memfd.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kMaxStateBytes = uint64_t{1} << 30;  // far above any real table

bool Policy(unsigned v, ipc::PagePolicy* out) {
  if (v > static_cast<unsigned>(ipc::PagePolicy::kHuge1GOnly)) return false;
  *out = static_cast<ipc::PagePolicy>(v);
  return true;
}
}  // namespace

std::string StoredMemoryName(const ipc::TakeOverAllocation& a) {
  char name[160];
  std::snprintf(name, sizeof(name), "mem-%" PRIu64 "-%" PRIu64 "-%u-%u-%u-%" PRIx64 "-%u", a.id, a.page_size,
                static_cast<unsigned>(a.policy), a.pinned ? 1u : 0u, a.fell_back ? 1u : 0u, a.fixed_address,
                a.creator_uid);
  return name;
}

std::optional<ipc::TakeOverAllocation> ParseStoredMemoryName(const std::string& name) {
  ipc::TakeOverAllocation a;
  unsigned policy = 0, pinned = 0, fell_back = 0;
  int end = 0;
  if (std::sscanf(name.c_str(), "mem-%" SCNu64 "-%" SCNu64 "-%u-%u-%u-%" SCNx64 "-%u%n", &a.id, &a.page_size, &policy,
                  &pinned, &fell_back, &a.fixed_address, &a.creator_uid, &end) != 7 ||
      static_cast<size_t>(end) != name.size() || pinned > 1 || fell_back > 1 || a.id == 0 ||
      !Policy(policy, &a.policy))
    return std::nullopt;
  a.pinned = pinned;
  a.fell_back = fell_back;
  if (StoredMemoryName(a) != name) return std::nullopt;  // one spelling only
  return a;
}

std::string StoredKvName(const StoredKvPart& p) {
  return "kv-" + std::to_string(p.store) + "-" + std::to_string(p.generation) + "-" + std::to_string(p.part);
}

std::optional<StoredKvPart> ParseStoredKvName(const std::string& name) {
  StoredKvPart p;
  int end = 0;
  if (std::sscanf(name.c_str(), "kv-%" SCNu64 "-%" SCNu64 "-%u%n", &p.store, &p.generation, &p.part, &end) != 3 ||
      static_cast<size_t>(end) != name.size() || StoredKvName(p) != name)
    return std::nullopt;
  return p;
}

std::string StoredStateName(uint64_t generation) { return "state-" + std::to_string(generation); }

std::optional<uint64_t> ParseStoredStateName(const std::string& name) {
  uint64_t g = 0;
  int end = 0;
  if (std::sscanf(name.c_str(), "state-%" SCNu64 "%n", &g, &end) != 1 || static_cast<size_t>(end) != name.size() ||
      StoredStateName(g) != name)
    return std::nullopt;
  return g;
}

Result<ipc::UniqueFd> WriteStoredState(const std::vector<ipc::Message>& records) {
  std::vector<uint8_t> bytes;
  for (const ipc::Message& m : records) {
    const std::vector<uint8_t> frame = ipc::Encode({ipc::kProtocolVersion, 0, 0, m});
    const uint32_t n = static_cast<uint32_t>(frame.size());
    const auto* len = reinterpret_cast<const uint8_t*>(&n);
    bytes.insert(bytes.end(), len, len + sizeof(n));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  MB_ASSIGN_OR_RETURN(ipc::UniqueFd fd,
                      CreateMemfd("membroker-state", MFD_CLOEXEC | MFD_ALLOW_SEALING, "the stored state"));
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n <= 0) return ipc::ErrnoStatus("write", "the stored state", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  // Sealed: what systemd keeps is exactly what was written.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return ipc::ErrnoStatus("fcntl(F_ADD_SEALS)", "the stored state", errno);
  return fd;
}

Result<std::vector<ipc::Message>> ReadStoredState(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return ipc::ErrnoStatus("fstat", "the stored state", errno);
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > kMaxStateBytes)
    return Status(ErrorCode::kProtocolError, "the stored state has an impossible size");
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) return ipc::ErrnoStatus("pread", "the stored state", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  std::vector<ipc::Message> out;
  uint64_t exports = 0, names = 0;
  for (size_t at = 0; at < bytes.size();) {
    uint32_t n = 0;
    if (bytes.size() - at < sizeof(n)) return Status(ErrorCode::kProtocolError, "the stored state is cut short");
    std::memcpy(&n, bytes.data() + at, sizeof(n));
    at += sizeof(n);
    if (n > bytes.size() - at) return Status(ErrorCode::kProtocolError, "the stored state is cut short");
    MB_ASSIGN_OR_RETURN(ipc::Envelope env, ipc::Decode({bytes.data() + at, n}));
    at += n;
    if (std::holds_alternative<ipc::TakeOverExport>(env.body)) ++exports;
    else if (std::holds_alternative<ipc::TakeOverName>(env.body)) ++names;
    else if (auto* end = std::get_if<ipc::TakeOverEnd>(&env.body)) {
      if (end->exports != exports || end->names != names || at != bytes.size())
        return Status(ErrorCode::kProtocolError, "the stored state's counts do not match its records");
      return out;
    } else {
      return Status(ErrorCode::kProtocolError,
                    std::string("the stored state holds a ") + ipc::MessageName(env.body));
    }
    out.push_back(std::move(env.body));
  }
  return Status(ErrorCode::kProtocolError, "the stored state has no end record");
}

}  // namespace membroker::broker
