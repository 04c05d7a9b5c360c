// membrokerd --supervise: the keeper holds the fd store (systemd's protocol,
// the broker's systemd code path) and starts the broker again when it dies.
// Real keeper, real brokers, SIGKILL; readiness from the keeper's --ready-fd
// (a line per start), never a sleep.
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/kv_store.h"
#include "membroker/ipc/admin_client.h"

namespace membroker::testing {
namespace {

constexpr size_t kSize = 2 << 20;

std::string TempDir() {
  char tmpl[] = "/tmp/membroker-keeper.XXXXXX";
  return ::mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}

#ifdef MEMBROKER_HAVE_SYSTEMD
#define MB_KEEPER_OR_SKIP()
#else
#define MB_KEEPER_OR_SKIP() GTEST_SKIP() << "built without libsystemd: --supervise refuses to run"
#endif

bool Alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

void Fill(char* p, size_t n, int seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(i * 31 + seed);
}
bool HasFill(const char* p, size_t n, int seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<char>(i * 31 + seed)) return false;
  return true;
}

// A keeper started with --supervise, its broker's readiness read line by line.
class Keeper {
 public:
  // prefix: a command the keeper runs under (unshare, for a container's PID 1).
  explicit Keeper(std::vector<std::string> extra = {}, std::vector<std::string> prefix = {}) : dir_(TempDir()) {
    EXPECT_FALSE(dir_.empty());
    socket_ = dir_ + "/b.sock";
    int ready[2];
    EXPECT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    const int log = ::open((dir_ + "/keeper.log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    std::vector<std::string> argv = {BinaryPath("membrokerd"), "--supervise", "--socket", socket_, "--ready-fd", "3"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.begin(), prefix.begin(), prefix.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(ready[1], 3);
      ::dup2(log, 2);
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(s.data());
      a.push_back(nullptr);
      ::execvp(a[0], a.data());
      ::_exit(127);
    }
    ::close(ready[1]);
    ::close(log);
    ready_ = ready[0];
  }
  ~Keeper() {
    if (Alive(pid_)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (pid_t b : brokers_)
      if (Alive(b)) ::kill(b, SIGKILL);
    ::close(ready_);
    std::string rm = "rm -rf " + dir_;
    (void)std::system(rm.c_str());
  }
  // The pid of the next broker that became ready (bounded: 30 s), or 0.
  pid_t NextReady() {
    std::string line;
    char c;
    for (;;) {
      pollfd p{ready_, POLLIN, 0};
      if (::poll(&p, 1, 30'000) != 1 || ::read(ready_, &c, 1) != 1) return 0;
      if (c == '\n') break;
      line += c;
    }
    if (line.rfind("READY ", 0) != 0) return 0;
    brokers_.push_back(static_cast<pid_t>(std::stol(line.substr(6))));
    return brokers_.back();
  }
  // SIGTERM to the keeper (or to `to`, the keeper under a prefix); the exit
  // code of what was started (or 128+signal), bounded by the test's timeout.
  int Stop(pid_t to = 0) {
    ::kill(to > 0 ? to : pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // One number of the broker's `stats --json`, or UINT64_MAX.
  uint64_t Stat(const std::string& key) const {
    auto json = ipc::AskAdmin(socket_ + ".admin", "stats --json");
    const std::string field = "\"" + key + "\":";
    const size_t at = json.ok() ? json->find(field) : std::string::npos;
    return at == std::string::npos ? UINT64_MAX : std::strtoull(json->c_str() + at + field.size(), nullptr, 10);
  }
  // Waits (bounded, 10 s, polling the admin socket) until Stat(key) >= value.
  bool WaitForStatAtLeast(const std::string& key, uint64_t value) const {
    for (int i = 0; i < 1000; ++i) {
      const uint64_t v = Stat(key);
      if (v != UINT64_MAX && v >= value) return true;
      ::poll(nullptr, 0, 10);
    }
    return false;
  }
  std::string Log() const {
    std::ifstream in(dir_ + "/keeper.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_, socket_;
  pid_t pid_ = -1;
  int ready_ = -1;
  std::vector<pid_t> brokers_;
};

// The weight-sharing case of issue 33: a persistent name whose publisher has
// exited, and a worker holding memory, across a SIGKILL of the broker.
TEST(Keeper, ABrokerKilledComesBackWithPersistentNamesAndHeldMemory) {
  MB_KEEPER_OR_SKIP();
  Keeper k;
  const pid_t first = k.NextReady();
  ASSERT_GT(first, 0) << k.Log();

  // A publisher that exits: only the broker (and its fd store) keeps the name.
  pid_t publisher = ForkChild([&] {
    auto c = Client::Connect({k.socket(), "publisher"});
    if (!c.ok()) return 1;
    auto h = c->MallocPhysical(kSize);
    if (!h.ok()) return 2;
    auto m = MapWhole(*c, *h);
    if (!m.ok()) return 3;
    Fill(m->as<char>(), kSize, 7);
    return c->Publish("weights", *h, kPublishPersist | kPublishReadOnly).ok() ? 0 : 4;
  });
  ASSERT_EQ(WaitChild(publisher), 0);
  ASSERT_TRUE(k.WaitForStatAtLeast("fd_store_states", 1));
  pid_t second = 0;
  {
    // A worker (this process) holding memory of its own.
    auto worker = Client::Connect({k.socket(), "worker"});
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    auto held = worker->MallocPhysical(kSize);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    auto mapped = MapWhole(*worker, *held);
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    Fill(mapped->as<char>(), kSize, 11);
    EXPECT_GE(k.Stat("fd_store_stored"), 2u);

    ASSERT_EQ(::kill(first, SIGKILL), 0);
    second = k.NextReady();
    ASSERT_GT(second, 0) << k.Log();
    EXPECT_NE(second, first);
    EXPECT_TRUE(Alive(k.pid()));
    EXPECT_GE(k.Stat("fd_store_restored"), 2u) << k.Log();

    // A new reader finds the name with its bytes; the worker's mapping and handle still work.
    auto reader = Client::Connect({k.socket(), "reader"});
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    auto named = reader->Lookup("weights", 5000);
    ASSERT_TRUE(named.ok()) << named.status().ToString() << "\n" << k.Log();
    auto view = MapWhole(*reader, *named);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_TRUE(HasFill(view->as<char>(), kSize, 7));
    EXPECT_TRUE(HasFill(mapped->as<char>(), kSize, 11));
    ASSERT_TRUE(worker->WaitForReattach(1, 30000).ok());   // its reattach runs on a thread of its own
    auto shared = worker->ExportToShareableHandle(*held);  // a request on the reattached client
    ASSERT_TRUE(shared.ok()) << shared.status().ToString();

  }  // the clients go
  // A clean stop: the keeper forwards SIGTERM, the broker exits 0, so does the keeper.
  EXPECT_EQ(k.Stop(), 0) << k.Log();
  EXPECT_FALSE(Alive(second));
  EXPECT_NE(k.Log().find("broker_exited"), std::string::npos) << k.Log();
}

// A KV-cache store outlives a SIGKILLed broker under the keeper (its index
// and slabs are in the fd store): a new broker makes it again with every
// sealed block, the same id and keys; a lease taken before the crash stays
// readable; the store is written again after.
TEST(Keeper, AKvStoreComesBackAfterTheBrokerIsKilled) {
  MB_KEEPER_OR_SKIP();
  Keeper k;
  const pid_t first = k.NextReady();
  ASSERT_GT(first, 0) << k.Log();
  auto c = Client::Connect({k.socket(), "engine"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto store = KvStore::Create(*c, "model/kv", {.block_size = 4096, .capacity = 2048 * 4096});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> values;
  for (int i = 0; i < 1500; ++i) {
    keys.push_back("block-" + std::to_string(i));
    bytes.emplace_back(4096, static_cast<std::byte>(i * 7));
  }
  for (const auto& b : bytes) values.emplace_back(b);
  auto put = store->Put(keys, values);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  for (ErrorCode code : *put) ASSERT_EQ(code, ErrorCode::kOk);
  auto held = store->Get(std::span(keys).first(4));
  ASSERT_TRUE(held.ok()) << held.status().ToString();

  ASSERT_EQ(::kill(first, SIGKILL), 0);
  const pid_t second = k.NextReady();
  ASSERT_GT(second, 0) << k.Log();
  ASSERT_TRUE(c->WaitForReattach(1, 30000).ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(held->data(i)[4095], static_cast<std::byte>(i * 7)) << i;
  auto got = store->Get(keys);  // (waits while the store is being made again)
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(k.Stat("kv_stores"), 1u) << k.Log();
  EXPECT_EQ(k.Stat("kv_stores_restoring"), 0u) << k.Log();
  EXPECT_EQ(k.Stat("kv_blocks"), 1500u) << k.Log();
  ASSERT_EQ(got->leading(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    ASSERT_EQ(std::memcmp(got->data(i).data(), bytes[i].data(), 4096), 0) << keys[i];
  got->Release();
  held->Release();
  std::vector<std::string> more{"after-the-crash"};
  auto again = store->Put(more, std::span(values).first(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->at(0), ErrorCode::kOk);
  EXPECT_EQ(k.Stat("kv_blocks"), 1501u);
  auto check = ipc::AskAdmin(k.socket() + ".admin", "check");
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(*check, "tables: consistent\n");
  *store = KvStore();
  *c = Client();
  EXPECT_EQ(k.Stop(), 0) << k.Log();
}

// Anyone in the network namespace can reach the keeper's abstract address:
// a datagram from another process (here, one removing the stored state and
// storing an fd of its own) changes nothing.
TEST(Keeper, DatagramsFromAnyoneButItsBrokerAreIgnored) {
  MB_KEEPER_OR_SKIP();
  Keeper k;
  const pid_t first = k.NextReady();
  ASSERT_GT(first, 0) << k.Log();
  {
    auto c = Client::Connect({k.socket(), "publisher"});
    ASSERT_TRUE(c.ok());
    auto h = c->MallocPhysical(4096);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(c->Publish("kept", *h, kPublishPersist).ok());
  }
  // The name is in the store once a state memfd is (the turn of the loop after Publish).
  ASSERT_TRUE(k.WaitForStatAtLeast("fd_store_states", 1));
  // The broker's environment says where the keeper listens.
  std::ifstream env("/proc/" + std::to_string(first) + "/environ");
  std::string var, notify;
  while (std::getline(env, var, '\0'))
    if (var.rfind("NOTIFY_SOCKET=", 0) == 0) notify = var.substr(14);
  ASSERT_EQ(notify.rfind("@", 0), 0u) << notify;
  int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, notify.data() + 1, notify.size() - 1);
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + notify.size());
  for (const char* forged : {"FDSTOREREMOVE=1\nFDNAME=state-1", "FDSTOREREMOVE=1\nFDNAME=state-2", "READY=1"}) {
    ASSERT_EQ(::sendto(s, forged, std::strlen(forged), 0, reinterpret_cast<sockaddr*>(&addr), len),
              static_cast<ssize_t>(std::strlen(forged)));
  }
  ::close(s);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_GT(k.NextReady(), 0) << k.Log();  // not the forged READY=1: a line per broker that said it
  auto reader = Client::Connect({k.socket(), "reader"});
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE(reader->Lookup("kept", 5000).ok()) << k.Log();
  EXPECT_NE(k.Log().find("notify_ignored"), std::string::npos) << k.Log();
  reader = Client();
  EXPECT_EQ(k.Stop(), 0) << k.Log();
}

// The one child of a process (from /proc), or 0.
pid_t OnlyChild(pid_t parent) {
  std::ifstream in("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) + "/children");
  pid_t child = 0;
  return in >> child ? child : 0;
}

// Runs fn in a process inside the PID namespace of `target`; fn's return value.
int InPidNamespaceOf(pid_t target, const std::function<int()>& fn) {
  pid_t child = ForkChild([&] {
    const int ns = ::open(("/proc/" + std::to_string(target) + "/ns/pid").c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || ::setns(ns, CLONE_NEWPID) != 0) return 100;
    return WaitChild(ForkChild(fn));  // setns moves only the children made after it
  });
  return WaitChild(child);
}

// As PID 1 of a container (a new PID namespace): signals without a handler
// would be dropped there, and every orphan is its to reap. The keeper still
// restarts a killed broker and stops on SIGTERM.
TEST(Keeper, AsPid1OfAContainer) {
  MB_KEEPER_OR_SKIP();
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a PID namespace";
  RunResult probe = RunProgram({"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "true"});
  if (probe.exit_code != 0) GTEST_SKIP() << "unshare --pid refused here: " << probe.output;
  Keeper k({}, {"/usr/bin/unshare", "--pid", "--fork", "--kill-child", "--mount-proc"});
  ASSERT_GT(k.NextReady(), 0) << k.Log();  // its pid inside the namespace: never signalled from here
  const pid_t keeper = OnlyChild(k.pid());
  ASSERT_GT(keeper, 0);
  std::ifstream status("/proc/" + std::to_string(keeper) + "/status");
  std::string line, nspid;
  while (std::getline(status, line))
    if (line.rfind("NSpid:", 0) == 0) nspid = line;
  EXPECT_NE(nspid.find("\t1"), std::string::npos) << nspid;  // PID 1 inside
  // A client outside the namespace is refused, and told why.
  auto outside = Client::Connect({k.socket(), "outside"});
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(outside.status().message().find("PID namespace"), std::string::npos) << outside.status().ToString();
  // Clients inside it: a publisher that exits, then (after a SIGKILL of the broker) a reader.
  ASSERT_EQ(InPidNamespaceOf(keeper,
                             [&] {
                               auto c = Client::Connect({k.socket(), "publisher"});
                               if (!c.ok()) return 1;
                               auto h = c->MallocPhysical(4096);
                               return h.ok() && c->Publish("kept", *h, kPublishPersist).ok() ? 0 : 2;
                             }),
            0);
  ASSERT_TRUE(k.WaitForStatAtLeast("fd_store_states", 1));
  const pid_t broker = OnlyChild(keeper);
  ASSERT_GT(broker, 0);
  ASSERT_EQ(::kill(broker, SIGKILL), 0);
  ASSERT_GT(k.NextReady(), 0) << k.Log();
  EXPECT_EQ(InPidNamespaceOf(keeper,
                             [&] {
                               auto c = Client::Connect({k.socket(), "reader"});
                               return c.ok() && c->Lookup("kept", 5000).ok() ? 0 : 1;
                             }),
            0)
      << k.Log();
  // An orphan in the namespace is the keeper's to reap: a process whose parent
  // exited, then exits itself, must not stay a zombie.
  int release[2], report[2];
  ASSERT_EQ(::pipe2(release, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  // A process inside the namespace starts the orphan and exits at once: the
  // orphan's parent is then the namespace's PID 1.
  ASSERT_EQ(InPidNamespaceOf(keeper,
                             [&] {
                               (void)ForkChild([&] {
                                 ::close(release[1]);
                                 char self[32] = {};  // its pid as this mount's /proc (the test's namespace) numbers it
                                 if (::readlink("/proc/self", self, sizeof(self) - 1) <= 0) return 1;
                                 const pid_t host_pid = static_cast<pid_t>(std::atoi(self));
                                 if (::write(report[1], &host_pid, sizeof(host_pid)) != sizeof(host_pid)) return 2;
                                 char c;
                                 return ::read(release[0], &c, 1) >= 0 ? 0 : 3;  // until the test closes its end
                               });
                               return 0;
                             }),
            0);
  ::close(report[1]);
  ::close(release[0]);
  pid_t orphan = 0;
  ASSERT_EQ(::read(report[0], &orphan, sizeof(orphan)), static_cast<ssize_t>(sizeof(orphan)));
  ::close(report[0]);
  ::close(release[1]);  // the orphan exits now
  bool reaped = false;
  for (int i = 0; i < 1000 && !reaped; ++i) {  // bounded: 10 s
    reaped = ::kill(orphan, 0) != 0 && errno == ESRCH;
    if (!reaped) ::poll(nullptr, 0, 10);
  }
  EXPECT_TRUE(reaped) << "pid " << orphan << " is still there (a zombie nobody reaps)";

  EXPECT_EQ(k.Stop(keeper), 0) << k.Log();  // unshare exits with the keeper's code
}

// The kernel passes at most 128 KiB in one environment string, and
// LISTEN_FDNAMES names every stored fd: past about 5,500 allocations the
// store cannot be handed over. The broker must still come back (without the
// store: clients bring back what they hold), never loop on a failing exec.
TEST(Keeper, AStoreTooLargeToPassIsDroppedAndTheBrokerStillComesBack) {
  MB_KEEPER_OR_SKIP();
  Keeper k;
  const pid_t first = k.NextReady();
  ASSERT_GT(first, 0) << k.Log();
  auto c = Client::Connect({k.socket(), "many"});
  ASSERT_TRUE(c.ok());
  std::vector<PhysicalHandle> held;
  for (int i = 0; i < 6000; ++i) {
    auto h = c->MallocPhysical(4096);
    ASSERT_TRUE(h.ok()) << i << ": " << h.status().ToString();
    held.push_back(std::move(*h));
  }
  ASSERT_TRUE(k.WaitForStatAtLeast("fd_store_stored", 6000));
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_GT(k.NextReady(), 0) << k.Log();
  EXPECT_NE(k.Log().find("fd_store_dropped stored_fds=6000"), std::string::npos) << k.Log();
  ASSERT_TRUE(c->WaitForReattach(1, 30000).ok());
  EXPECT_TRUE(c->ExportToShareableHandle(held.back()).ok());  // what the client held came back with it
}

// A broker that cannot start (its socket's directory does not exist) is not
// restarted in a loop: the keeper exits with its code.
TEST(Keeper, ABrokerThatCannotStartEndsTheKeeper) {
  MB_KEEPER_OR_SKIP();
  RunResult r = RunProgram({BinaryPath("membrokerd"), "--supervise", "--socket", "/nonexistent/dir/b.sock"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("broker_never_ready"), std::string::npos) << r.output;
  r = RunProgram({BinaryPath("membrokerd"), "--supervise", "--socket", "/tmp/x.sock", "--ready-fd", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // A ready fd from a config file would reach the broker, whose fd 3 is stored memory: refused.
  char tmpl[] = "/tmp/membroker-keeper-conf.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string conf = std::string(tmpl) + "/broker.conf";
  std::ofstream(conf) << "ready-fd = 3\n";
  r = RunProgram(
      {BinaryPath("membrokerd"), "--supervise", "--socket", std::string(tmpl) + "/b.sock", "--config", conf});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ready-fd in a config file"), std::string::npos) << r.output;
  ::unlink(conf.c_str());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace membroker::testing
