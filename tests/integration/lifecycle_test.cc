// The daemon's life: readiness, stale and live sockets, clean stop.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <atomic>
#include <thread>
#include <vector>
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"
#include "membroker/ipc/admin_client.h"

namespace membroker::testing {
namespace {

bool Exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

mode_t Mode(const std::string& p) {
  struct stat st {};
  ::lstat(p.c_str(), &st);
  return st.st_mode & 0777;
}

TEST(Lifecycle, ReadyMeansServingAndSocketsHaveTheirModes) {
  BrokerProcess b;
  EXPECT_EQ(Mode(b.socket()), 0660u);
  EXPECT_EQ(Mode(b.admin_socket()), 0600u);
  auto c = Client::Connect({b.socket(), "t"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GT(c->client_id(), 0u);
  EXPECT_TRUE(c->Ping().ok());
}

TEST(Lifecycle, SigtermStopsCleanlyAndUnlinksSockets) {
  BrokerProcess b;
  {
    auto c = Client::Connect({b.socket(), "t"});
    ASSERT_TRUE(c.ok());
    auto h = c->MallocPhysical(1 << 20);
    ASSERT_TRUE(h.ok());
    std::string sock = b.socket(), admin = b.admin_socket();
    EXPECT_EQ(b.Stop(), 0);
    EXPECT_FALSE(Exists(sock));
    EXPECT_FALSE(Exists(admin));
    // The client notices the broker is gone with a clear error.
    EXPECT_EQ(c->Ping().code(), ErrorCode::kNotConnected);
  }
}

TEST(Lifecycle, StaleSocketFromADeadBrokerIsReplaced) {
  char tmpl[] = "/tmp/membroker-stale.XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string path = dir + "/broker.sock";
  {  // a socket file with nobody accepting, as a SIGKILLed broker leaves behind
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  ASSERT_TRUE(Exists(path));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ForkChild([&] {
    ::dup2(ready[1], 3);
    std::string bin = BinaryPath("membrokerd");
    ::execl(bin.c_str(), bin.c_str(), "--socket", path.c_str(), "--ready-fd", "3", nullptr);
    return 127;
  });
  ::close(ready[1]);
  char buf[64] = {};
  ASSERT_GT(::read(ready[0], buf, sizeof(buf) - 1), 0);
  ::close(ready[0]);
  EXPECT_EQ(std::string(buf).rfind("READY", 0), 0u);
  auto c = Client::Connect({path, "t"});
  EXPECT_TRUE(c.ok());
  ::kill(pid, SIGTERM);
  EXPECT_EQ(WaitChild(pid), 0);
  ::unlink((path + ".state").c_str());  // the broker keeps its state file: ours to remove
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

TEST(Lifecycle, LiveBrokerOnTheSamePathIsRefused) {
  BrokerProcess b;
  auto r = RunBrokerExpectingExit({"--socket", b.socket(), "--admin-socket", b.dir() + "/other.admin"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("another broker is serving"), std::string::npos) << r.output;
  // The first broker is untouched.
  auto c = Client::Connect({b.socket(), "t"});
  EXPECT_TRUE(c.ok());
}

TEST(Lifecycle, FailedStartLeavesNoSocketFileBehind) {
  BrokerProcess b;
  std::string mine = b.dir() + "/second.sock";
  auto r = RunBrokerExpectingExit({"--socket", mine, "--admin-socket", b.admin_socket()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("another broker is serving"), std::string::npos) << r.output;
  EXPECT_FALSE(Exists(mine));
}

// A supervisor that cannot be told the broker is ready would wait for ever: a
// --ready-fd that cannot be written is a failed start (exit 1, a reason, both
// socket files removed), never a broker serving unannounced.
TEST(Lifecycle, AnUnwritableReadyFdIsAFailedStart) {
  char tmpl[] = "/tmp/membroker-ready.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, sock = dir + "/b.sock", admin = dir + "/b.admin";
  auto r = RunBrokerExpectingExit({"--socket", sock, "--admin-socket", admin, "--ready-fd", "97"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot report readiness"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--ready-fd 97"), std::string::npos) << r.output;
  EXPECT_FALSE(Exists(sock));
  EXPECT_FALSE(Exists(admin));
  ::unlink((sock + ".state").c_str());  // the broker keeps its state file (docs/RESTART.md): ours to remove
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

// SIGSTOPs the broker and returns once it is stopped (SIGCONT resumes it).
void StopBroker(const BrokerProcess& b) {
  ASSERT_EQ(::kill(b.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(b.pid(), &status, WUNTRACED), b.pid());
  ASSERT_TRUE(WIFSTOPPED(status));
}

// A broker that stops answering but keeps its socket open (here: SIGSTOP)
// gives every call TIMEOUT after call_timeout_ms, never a hang; once it runs
// again, the late replies are dropped and what they granted is released.
TEST(Lifecycle, AStoppedBrokerGivesTimeoutNotAHang) {
  BrokerProcess b;
  ConnectOptions opt{b.socket(), "patient"};
  opt.call_timeout_ms = 200;
  auto c = Client::Connect(opt);
  ASSERT_TRUE(c.ok());
  // Longer than the receive slice (250 ms, client/connection.h): the wait is
  // slices in recvmsg, then poll until the deadline.
  opt.call_timeout_ms = 1200;
  auto slow = Client::Connect(opt);
  ASSERT_TRUE(slow.ok());
  ASSERT_NO_FATAL_FAILURE(StopBroker(b));
  Status ping = c->Ping();
  EXPECT_EQ(ping.code(), ErrorCode::kTimeout) << ping.ToString();
  EXPECT_NE(ping.message().find("did not answer PingRequest"), std::string::npos) << ping.message();
  auto h = c->MallocPhysical(1 << 20);
  EXPECT_EQ(h.code(), ErrorCode::kTimeout);
  const auto asked = std::chrono::steady_clock::now();
  ping = slow->Ping();
  EXPECT_EQ(ping.code(), ErrorCode::kTimeout) << ping.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - asked, std::chrono::milliseconds(1200)) << "gave up early";
  ASSERT_EQ(::kill(b.pid(), SIGCONT), 0);
  // This call reads the two late replies first: the allocation is given back.
  EXPECT_TRUE(c->Ping().ok());
  EXPECT_TRUE(slow->Ping().ok());
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(c->async_errors(), 0u);
  EXPECT_EQ(b.Stat("clients_connected"), 2u);
}

// A client of a stopped broker that frees until its socket is full: 900
// allocations, then frees until one waits past its call's bound (TIMEOUT).
// One-way frees fill a socket fastest (the kernel holds a few hundred).
struct Flooded {
  Client client;
  std::vector<PhysicalHandle> held;
  size_t freed = 0;  // the frees that went into the socket
  Status last;       // the free that found no room
};
void FloodAStoppedBroker(const BrokerProcess& b, Flooded* f) {
  ConnectOptions opt{b.socket(), "flooder"};
  opt.call_timeout_ms = 300;
  auto c = Client::Connect(opt);
  ASSERT_TRUE(c.ok());
  f->client = std::move(*c);
  for (int i = 0; i < 900; ++i) {
    auto h = f->client.MallocPhysical(4096);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    f->held.push_back(std::move(*h));
  }
  ASSERT_NO_FATAL_FAILURE(StopBroker(b));
  while (f->freed < f->held.size() && (f->last = f->client.FreePhysical(f->held[f->freed])).ok()) ++f->freed;
  ASSERT_LT(f->freed, f->held.size()) << "the socket never filled";
  ASSERT_EQ(f->last.code(), ErrorCode::kTimeout) << f->last.ToString();
}

// A broker that does not read fills the client's socket: a send then waits
// no longer than its call's bound, says TIMEOUT and sends nothing, and the
// connection serves again once the broker reads.
TEST(Lifecycle, AStoppedBrokerBoundsTheSendsToo) {
  BrokerProcess b;
  Flooded f;
  ASSERT_NO_FATAL_FAILURE(FloodAStoppedBroker(b, &f));
  EXPECT_NE(f.last.message().find("FreeRequest waited to be sent"), std::string::npos) << f.last.message();
  EXPECT_NE(f.last.message().find("it goes first with the next message"), std::string::npos) << f.last.message();
  Status ping = f.client.Ping();  // its request cannot be sent either
  EXPECT_EQ(ping.code(), ErrorCode::kTimeout) << ping.ToString();
  EXPECT_NE(ping.message().find("PingRequest waited to be sent"), std::string::npos) << ping.message();
  ASSERT_EQ(::kill(b.pid(), SIGCONT), 0);
  EXPECT_TRUE(f.client.Ping().ok());  // the kept free went first
  // Every free is done, the one that timed out too, while the client stays.
  f.held.clear();
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(f.client.async_errors(), 0u);  // none of them was refused
}

// A free kept unsent for a broker that then dies belongs to that broker: the
// client does not send it to the next one (which would refuse a handle the
// client no longer presents), and the next one holds exactly what the client
// still holds.
TEST(Lifecycle, AKeptFreeIsDroppedWhenTheClientReattaches) {
  BrokerProcess b;
  Flooded f;
  ASSERT_NO_FATAL_FAILURE(FloodAStoppedBroker(b, &f));
  const uint64_t still_held = f.held.size() - f.freed - 1;  // the one that timed out is freed here too
  b.Kill();                                                 // with every free in its socket unread
  b.Restart();
  ASSERT_TRUE(f.client.WaitForReattach(1, 10000).ok());
  EXPECT_TRUE(f.client.Ping().ok());  // would carry the kept free first
  EXPECT_EQ(b.Stat("handles_adopted"), still_held);
  EXPECT_EQ(b.Stat("allocations_live"), still_held);
  EXPECT_EQ(f.client.async_errors(), 0u);  // nothing was refused
  f.held.clear();
  EXPECT_EQ(b.WaitForStat("allocations_live", 0), 0u);
  EXPECT_EQ(f.client.async_errors(), 0u);
}

// --ready-fd 1 (stdout) is common: once READY is written the broker keeps fd 1
// open on /dev/null, so an accepted connection never gets that number (one
// that did was never served).
TEST(Lifecycle, ReadyOnStdoutKeepsServing) {
  char tmpl[] = "/tmp/membroker-ready1.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, sock = dir + "/b.sock", admin = dir + "/b.admin";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::close(out[1]);
    std::string bin = BinaryPath("membrokerd");
    ::execl(bin.c_str(), bin.c_str(), "--socket", sock.c_str(), "--admin-socket", admin.c_str(),
            "--ready-fd", "1", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  char buf[64] = {};
  ASSERT_GT(::read(out[0], buf, sizeof(buf) - 1), 0);
  EXPECT_EQ(std::string(buf).rfind("READY ", 0), 0u) << buf;
  for (int i = 0; i < 3; ++i) {
    auto reply = ipc::AskAdmin(admin, "stats", std::chrono::seconds(5));
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto c = Client::Connect({sock, "after-ready"});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->Ping().ok());
  }
  ::kill(pid, SIGTERM);
  EXPECT_EQ(WaitChild(pid), 0);
  ::close(out[0]);
  ::unlink((sock + ".state").c_str());
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

TEST(Lifecycle, NonSocketFileAtThePathIsNotTouched) {
  BrokerProcess b;
  std::string path = b.dir() + "/precious.txt";
  std::ofstream(path) << "keep me";
  auto r = RunBrokerExpectingExit({"--socket", path, "--admin-socket", b.dir() + "/x.admin"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("not a socket"), std::string::npos) << r.output;
  std::ifstream in(path);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "keep me");
}

TEST(Lifecycle, ClientsPastMaxClientsAreTurnedAway) {
  BrokerProcess b({"--max-clients", "2"});
  auto one = Client::Connect({b.socket(), "one"});
  auto two = Client::Connect({b.socket(), "two"});
  ASSERT_TRUE(one.ok() && two.ok());
  auto three = Client::Connect({b.socket(), "three"});
  EXPECT_EQ(three.code(), ErrorCode::kResourceExhausted) << three.status().ToString();
  EXPECT_NE(three.status().message().find("--max-clients"), std::string::npos) << three.status().message();
  EXPECT_TRUE(one->Ping().ok());
  *two = Client();  // a slot frees up
  EXPECT_EQ(b.WaitForStat("clients_connected", 1), 1u);
  EXPECT_TRUE(Client::Connect({b.socket(), "four"}).ok());
}

TEST(Lifecycle, BadFlagsGiveUsage) {
  auto r = RunBrokerExpectingExit({"--bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("usage"), std::string::npos);
  r = RunBrokerExpectingExit({});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(Lifecycle, ConnectToMissingBrokerIsAClearError) {
  auto c = Client::Connect({"/tmp/definitely-not-a-membroker.sock", "t"});
  EXPECT_EQ(c.code(), ErrorCode::kNotConnected);
  EXPECT_NE(c.status().message().find("cannot reach membrokerd"), std::string::npos);
}

TEST(Lifecycle, LargeAllocationDoesNotStallTheLoop) {
  BrokerProcess b;
  auto big = Client::Connect({b.socket(), "big"});
  auto small = Client::Connect({b.socket(), "small"});
  ASSERT_TRUE(big.ok() && small.ok());
  // 2 GiB is reserved page by page on a worker thread. While it is in flight
  // (bytes_pending > 0 seen through the admin socket, which the loop serves)
  // another client's requests complete.
  std::atomic<bool> done{false};
  std::thread t([&] {
    auto h = big->MallocPhysical(size_t{2} << 30);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    done = true;
  });
  int small_requests_while_pending = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (small_requests_while_pending == 0 && !done && std::chrono::steady_clock::now() < deadline) {
    if (b.Stat("bytes_pending") == 0) continue;  // not started yet
    auto h = small->MallocPhysical(4096);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(small->Ping().ok());
    if (b.Stat("bytes_pending") > 0) ++small_requests_while_pending;
  }
  t.join();
  EXPECT_GT(small_requests_while_pending, 0)
      << "no small request completed while the 2 GiB allocation was in flight";
}

}  // namespace
}  // namespace membroker::testing
