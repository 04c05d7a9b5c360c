// membrokerd under systemd's protocols, without a systemd (PID 1 here is not
// systemd): sd_notify READY=1 / WATCHDOG=1 / STOPPING=1 read from our own
// NOTIFY_SOCKET, and socket activation through systemd's own
// systemd-socket-activate.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"
#include "membroker/ipc/admin_client.h"

namespace membroker::testing {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/membroker-sd.XXXXXX";
  return ::mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}

// The next datagram on fd within timeout_ms, or "".
std::string NextNotify(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return "";
  char buf[4096];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// stderr_to: where the child's stderr goes (-1: the test's).
// One byte from fd within timeout_ms; false at EOF or timeout.
bool NextByte(int fd, int timeout_ms, char* out) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && ::read(fd, out, 1) == 1;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int stderr_to = -1) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (stderr_to >= 0) ::dup2(stderr_to, 2);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    ::_exit(127);
  }
  return pid;
}

TEST(Systemd, NotifiesReadyWatchdogAndStopping) {
#ifndef MEMBROKER_HAVE_SYSTEMD
  GTEST_SKIP() << "built without libsystemd";
#endif
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string notify = dir + "/notify";
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  pid_t broker = Spawn({BinaryPath("membrokerd"), "--socket", dir + "/b.sock", "--admin-socket", dir + "/a.sock"},
                       {"NOTIFY_SOCKET=" + notify, "WATCHDOG_USEC=200000"});
  std::string ready = NextNotify(fd, 10000);
  EXPECT_NE(ready.find("READY=1"), std::string::npos) << ready;
  EXPECT_NE(ready.find("STATUS=serving " + dir + "/b.sock"), std::string::npos) << ready;
  // READY=1 means serving: a client gets in at once.
  auto c = Client::Connect({dir + "/b.sock", "after-ready"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string ping = NextNotify(fd, 5000);  // every 100 ms (half of WATCHDOG_USEC)
  EXPECT_NE(ping.find("WATCHDOG=1"), std::string::npos) << ping;
  EXPECT_NE(ping.find("STATUS=serving 1 clients"), std::string::npos) << ping;
  *c = Client();
  ::kill(broker, SIGTERM);
  bool stopping = false;
  for (std::string m; !stopping && !(m = NextNotify(fd, 10000)).empty();)
    stopping = m.find("STOPPING=1") != std::string::npos;
  EXPECT_TRUE(stopping) << "no STOPPING=1 after SIGTERM";
  EXPECT_EQ(WaitChild(broker), 0);
  ::close(fd);
  ::unlink(notify.c_str());
  ::unlink((dir + "/b.sock.state").c_str());  // the broker keeps its state file: ours to remove
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

TEST(Systemd, SocketActivationServesQueuedClients) {
#ifndef MEMBROKER_HAVE_SYSTEMD
  GTEST_SKIP() << "built without libsystemd";
#endif
  if (::access("/usr/bin/systemd-socket-activate", X_OK) != 0)
    GTEST_SKIP() << "systemd-socket-activate is not installed (package systemd)";
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string sock = dir + "/b.sock", admin = dir + "/a.sock";
  // systemd-socket-activate listens, says "Listening on PATH as 3." on
  // stderr (its readiness line), and starts the broker on the first
  // connection with the socket as fd 3 (LISTEN_FDS=1).
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  pid_t act = Spawn({"/usr/bin/systemd-socket-activate", "--seqpacket", "-l", sock, BinaryPath("membrokerd"),
                     "--socket", sock, "--admin-socket", admin},
                    {}, err[1]);
  ::close(err[1]);
  // Whatever fails below, the activator (or the broker it became) goes.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        WaitChild(pid);
      }
    }
  } reaper{act};
  std::string said;
  for (char ch; said.find(" as 3.") == std::string::npos && NextByte(err[0], 10000, &ch);) said += ch;
  // err[0] stays open: the broker the activator becomes logs to that pipe (a
  // few lines, far below its capacity), and a closed pipe would be EPIPE.
  ASSERT_NE(said.find("Listening on " + sock), std::string::npos) << said;
  struct stat st {};
  ConnectOptions o{sock, "queued"};
  o.call_timeout_ms = 10000;
  auto c = Client::Connect(o);  // queued by the kernel until the activated broker accepts
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto h = c->MallocPhysical(4096);
  EXPECT_TRUE(h.ok());
  auto more = Client::Connect(o);
  EXPECT_TRUE(more.ok());
  auto stats = ipc::AskAdmin(admin, "stats", std::chrono::seconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_NE(stats->find("clients_connected: 2"), std::string::npos) << *stats;
  *c = Client();
  *more = Client();
  ::kill(act, SIGTERM);  // the activator exec'd the broker: this is membrokerd
  EXPECT_EQ(WaitChild(act), 0);
  reaper.pid = 0;
  ::close(err[0]);
  // The socket is systemd's (here: the activator's) to remove, not the broker's.
  EXPECT_EQ(::stat(sock.c_str(), &st), 0);
  ::unlink(sock.c_str());
  ::unlink((sock + ".state").c_str());
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

}  // namespace
}  // namespace membroker::testing
