// Reading what the kernel says about a process: locked memory, the RSS and
// page size of one mapping, and its threads' nice values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

namespace membroker::testing {

// AddressSanitizer turns mlock/munlock into no-ops, so locking cannot be
// observed (or fail) in ASan builds.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kMlockObservable = false;
#else
inline constexpr bool kMlockObservable = true;
#endif

// VmLck of a process in bytes.
inline uint64_t LockedBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

struct MappingInfo {
  uint64_t rss = 0;
  uint64_t kernel_page_size = 0;
  uint64_t hugetlb = 0;  // huge pages are counted here, not in rss
  bool found = false;
};

// The smaps entry of this process's mapping that starts at addr.
inline MappingInfo SmapsOf(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  char start_hex[32];
  std::snprintf(start_hex, sizeof(start_hex), "%lx-", reinterpret_cast<unsigned long>(addr));
  MappingInfo info;
  bool in_entry = false;
  for (std::string line; std::getline(in, line);) {
    if (line.find('-') != std::string::npos && line.find(':') > line.find('-') &&
        std::isxdigit(static_cast<unsigned char>(line[0])) && line.find(' ') > line.find('-')) {
      if (in_entry) break;
      in_entry = line.rfind(start_hex, 0) == 0;
      info.found |= in_entry;
      continue;
    }
    if (!in_entry) continue;
    if (line.rfind("Rss:", 0) == 0) info.rss = std::stoull(line.substr(4)) * 1024;
    if (line.rfind("Shared_Hugetlb:", 0) == 0 || line.rfind("Private_Hugetlb:", 0) == 0)
      info.hugetlb += std::stoull(line.substr(line.find(':') + 1)) * 1024;
    if (line.rfind("KernelPageSize:", 0) == 0) info.kernel_page_size = std::stoull(line.substr(15)) * 1024;
  }
  return info;
}

// The nice value of each thread of a process, by thread id.
inline std::map<pid_t, int> ThreadNiceValues(pid_t pid) {
  std::map<pid_t, int> nice;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The fields after the command name (which ends at the last ')'): nice is the 17th.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 0; i < 17; ++i) rest >> field;
    nice[static_cast<pid_t>(std::stol(task.path().filename().string()))] = std::stoi(field);
  }
  return nice;
}

}  // namespace membroker::testing
