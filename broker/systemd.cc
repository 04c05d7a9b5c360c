#include "systemd.h"

#include <sys/socket.h>

#ifdef MEMBROKER_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace membroker::broker::systemd {

#ifdef MEMBROKER_HAVE_SYSTEMD

int ActivatedClientSocket() {
  const int n = sd_listen_fds(/*unset_environment=*/1);
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    if (sd_is_socket_unix(fd, SOCK_SEQPACKET, /*listening=*/1, nullptr, 0) > 0) return fd;
  }
  return -1;
}

bool Notify(const std::string& state) { return sd_notify(0, state.c_str()) > 0; }

uint64_t WatchdogIntervalMs() {
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec / 1000 : 0;
}

bool Available() { return true; }

#else

int ActivatedClientSocket() { return -1; }
bool Notify(const std::string&) { return false; }
uint64_t WatchdogIntervalMs() { return 0; }
bool Available() { return false; }

#endif

}  // namespace membroker::broker::systemd
