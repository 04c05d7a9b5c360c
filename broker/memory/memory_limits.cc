#include "memory/memory_limits.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace membroker::broker {

namespace {

uint64_t RamBytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 8ull << 30;
  return static_cast<uint64_t>(si.totalram) * si.mem_unit;
}

// A limit file's number; 0 for "max", absent or unreadable.
uint64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  return *end == '\0' ? static_cast<uint64_t>(v) : 0;
}

// Takes the limit in `file` of dir and of each ancestor up to mount_root;
// `usage` names the file with each one's usage.
void Consider(const std::string& mount_root, std::string rel, const char* file, const char* usage, MemoryCeiling* c) {
  for (;;) {
    const std::string dir = mount_root + rel;
    const uint64_t v = ReadLimit(dir + "/" + file);
    if (v != 0 && v < c->bytes) {
      c->bytes = v;
      c->source = std::string("cgroup ") + file + " of " + dir;
      c->usage_file = dir + "/" + usage;
    }
    if (rel.empty() || rel == "/") return;
    size_t slash = rel.find_last_of('/');
    rel = slash == 0 || slash == std::string::npos ? "" : rel.substr(0, slash);
  }
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace

MemoryCeiling MemoryAvailable() {
  MemoryCeiling c{RamBytes(), "RAM", ""};
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    // "ID:controllers:path"
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {  // v2: the unified hierarchy
      const std::string root = Exists("/sys/fs/cgroup/cgroup.controllers") ? "/sys/fs/cgroup"
                                                                            : "/sys/fs/cgroup/unified";
      Consider(root, path, "memory.max", "memory.current", &c);
      Consider(root, path, "memory.high", "memory.current", &c);
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {  // v1
      Consider("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", &c);
    }
  }
  return c;
}

CgroupHeadroom::CgroupHeadroom(MemoryCeiling ceiling) : ceiling_(std::move(ceiling)) {
  if (!ceiling_.usage_file.empty()) usage_ = ipc::UniqueFd(::open(ceiling_.usage_file.c_str(), O_RDONLY | O_CLOEXEC));
}

Status CgroupHeadroom::Check(uint64_t bytes) const {
  if (!usage_.valid()) return Status::Ok();
  char text[32] = {};
  const ssize_t n = ::pread(usage_.get(), text, sizeof(text) - 1, 0);  // a cgroup file reads fresh from 0
  if (n <= 0) return Status::Ok();  // unreadable now: the kernel still has the last word
  const uint64_t used = std::strtoull(text, nullptr, 10);
  const uint64_t left = used < ceiling_.bytes ? ceiling_.bytes - used : 0;
  if (bytes <= left) return Status::Ok();
  return Status(ErrorCode::kResourceExhausted,
                std::to_string(bytes) + " bytes asked, but the broker's memory cgroup has " + std::to_string(left) +
                    " of its limit left (" + ceiling_.source + ": " + std::to_string(ceiling_.bytes) + ", " +
                    std::to_string(used) + " in use); --max-bytes should not exceed it");
}

MemoryCeiling LockableMemory() {
  rlimit rl{};
  if (::geteuid() == 0 || ::getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return {RamBytes(), "RAM (locking is not limited for this process)", ""};
  return {static_cast<uint64_t>(rl.rlim_cur), "RLIMIT_MEMLOCK", ""};
}

}  // namespace membroker::broker
