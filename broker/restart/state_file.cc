#include "restart/state_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "membroker/ipc/private_file.h"
#include "membroker/ipc/syscall.h"

namespace membroker::broker {

namespace {
constexpr char kMagic[8] = {'M', 'B', 'S', 'T', 'A', 'T', 'E', '1'};
// magic, key, id limit (little endian)
constexpr size_t kFileBytes = sizeof(kMagic) + 16 + 8;

Status FillRandom(void* out, size_t size) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    ssize_t n = 0;
    MB_RETURN_IF_ERROR(ipc::CheckedCall("getrandom", std::to_string(size) + " bytes", &n, [&] {
      return ::getrandom(p + got, size - got, 0);
    }));
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

void PutLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t TagOf(const SipKey& key, uint64_t nonce) {
  uint8_t bytes[8];
  PutLe64(bytes, nonce);
  return SipHash24(key, bytes, sizeof(bytes));
}

Status Corrupt(const std::string& path, const std::string& why) {
  return Status(ErrorCode::kParamInvalid, "state file " + path + " " + why +
                                              " (remove it to start afresh: reattaching clients then lose their memory)");
}
}  // namespace

std::unique_ptr<StateFile> StateFile::Ephemeral() {
  std::unique_ptr<StateFile> id(new StateFile());
  if (!FillRandom(id->key_.data(), id->key_.size()).ok()) {
    // No randomness: tags still tell apart nothing from nothing; reattach is refused.
    id->key_.fill(0);
  }
  uint64_t nonce = 0;
  (void)FillRandom(&nonce, sizeof(nonce));
  id->next_nonce_.store(nonce);
  id->first_id_ = 1;
  id->limit_ = kIdBlock;
  return id;
}

Result<std::unique_ptr<StateFile>> StateFile::Open(const std::string& path) {
  std::unique_ptr<StateFile> id(new StateFile());
  id->path_ = path;
  uint8_t bytes[kFileBytes] = {};
  int raw = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (raw < 0 && errno == ENOENT) {
    raw = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_CREAT | O_EXCL, 0600);
    if (raw < 0) return ipc::ErrnoStatus("open(O_CREAT)", "state file " + path, errno);
    id->fd_.reset(raw);
    MB_RETURN_IF_ERROR(FillRandom(id->key_.data(), id->key_.size()));
    id->first_id_ = 1;
  } else {
    if (raw < 0) return ipc::ErrnoStatus("open", "state file " + path, errno);
    id->fd_.reset(raw);
    if (std::string problem = ipc::PrivateFileProblem(raw); !problem.empty()) return Corrupt(path, problem);
    ssize_t n = ::pread(raw, bytes, sizeof(bytes), 0);
    if (n < 0) return ipc::ErrnoStatus("pread", "state file " + path, errno);
    if (static_cast<size_t>(n) != kFileBytes || std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0)
      return Corrupt(path, "is not a membrokerd state file");
    std::memcpy(id->key_.data(), bytes + sizeof(kMagic), 16);
    const uint64_t old_limit = GetLe64(bytes + sizeof(kMagic) + 16);
    if (old_limit > UINT64_MAX / 2) return Corrupt(path, "records an impossible id limit");
    id->first_id_ = old_limit + 1;
  }
  uint64_t nonce = 0;
  MB_RETURN_IF_ERROR(FillRandom(&nonce, sizeof(nonce)));
  id->next_nonce_.store(nonce);
  MB_RETURN_IF_ERROR(id->Reserve(id->first_id_));
  return id;
}

Status StateFile::Reserve(uint64_t next) {
  if (next <= limit_) return Status::Ok();
  limit_ = next - 1 + kIdBlock;
  return WriteLimit();
}

Status StateFile::WriteLimit() {
  if (!fd_.valid()) return Status::Ok();
  uint8_t bytes[kFileBytes];
  std::memcpy(bytes, kMagic, sizeof(kMagic));
  std::memcpy(bytes + sizeof(kMagic), key_.data(), 16);
  PutLe64(bytes + sizeof(kMagic) + 16, limit_);
  ssize_t n = ::pwrite(fd_.get(), bytes, sizeof(bytes), 0);
  if (n < 0) return ipc::ErrnoStatus("pwrite", "state file " + path_, errno);
  if (static_cast<size_t>(n) != sizeof(bytes))
    return Status(ErrorCode::kInternal, "short write to state file " + path_);
  return Status::Ok();
}

std::string StateFile::NameFor(std::string_view what) {
  const uint64_t nonce = next_nonce_.fetch_add(1, std::memory_order_relaxed);
  std::string name(what);
  name += ':';
  name += Hex16(nonce);
  name += '.';
  name += Hex16(TagOf(key_, nonce));
  return name;
}

bool StateFile::Tagged(std::string_view name) const {
  // "...:<16 hex>.<16 hex>"
  constexpr size_t kTail = 1 + 16 + 1 + 16;
  if (name.size() < kTail || name[name.size() - kTail] != ':' || name[name.size() - 17] != '.')
    return false;
  uint64_t nonce = 0, tag = 0;
  for (size_t i = 0; i < 16; ++i) {
    for (auto [ch, v] : {std::pair<char, uint64_t*>{name[name.size() - 33 + i], &nonce},
                         std::pair<char, uint64_t*>{name[name.size() - 16 + i], &tag}}) {
      int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      if (d < 0) return false;
      *v = (*v << 4) | static_cast<uint64_t>(d);
    }
  }
  // Constant time is not needed here: a wrong guess costs a round trip and is counted.
  return TagOf(key_, nonce) == tag;
}

}  // namespace membroker::broker
