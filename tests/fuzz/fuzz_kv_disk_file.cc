// libFuzzer: arbitrary bytes as a block file of the KV disk tier
// (broker/kv/disk_tier.h), read as a promotion reads one. The directory is
// the broker's own, but a file there may be torn or damaged by a crash: no
// crash here, and nothing is served that fails a check - a block accepted
// fits its store's block size and is the key it was asked for.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kv/disk_tier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using membroker::broker::KvDiskTier;
  constexpr uint64_t kBlockSize = 4096;
  // A folder of its own per input (libFuzzer ends with _Exit: nothing may outlive an input).
  char dir[] = "/tmp/membroker-fuzz.XXXXXX";
  if (::mkdtemp(dir) == nullptr) std::abort();
  const std::string path = std::string(dir) + "/block.kv";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  ::close(fd);
  const KvDiskTier::Read read{"model/kv", "key-0", kBlockSize, 1, path};
  std::vector<std::byte> to(kBlockSize);
  const auto got = KvDiskTier::Perform(read, to.data());
  if (::unlink(path.c_str()) != 0 || ::rmdir(dir) != 0) std::abort();
  if (got.ok() && (*got == 0 || *got > kBlockSize)) std::abort();
  // Accepted: the header names this key (key_length at byte 44, the key at 176).
  uint32_t key_length = 0;
  if (got.ok() && size >= 248) std::memcpy(&key_length, data + 44, 4);
  if (got.ok() && (key_length != 5 || std::memcmp(data + 176, "key-0", 5) != 0)) std::abort();
  if (!got.ok() && got.status().message().empty()) std::abort();  // a refusal says why
  return 0;
}
