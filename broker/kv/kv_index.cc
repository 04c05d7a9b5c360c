// KvIndex (kv_index.h).
#include "kv/kv_index.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

#include "membroker/ipc/syscall.h"
#include "memory/memfd.h"

namespace membroker::broker {

namespace {
constexpr char kMagic[8] = {'M', 'B', 'K', 'V', 'I', 'D', 'X', '1'};
constexpr uint64_t kHeaderBytes = 256;  // records start here

struct Header {
  char magic[8];
  uint64_t store, generation, block_size, blocks;
  uint32_t policy, eviction, uid, name_len;
  char name[ipc::kMaxKvStoreNameBytes];
  uint64_t checksum;
};
static_assert(sizeof(Header) <= kHeaderBytes);

struct RecordBytes {
  uint64_t generation, length;
  uint8_t key_len, sealed, pad[6];
  char key[ipc::kMaxKvKeyBytes];
  uint64_t checksum;  // of the bytes above and the slot: a record copied to another slot fails
};
static_assert(sizeof(RecordBytes) == 96);

// FNV-1a: it finds a record torn by a broker killed while writing it (no
// adversary writes the index: only the broker maps it).
uint64_t Checksum(const void* data, size_t size, uint64_t salt) {
  uint64_t h = 0xcbf29ce484222325ull ^ salt;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t FileBytes(uint64_t blocks) { return kHeaderBytes + blocks * sizeof(RecordBytes); }

Status Bad(const std::string& why) { return Status(ErrorCode::kProtocolError, "a store's index " + why); }
}  // namespace

KvIndex& KvIndex::operator=(KvIndex&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, size_);
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

KvIndex::~KvIndex() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

Result<KvIndex> KvIndex::Create(uint64_t store, uint64_t generation, const KvStoreSpec& spec) {
  KvIndex index;
  MB_ASSIGN_OR_RETURN(index.fd_, CreateMemfd("membroker-kv-index", MFD_CLOEXEC, "a store's index"));
  index.size_ = FileBytes(spec.blocks);
  if (::ftruncate(index.fd_.get(), static_cast<off_t>(index.size_)) != 0)
    return ipc::ErrnoStatus("ftruncate", "a store's index", errno);
  void* p = ::mmap(nullptr, index.size_, PROT_READ | PROT_WRITE, MAP_SHARED, index.fd_.get(), 0);
  if (p == MAP_FAILED) return ipc::ErrnoStatus("mmap", "a store's index", errno);
  index.base_ = static_cast<std::byte*>(p);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.store = store;
  h.generation = generation;
  h.block_size = spec.block_size;
  h.blocks = spec.blocks;
  h.policy = static_cast<uint32_t>(spec.policy);
  h.eviction = static_cast<uint32_t>(spec.eviction);
  h.uid = static_cast<uint32_t>(spec.uid);
  h.name_len = static_cast<uint32_t>(spec.name.size());
  std::memcpy(h.name, spec.name.data(), spec.name.size());
  h.checksum = Checksum(&h, offsetof(Header, checksum), 0);
  std::memcpy(index.base_, &h, sizeof(h));
  return index;
}

void KvIndex::Write(const Record& r) {
  RecordBytes b{};
  b.generation = r.generation;
  b.length = r.sealed ? r.length : 0;
  b.sealed = r.sealed ? 1 : 0;
  b.key_len = static_cast<uint8_t>(r.key.size());
  std::memcpy(b.key, r.key.data(), r.key.size());
  b.checksum = Checksum(&b, offsetof(RecordBytes, checksum), r.slot);
  std::memcpy(base_ + kHeaderBytes + r.slot * sizeof(RecordBytes), &b, sizeof(b));
}

Result<KvIndex::Contents> KvIndex::Read(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ipc::ErrnoStatus("fstat", "a store's index", errno);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < kHeaderBytes) return Bad("is too short");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ipc::ErrnoStatus("mmap", "a store's index", errno);
  struct Unmap {
    void* p;
    uint64_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{p, size};
  const auto* base = static_cast<const std::byte*>(p);
  Header h;
  std::memcpy(&h, base, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return Bad("has no magic");
  if (h.checksum != Checksum(&h, offsetof(Header, checksum), 0)) return Bad("header fails its checksum");
  if (h.name_len == 0 || h.name_len > ipc::kMaxKvStoreNameBytes || h.block_size == 0 || h.blocks == 0 ||
      h.policy > static_cast<uint32_t>(ipc::PagePolicy::kHuge1GOnly) ||
      h.eviction > static_cast<uint32_t>(EvictionKind::kLru))
    return Bad("header is impossible");
  if (h.blocks > (size - kHeaderBytes) / sizeof(RecordBytes) || FileBytes(h.blocks) != size)
    return Bad("is " + std::to_string(size) + " bytes, not what " + std::to_string(h.blocks) + " blocks need");
  Contents out;
  out.store = h.store;
  out.generation = h.generation;
  out.spec = {std::string(h.name, h.name_len),
              h.block_size,
              h.blocks,
              static_cast<ipc::PagePolicy>(h.policy),
              static_cast<EvictionKind>(h.eviction),
              static_cast<uid_t>(h.uid)};
  static constexpr RecordBytes kNeverUsed{};
  for (uint64_t slot = 0; slot < h.blocks; ++slot) {
    RecordBytes b;
    std::memcpy(&b, base + kHeaderBytes + slot * sizeof(RecordBytes), sizeof(b));
    if (std::memcmp(&b, &kNeverUsed, sizeof(b)) == 0) continue;
    const bool sane = b.checksum == Checksum(&b, offsetof(RecordBytes, checksum), slot) && b.generation != 0 &&
                      b.sealed <= 1 && b.key_len <= ipc::kMaxKvKeyBytes &&
                      (b.sealed == 0 ? b.length == 0 : b.key_len != 0 && b.length != 0 && b.length <= h.block_size);
    if (!sane) {
      out.damaged.push_back(slot);
      continue;
    }
    out.max_generation = std::max(out.max_generation, b.generation);
    out.records.push_back({slot, b.generation, b.length, b.sealed == 1, std::string(b.key, b.key_len)});
  }
  return out;
}

}  // namespace membroker::broker
