// Access rules between processes of different uids (children drop to
// nobody:nogroup with setuid as root), and connections that outlive the
// process that opened them.
#include <dirent.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>

#include <grp.h>
#include <signal.h>

#include <algorithm>
#include <climits>
#include <vector>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "raw_client.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

#define REQUIRE_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create processes of another uid"

bool BecomeNobody() {
  return ::setgroups(0, nullptr) == 0 && ::setgid(kNogroup) == 0 && ::setuid(kNobody) == 0;
}

TEST(Access, OtherUidsAreRefusedByDefault) {
  REQUIRE_ROOT();
  BrokerProcess b({"--socket-group", std::to_string(kNogroup)});
  std::string s = b.socket();
  pid_t pid = ForkChild([&] {
    if (!BecomeNobody()) return 10;
    auto c = Client::Connect({s, "intruder"});
    if (c.ok()) return 1;
    return c.code() == ErrorCode::kPermissionDenied &&
                   c.status().message().find("--allow-uid") != std::string::npos
               ? 0
               : 2;
  });
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(b.WaitForStat("clients_refused", 1), 1u);
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
}

TEST(Access, SocketFileModeKeepsOthersOutBeforeThePolicy) {
  REQUIRE_ROOT();
  BrokerProcess b;  // socket root:root 0660
  std::string s = b.socket();
  pid_t pid = ForkChild([&] {
    if (!BecomeNobody()) return 10;
    auto c = Client::Connect({s, "intruder"});
    return !c.ok() && c.status().message().find("Permission denied") != std::string::npos ? 0 : 1;
  });
  EXPECT_EQ(WaitChild(pid), 0);
}

// A process of nobody (primary group nogroup) connects and allocates: 0 when served.
int ServedAsNobody(const std::string& socket) {
  return WaitChild(ForkChild([&] {
    if (!BecomeNobody()) return 10;
    auto c = Client::Connect({socket, "guest"});
    if (!c.ok()) return 1;
    return c->MallocPhysical(4096).ok() ? 0 : 2;
  }));
}

TEST(Access, AdmittedGroupCanUseTheBroker) {
  REQUIRE_ROOT();
  BrokerProcess b({"--socket-group", std::to_string(kNogroup), "--allow-gid", std::to_string(kNogroup)});
  EXPECT_EQ(ServedAsNobody(b.socket()), 0);
}

// Groups by name, as the shipped units give them (--allow-gid membroker,
// SocketGroup=membroker): the same admission as by number. A group that does
// not exist, or gid 4294967295, is a usage error naming the flag.
TEST(Access, AGroupByNameIsAdmittedAndAnUnknownOneIsAClearError) {
  REQUIRE_ROOT();
  const group* g = ::getgrgid(kNogroup);
  ASSERT_NE(g, nullptr) << "this machine has no group " << kNogroup;
  const std::string name = g->gr_name;
  BrokerProcess b({"--socket-group", name, "--allow-gid", name});
  EXPECT_EQ(ServedAsNobody(b.socket()), 0);
  for (const char* bad : {"no-such-group-here", "4294967295", "99999999999"}) {
    auto r = RunBrokerExpectingExit({"--socket", b.dir() + "/other.sock", "--allow-gid", bad});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.output.find(std::string("bad value '") + bad + "' for allow-gid"), std::string::npos) << r.output;
  }
  auto r = RunBrokerExpectingExit({"--socket", b.dir() + "/other.sock", "--socket-group", "no-such-group-here"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--socket-group: unknown group 'no-such-group-here'"), std::string::npos) << r.output;
}

// --allow-gid also admits a process whose primary group is another one and
// which has the group only among its supplementary groups; a process with
// neither is refused.
TEST(Access, AdmittedSupplementaryGroupCanUseTheBroker) {
  REQUIRE_ROOT();
  constexpr gid_t kOtherGroup = 65533;
  BrokerProcess b({"--socket-group", std::to_string(kNogroup), "--allow-gid", std::to_string(kNogroup)});
  std::string s = b.socket();
  auto connect_as = [&](bool with_group) {
    return ForkChild([&, with_group] {
      const gid_t groups[] = {kNogroup};
      if (::setgroups(with_group ? 1 : 0, groups) != 0 || ::setgid(kOtherGroup) != 0 ||
          ::setuid(kNobody) != 0)
        return 10;
      auto c = Client::Connect({s, "member"});
      if (!with_group) return c.ok() ? 3 : 0;
      if (!c.ok()) return 1;
      return c->MallocPhysical(4096).ok() ? 0 : 2;
    });
  };
  EXPECT_EQ(WaitChild(connect_as(true)), 0);
  // Without the group the socket file's mode (0660, group nogroup) keeps it
  // out before the broker's policy does.
  EXPECT_EQ(WaitChild(connect_as(false)), 0);
}

// The broker memfds open in this process (fd numbers).
std::vector<int> BrokerMemfds() {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) {
    char link[PATH_MAX] = {};
    std::string p = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(p.c_str(), link, sizeof(link) - 1) > 0 && std::strstr(link, "memfd:membroker"))
      fds.push_back(std::atoi(e->d_name));
  }
  ::closedir(d);
  return fds;
}

// In the child: import token, expect `want`; when it succeeds, also try to
// map the received fd writable behind the library's back.
int ImportAs(const std::string& socket, const std::string& token, ErrorCode want, bool expect_read_only) {
  auto c = Client::Connect({socket, "other-uid"});
  if (!c.ok()) return 10;
  std::vector<int> before = BrokerMemfds();  // inherited from the parent by fork
  auto h = c->ImportFromShareableHandle(token);
  if (h.code() != want) return 11;
  if (!h.ok()) return 0;
  if (h->read_only() != expect_read_only) return 12;
  int received = -1;
  for (int fd : BrokerMemfds())
    if (std::find(before.begin(), before.end(), fd) == before.end()) received = fd;
  if (received < 0) return 13;
  void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, received, 0);
  bool writable = m != MAP_FAILED;
  return writable == !expect_read_only ? 0 : 14;
}

TEST(Access, CrossUidImportNeedsThePidListAndReadOnlyIsEnforcedByTheKernel) {
  REQUIRE_ROOT();
  BrokerProcess b({"--socket-group", std::to_string(kNogroup), "--allow-gid", std::to_string(kNogroup)});
  auto c = Client::Connect({b.socket(), "root-exporter"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(1 << 20);
  ASSERT_TRUE(h.ok());
  std::string s = b.socket();
  // Same-uid sharing does not reach another uid.
  auto open_token = c->ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(open_token.ok());
  std::string t1 = *open_token;
  pid_t pid = ForkChild([&] { return BecomeNobody() ? ImportAs(s, t1, ErrorCode::kNotFound, false) : 10; });
  EXPECT_EQ(WaitChild(pid), 0);
  // Named by pid, read-only: imported, and the fd cannot be mapped writable.
  auto ro_token = c->ExportToShareableHandle(*h, kExportReadOnly);
  ASSERT_TRUE(ro_token.ok());
  std::string t2 = *ro_token;
  Channel ch;
  pid = ForkChild([&] {
    ch.AsChild();
    if (!BecomeNobody()) return 10;
    ch.Receive();
    return ImportAs(s, t2, ErrorCode::kOk, /*expect_read_only=*/true);
  });
  ch.AsParent();
  pid_t list[] = {pid};
  ASSERT_TRUE(c->SetPidToShareableHandle(t2, list).ok());
  ch.Send("go");
  EXPECT_EQ(WaitChild(pid), 0);
}

TEST(Access, ConnectionHandedOnByAnExitedProcessCannotImport) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "exporter"});
  ASSERT_TRUE(c.ok());
  auto h = c->MallocPhysical(4096);
  auto token = c->ExportToShareableHandle(*h);
  ASSERT_TRUE(token.ok());
  std::string s = b.socket(), t = *token;
  Channel ch;
  pid_t first = ForkChild([&] {
    ch.AsChild();
    auto mine = Client::Connect({s, "hands-on"});
    if (!mine.ok()) return 1;
    RawClient raw(s);  // the same, below the library (which refuses a forked child's calls)
    raw.Hello();
    ch.Send("connected");
    ch.Receive();  // the parent allow-lists this pid
    // Hand the connection to a new process and exit; the new one tries to import.
    // The heir waits on a pidfd of this process: readable once it has exited.
    int self = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    if (self < 0) return 2;
    pid_t heir = ::fork();
    if (heir == 0) {
      pollfd gone{self, POLLIN, 0};
      while (::poll(&gone, 1, -1) < 0 && errno == EINTR) {
      }
      auto got = mine->ImportFromShareableHandle(t);
      if (got.code() != ErrorCode::kNotConnected) {
        ch.Send("the library let a forked child call on its parent's connection");
        _exit(0);
      }
      if (!raw.SendMsg(ipc::ImportRequest{t}).ok()) _exit(3);
      ch.Send(ErrorOf(raw.Next()) == ErrorCode::kNotFound ? "refused" : "imported");
      _exit(0);
    }
    _exit(0);
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "connected");
  pid_t list[] = {first};
  ASSERT_TRUE(c->SetPidToShareableHandle(t, list).ok());
  ch.Send("go");
  EXPECT_EQ(WaitChild(first), 0);
  EXPECT_EQ(ch.Receive(), "refused");
}

}  // namespace
}  // namespace membroker::testing
