// KvDiskTier (disk_tier.h).
#include "kv/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <set>

#include "log.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/syscall.h"

namespace membroker::broker {

namespace {

// A block file is written as version 2 and read as 1 or 2: the same header;
// version 2's payload checksum is PayloadChecksum, version 1's Checksum.
constexpr char kMagic[8] = {'M', 'B', 'K', 'V', 'D', 'S', 'K', '2'};
constexpr char kMagicV1[8] = {'M', 'B', 'K', 'V', 'D', 'S', 'K', '1'};
constexpr size_t kMaxStoreBytes = ipc::kMaxKvStoreNameBytes;
constexpr size_t kMaxKeyBytes = ipc::kMaxKvKeyBytes;

// A block file's first bytes (host byte order: the tier is this host's).
struct FileHeader {
  char magic[8];
  uint64_t block_size;
  uint64_t length;    // of the payload, which follows the header
  uint64_t sequence;  // the tier's write sequence (also in the file's name)
  uint64_t payload_checksum;
  uint32_t store_length;
  uint32_t key_length;
  uint8_t store[kMaxStoreBytes];
  uint8_t key[kMaxKeyBytes];
  uint64_t checksum;  // of every byte above
};
static_assert(sizeof(FileHeader) == 248);

// FNV-1a over 8-byte words: it finds torn and damaged files (the directory
// is the broker's own; no adversary writes it), at memory speed.
uint64_t Checksum(const void* data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A version 2 payload's: Checksum in four lanes over interleaved words, then
// the tail and the lanes folded into one. Checksum's one multiply chain took
// 2.6 ms of the 4 ms a disk get of 64 x 256 KiB spent past reading its files
// here; four independent chains keep up with the read. Any one word changed
// still changes the result (each step is a bijection of its lane).
uint64_t PayloadChecksum(const void* data, size_t size) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t lane[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9ce484222325cbf2ull, 0x2325cbf29ce48422ull};
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (size_t k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kPrime;
    }
  uint64_t h = Checksum(p + i, size - i);
  for (uint64_t l : lane) h = (h ^ l) * kPrime;
  return h;
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// A store's directory: a hash of its name (a name may be longer than a file
// name can be, and hold '/'); the files say which store they are of.
std::string StoreDir(const std::string& store) {
  const uint64_t h = Checksum(store.data(), store.size());
  char buf[24];
  std::snprintf(buf, sizeof(buf), "s%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Status Errno(const std::string& what, const std::string& path) {
  return ipc::ErrnoStatus(what.c_str(), path, errno);
}

Status Damaged(const std::string& why) { return Status(ErrorCode::kInternal, why); }

ErrorCode ReadAll(int fd, void* to, uint64_t n, uint64_t offset) {
  auto* p = static_cast<std::byte*>(to);
  for (uint64_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got == 0 ? ErrorCode::kOutOfRange : ErrorCode::kInternal;
    done += static_cast<uint64_t>(got);
  }
  return ErrorCode::kOk;
}

// The header of the file at fd, checked against its size and name parts.
Result<FileHeader> ReadHeader(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("fstat", path);
  if (!S_ISREG(st.st_mode)) return Damaged("not a regular file");
  FileHeader h{};
  if (static_cast<uint64_t>(st.st_size) < sizeof(h) || ReadAll(fd, &h, sizeof(h), 0) != ErrorCode::kOk)
    return Damaged("shorter than its header");
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 && std::memcmp(h.magic, kMagicV1, sizeof(kMagicV1)) != 0)
    return Damaged("not a membroker KV block file");
  if (h.checksum != Checksum(&h, offsetof(FileHeader, checksum))) return Damaged("its header fails its checksum");
  if (h.store_length == 0 || h.store_length > kMaxStoreBytes || h.key_length == 0 || h.key_length > kMaxKeyBytes ||
      h.length == 0 || h.length > h.block_size)
    return Damaged("its header's sizes are out of range");
  if (static_cast<uint64_t>(st.st_size) != sizeof(h) + h.length)
    return Damaged("its size is not its header's and payload's");
  return h;
}

// The sequence in a block file's name (KEYHEX.SEQUENCE.kv); 0 if none.
uint64_t SequenceIn(const std::string& file) {
  const size_t end = file.size() - 3, dot = file.rfind('.', end - 1);
  if (dot == std::string::npos || dot + 1 >= end || end - dot - 1 > 19) return 0;
  uint64_t n = 0;
  for (size_t i = dot + 1; i < end; ++i) {
    if (file[i] < '0' || file[i] > '9') return 0;
    n = n * 10 + static_cast<uint64_t>(file[i] - '0');
  }
  return n;
}

}  // namespace

Result<std::unique_ptr<KvDiskTier>> KvDiskTier::Open(const std::string& dir, uint64_t capacity, bool taking_over) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Errno("mkdir", dir);
  std::unique_ptr<KvDiskTier> tier(new KvDiskTier(dir, capacity));
  // Checked on the fd that is then locked: no other directory can be swapped in.
  tier->dir_fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!tier->dir_fd_) {
    if (errno == ENOTDIR || errno == ELOOP)
      return Status(ErrorCode::kParamInvalid, "--kv-disk " + dir + " is not a directory");
    return Errno("open", dir);
  }
  struct stat st {};
  if (::fstat(tier->dir_fd_.get(), &st) != 0) return Errno("fstat", dir);
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(ErrorCode::kPermissionDenied,
                  "--kv-disk " + dir + " is owned by uid " + std::to_string(st.st_uid) + " with mode " + mode +
                      "; the broker serves its files as blocks, so it must be the broker's own and writable "
                      "by no one else");
  }
  if (!taking_over) MB_RETURN_IF_ERROR(tier->Lock());
  MB_RETURN_IF_ERROR(tier->Scan(!taking_over));
  return tier;
}

Status KvDiskTier::Lock() {
  if (::flock(dir_fd_.get(), LOCK_EX | LOCK_NB) == 0) return Status::Ok();
  if (errno == EWOULDBLOCK)
    return Status(ErrorCode::kBusy, "--kv-disk " + dir_ +
                                        " is the disk tier of another running broker; a directory serves one "
                                        "broker (each would remove and overwrite the other's files)");
  return Errno("flock", dir_);
}

Status KvDiskTier::TakeOver(ipc::UniqueFd handed_lock) {
  struct stat mine {}, theirs {};
  if (handed_lock.valid() && ::fstat(dir_fd_.get(), &mine) == 0 && ::fstat(handed_lock.get(), &theirs) == 0 &&
      mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino) {
    dir_fd_ = std::move(handed_lock);  // the old broker's lock, which stays when it exits
  } else {
    MB_RETURN_IF_ERROR(Lock());  // it had another directory, or none
  }
  return Scan(true);
}

std::string KvDiskTier::PathOf(const std::string& store, const std::string& key, uint64_t sequence) const {
  return dir_ + "/" + StoreDir(store) + "/" + Hex(key) + "." + std::to_string(sequence) + ".kv";
}

Status KvDiskTier::Scan(bool settle) {
  DIR* top = ::opendir(dir_.c_str());
  if (top == nullptr) return Errno("opendir", dir_);
  std::vector<std::string> stores;
  while (const dirent* e = ::readdir(top))
    if (e->d_name[0] == 's' && std::strlen(e->d_name) == 17) stores.emplace_back(e->d_name);
  ::closedir(top);
  std::set<uint64_t> seen;  // the sequences of known files found again
  for (const std::string& sub : stores) {
    const std::string subdir = dir_ + "/" + sub;
    DIR* d = ::opendir(subdir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> files;
    while (const dirent* e = ::readdir(d)) files.emplace_back(e->d_name);
    ::closedir(d);
    for (const std::string& file : files) {
      const std::string path = subdir + "/" + file;
      if (file.rfind(".tmp-", 0) == 0) {  // a write an earlier broker did not finish
        if (settle) ::unlink(path.c_str());
        continue;
      }
      if (file.size() < 4 || file.compare(file.size() - 3, 3, ".kv") != 0) continue;  // not ours
      if (auto k = by_age_.find(SequenceIn(file));
          k != by_age_.end() && PathOf(k->second.first, k->second.second, k->first) == path) {
        seen.insert(k->first);  // known: read at an earlier scan
        continue;
      }
      ipc::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
      Result<FileHeader> h = fd ? ReadHeader(fd.get(), path) : Result<FileHeader>(Damaged(std::strerror(errno)));
      std::string store, key;
      if (h.ok()) {
        store.assign(reinterpret_cast<const char*>(h->store), h->store_length);
        key.assign(reinterpret_cast<const char*>(h->key), h->key_length);
        if (sub + "/" + file != PathOf(store, key, h->sequence).substr(dir_.size() + 1))
          h = Damaged("its name is not its header's");
      }
      if (!h.ok()) {
        ::unlink(path.c_str());
        ++stats_.damaged;
        MB_WARN("kv_disk_dropped", "file=\"%s\" why=\"%s\"", LogText(path).c_str(), LogText(h.status().message()).c_str());
        continue;
      }
      const Name name{store, key};
      if (auto it = entries_.find(name); it != entries_.end()) {  // written twice: the later one is kept
        const bool older = it->second.sequence < h->sequence;
        ::unlink((older ? PathOf(store, key, it->second.sequence) : path).c_str());
        if (!older) continue;
        Forget(it);
      }
      entries_[name] = Entry{h->sequence, h->length, h->block_size, true, 0, nullptr};
      by_age_[h->sequence] = name;
      seen.insert(h->sequence);
      stats_.blocks += 1;
      stats_.bytes += h->length;
      next_sequence_ = std::max(next_sequence_, h->sequence + 1);
    }
  }
  for (auto it = by_age_.begin(); it != by_age_.end();) {  // known, and removed since
    const auto next = std::next(it);
    if (seen.count(it->first) == 0) Forget(entries_.find(it->second));
    it = next;
  }
  // A smaller capacity than the last broker's: the oldest go.
  while (settle && stats_.bytes > capacity_ && !by_age_.empty()) {
    const Name name = by_age_.begin()->second;
    ::unlink(PathOf(name.first, name.second, by_age_.begin()->first).c_str());
    Forget(entries_.find(name));
    ++stats_.trimmed;
    ++losses_[name.first].trimmed;
  }
  stats_.found = stats_.blocks;
  MB_INFO(settle ? "kv_disk_opened" : "kv_disk_scanned", "dir=\"%s\" blocks=%llu bytes=%llu capacity=%llu damaged=%llu", LogText(dir_).c_str(),
          static_cast<unsigned long long>(stats_.blocks), static_cast<unsigned long long>(stats_.bytes),
          static_cast<unsigned long long>(capacity_), static_cast<unsigned long long>(stats_.damaged));
  return Status::Ok();
}

void KvDiskTier::Forget(std::map<Name, Entry>::iterator it) {
  by_age_.erase(it->second.sequence);
  stats_.blocks -= 1;
  stats_.bytes -= it->second.length;
  entries_.erase(it);
}

bool KvDiskTier::Has(const std::string& store, std::string_view key) const {
  return entries_.count(Name{store, std::string(key)}) != 0;
}

bool KvDiskTier::BeingWritten(const std::string& store, std::string_view key) const {
  auto it = entries_.find(Name{store, std::string(key)});
  return it != entries_.end() && !it->second.whole;
}

std::pair<uint64_t, uint64_t> KvDiskTier::StoreUsage(const std::string& store) const {
  uint64_t blocks = 0, bytes = 0;
  for (auto it = entries_.lower_bound(Name{store, ""}); it != entries_.end() && it->first.first == store; ++it) {
    ++blocks;
    bytes += it->second.length;
  }
  return {blocks, bytes};
}

KvDiskTier::StoreLosses KvDiskTier::LossesOf(const std::string& store) const {
  auto it = losses_.find(store);
  return it == losses_.end() ? StoreLosses{} : it->second;
}

std::optional<KvDiskTier::Write> KvDiskTier::BeginWrite(const std::string& store, const std::string& key,
                                                        uint64_t block_size, uint64_t length) {
  if (length > capacity_ || Has(store, key)) return std::nullopt;
  if (waiting_bytes_ + length > kMaxWaitingBytes) {
    ++stats_.write_skipped;
    ++losses_[store].write_skipped;
    return std::nullopt;
  }
  Write w;
  // Room first: the oldest whole files nobody reads go.
  for (auto it = by_age_.begin(); it != by_age_.end() && stats_.bytes + length > capacity_;) {
    auto e = entries_.find(it->second);
    ++it;
    if (!e->second.whole || e->second.readers != 0) continue;
    w.trimmed.push_back(PathOf(e->first.first, e->first.second, e->second.sequence));
    ++losses_[e->first.first].trimmed;
    Forget(e);
    ++stats_.trimmed;
  }
  if (stats_.bytes + length > capacity_) {  // what is left is being read or written
    ++stats_.write_skipped;
    ++losses_[store].write_skipped;
    return std::nullopt;
  }
  w.store = store;
  w.key = key;
  w.block_size = block_size;
  w.length = length;
  w.sequence = next_sequence_++;
  w.path = PathOf(store, key, w.sequence);
  w.temporary = dir_ + "/" + StoreDir(store) + "/.tmp-" + std::to_string(w.sequence);
  entries_[Name{store, key}] = Entry{w.sequence, length, block_size, false, 0, nullptr};
  by_age_[w.sequence] = Name{store, key};
  stats_.blocks += 1;
  stats_.bytes += length;
  stats_.writing += 1;
  waiting_bytes_ += length;
  return w;
}

Status KvDiskTier::Copy(Write& w) {
  w.payload.reset(new std::byte[w.length]);  // (shared: a read may be served from it)
  const ErrorCode read = ReadAll(w.slab->get(), w.payload.get(), w.length, w.offset);
  w.slab.reset();
  if (read != ErrorCode::kOk) return Status(ErrorCode::kInternal, "reading the block from its slab failed");
  return Status::Ok();
}

Status KvDiskTier::Perform(Write& w) {
  for (const std::string& path : w.trimmed) ::unlink(path.c_str());
  const std::string subdir = w.path.substr(0, w.path.rfind('/'));
  if (::mkdir(subdir.c_str(), 0700) != 0 && errno != EEXIST) return Errno("mkdir", subdir);
  std::byte* payload = w.payload.get();
  if (payload == nullptr) return Status(ErrorCode::kInternal, "nothing was copied to write");
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.block_size = w.block_size;
  h.length = w.length;
  h.sequence = w.sequence;
  h.payload_checksum = PayloadChecksum(payload, w.length);
  h.store_length = static_cast<uint32_t>(w.store.size());
  h.key_length = static_cast<uint32_t>(w.key.size());
  std::memcpy(h.store, w.store.data(), w.store.size());
  std::memcpy(h.key, w.key.data(), w.key.size());
  h.checksum = Checksum(&h, offsetof(FileHeader, checksum));
  ipc::UniqueFd fd(::open(w.temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return Errno("open", w.temporary);
  iovec iov[2] = {{&h, sizeof(h)}, {payload, w.length}};
  uint64_t done = 0;
  const uint64_t total = sizeof(h) + w.length;
  while (done < total) {
    iovec rest[2];
    int n = 0;
    uint64_t skip = done;  // what went out already
    for (const iovec& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      rest[n++] = {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    const ssize_t put = ::pwritev(fd.get(), rest, n, static_cast<off_t>(done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const Status st = Errno("pwritev", w.temporary);
      ::unlink(w.temporary.c_str());
      return st;
    }
    done += static_cast<uint64_t>(put);
  }
  fd.reset();
  if (::rename(w.temporary.c_str(), w.path.c_str()) != 0) {
    const Status st = Errno("rename", w.path);
    ::unlink(w.temporary.c_str());
    return st;
  }
  return Status::Ok();
}

void KvDiskTier::Copied(const Write& w) {
  auto it = entries_.find(Name{w.store, w.key});
  if (it != entries_.end() && it->second.sequence == w.sequence && !it->second.whole) it->second.copy = w.payload;
}

void KvDiskTier::EndWrite(const Write& w, const Status& result) {
  auto it = entries_.find(Name{w.store, w.key});
  if (it == entries_.end() || it->second.sequence != w.sequence) return;  // (not possible: unwhole files stay)
  it->second.copy.reset();
  stats_.writing -= 1;
  waiting_bytes_ -= w.length;
  if (result.ok()) {
    it->second.whole = true;
    ++stats_.written;
    return;
  }
  Forget(it);
  // (a full disk fails every write: the first and every thousandth are logged)
  if (stats_.write_failed++ % 1000 == 0)
    MB_WARN("kv_disk_write_failed", "dir=\"%s\" failed=%llu error=\"%s\"", LogText(dir_).c_str(),
            static_cast<unsigned long long>(stats_.write_failed), LogText(result.message()).c_str());
}

std::optional<KvDiskTier::Read> KvDiskTier::BeginRead(const std::string& store, std::string_view key,
                                                      uint64_t block_size) {
  auto it = entries_.find(Name{store, std::string(key)});
  if (it == entries_.end() || (!it->second.whole && !it->second.copy)) return std::nullopt;
  if (it->second.block_size != block_size) {  // a store of this name with other blocks, before
    if (!it->second.whole) return std::nullopt;  // (its write ends it)
    Drop(it->first, "its blocks are of " + std::to_string(it->second.block_size) + " bytes, the store's of " +
                        std::to_string(block_size));
    return std::nullopt;
  }
  ++it->second.readers;
  const std::string& name = it->first.second;  // the key
  return Read{store,
              name,
              block_size,
              it->second.sequence,
              PathOf(store, name, it->second.sequence),
              it->second.copy,
              it->second.length};
}

Result<uint64_t> KvDiskTier::Perform(const Read& r, std::byte* to) {
  if (r.copy) {  // our own copy out of the slab: nothing to check
    std::memcpy(to, r.copy.get(), r.length);
    return r.length;
  }
  ipc::UniqueFd fd(::open(r.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) return Damaged(std::string("cannot open it: ") + std::strerror(errno));
  MB_ASSIGN_OR_RETURN(FileHeader h, ReadHeader(fd.get(), r.path));
  if (h.sequence != r.sequence || h.block_size != r.block_size || h.store_length != r.store.size() ||
      h.key_length != r.key.size() || std::memcmp(h.store, r.store.data(), r.store.size()) != 0 ||
      std::memcmp(h.key, r.key.data(), r.key.size()) != 0)
    return Damaged("its header names another block");
  if (ReadAll(fd.get(), to, h.length, sizeof(h)) != ErrorCode::kOk) return Damaged("its payload is short");
  const bool v1 = std::memcmp(h.magic, kMagicV1, sizeof(kMagicV1)) == 0;
  if ((v1 ? Checksum(to, h.length) : PayloadChecksum(to, h.length)) != h.payload_checksum)
    return Damaged("its payload fails its checksum");
  return h.length;
}

void KvDiskTier::EndRead(const Read& r, const Result<uint64_t>& result) {
  auto it = entries_.find(Name{r.store, r.key});
  if (it == entries_.end() || it->second.sequence != r.sequence) return;
  --it->second.readers;
  if (result.ok()) {
    ++stats_.promoted;
    return;
  }
  Drop(it->first, result.status().message());
}

void KvDiskTier::CancelRead(const Read& r) {
  auto it = entries_.find(Name{r.store, r.key});
  if (it != entries_.end() && it->second.sequence == r.sequence) --it->second.readers;
}

void KvDiskTier::Drop(const Name& name, const std::string& why) {
  auto it = entries_.find(name);
  const std::string path = PathOf(name.first, name.second, it->second.sequence);
  ::unlink(path.c_str());
  Forget(it);
  ++stats_.damaged;
  MB_WARN("kv_disk_dropped", "file=\"%s\" why=\"%s\"", LogText(path).c_str(), LogText(why).c_str());
}

}  // namespace membroker::broker
