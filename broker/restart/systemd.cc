#include "restart/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <cstdlib>

#ifdef MEMBROKER_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace membroker::broker::systemd {

bool StoreAnnounced() {
  const char* v = std::getenv("FDSTORE");
  return v != nullptr && std::strtoul(v, nullptr, 10) > 0;
}

#ifdef MEMBROKER_HAVE_SYSTEMD

PassedFds TakePassedFds() {
  PassedFds out;
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);  // never inherited by what we start
    const bool listening = sd_is_socket_unix(fd, SOCK_SEQPACKET, /*listening=*/1, nullptr, 0) > 0;
    if (listening && !out.client_socket.valid()) out.client_socket.reset(fd);
    else out.stored.emplace_back(names != nullptr && names[i] != nullptr ? names[i] : "", ipc::UniqueFd(fd));
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  return out;
}

bool Notify(const std::string& state) { return sd_notify(0, state.c_str()) > 0; }

bool StoreFd(const std::string& name, int fd) {
  const std::string state = "FDSTORE=1\nFDNAME=" + name;
  return sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1) > 0;
}

bool RemoveStoredFds(const std::string& name) { return Notify("FDSTOREREMOVE=1\nFDNAME=" + name); }

uint64_t WatchdogIntervalMs() {
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec / 1000 : 0;
}

bool Available() { return true; }

#else

PassedFds TakePassedFds() { return {}; }
bool Notify(const std::string&) { return false; }
bool StoreFd(const std::string&, int) { return false; }
bool RemoveStoredFds(const std::string&) { return false; }
uint64_t WatchdogIntervalMs() { return 0; }
bool Available() { return false; }

#endif

}  // namespace membroker::broker::systemd
