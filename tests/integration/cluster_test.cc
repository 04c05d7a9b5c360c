// The cluster view (docs/CLUSTER.md) against a real etcd (Debian's
// etcd-server, started here on loopback ports of its own) and real brokers:
// hosts find each other, a SIGKILLed broker's record vanishes within its
// lease's TTL and its replacement registers with a new generation, etcd's
// death and return never stop local work, a host name held by a live broker is
// not taken, and hostile records in etcd are ignored. Every wait polls a
// condition with a deadline; none decides a verdict by time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/membroker.h"
#include "membroker/name_share.h"
#include "net_engines.h"

extern char** environ;

namespace membroker::testing {
namespace {

using nlohmann::json;

uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Polls cond until it holds or `seconds` pass; the bound only keeps a broken
// build from hanging, it decides nothing.
bool WaitFor(const std::function<bool()>& cond, int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// One etcd member on loopback, its data in a temp dir; Kill and Start keep the data.
class Etcd {
 public:
  // With tls: a CA, etcd's certificate (for 127.0.0.1) and a client's, made
  // here with openssl; etcd then serves https only and asks every client for
  // a certificate signed by that CA.
  explicit Etcd(bool tls = false) : tls_(tls) {
    char tmpl[] = "/tmp/membroker-etcd-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    client_port_ = FreePort();
    peer_port_ = FreePort();
    if (tls_) MakeCertificates();
    Start();
  }
  const std::string& dir() const { return dir_; }
  ~Etcd() {
    Kill();
    std::system(("rm -rf " + dir_).c_str());
  }
  static bool Installed() { return ::access("/usr/bin/etcd", X_OK) == 0 && ::access("/usr/bin/etcdctl", X_OK) == 0; }

  void Start() {
    const std::string client = (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string log = dir_ + "/etcd.log";
      FILE* f = std::freopen(log.c_str(), "a", stderr);
      if (f == nullptr) _exit(126);
      std::vector<std::string> args{"etcd", "--name", "t", "--data-dir", dir_ + "/data",
                                    "--listen-client-urls", client, "--advertise-client-urls", client,
                                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                    "--initial-cluster", "t=" + peer};
      if (tls_)
        args.insert(args.end(), {"--cert-file", dir_ + "/server.crt", "--key-file", dir_ + "/server.key",
                                 "--trusted-ca-file", dir_ + "/ca.crt", "--client-cert-auth"});
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/usr/bin/etcd", argv.data());
      _exit(127);
    }
    // Ready when it answers a health check (a bounded poll of a readiness signal).
    ASSERT_TRUE(WaitFor([&] { return Ctl({"endpoint", "health"}).exit_code == 0; })) << Log();
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  RunResult Ctl(std::vector<std::string> args) const {
    std::vector<std::string> argv{"/usr/bin/etcdctl", "--endpoints", "127.0.0.1:" + std::to_string(client_port_),
                                  "--command-timeout", "5s"};
    if (!root_password_.empty()) argv.push_back("--user=root:" + root_password_);
    if (tls_)
      argv.insert(argv.end(), {"--cacert", dir_ + "/ca.crt", "--cert", dir_ + "/client.crt", "--key", dir_ + "/client.key"});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProgram(argv);
  }
  std::string url() const { return (tls_ ? "etcds://127.0.0.1:" : "etcd://127.0.0.1:") + std::to_string(client_port_); }
  // etcd's authentication on, with a root user and a user `mb` that may read
  // and write /membroker/t/ only (what an operator gives a broker).
  void EnableAuth(const std::string& mb_password) {
    for (std::vector<std::string> step :
         {std::vector<std::string>{"user", "add", "root", "--new-user-password=root-pw"},
          {"role", "add", "mb"},
          {"role", "grant-permission", "mb", "--prefix=true", "readwrite", "/membroker/t/"},
          {"user", "add", "mb", "--new-user-password=" + mb_password},
          {"user", "grant-role", "mb", "mb"},
          {"auth", "enable"}}) {
      RunResult r = Ctl(step);
      ASSERT_EQ(r.exit_code, 0) << step[0] << " " << step[1] << ": " << r.output;
    }
    root_password_ = "root-pw";
  }
  std::string Log() const {
    std::ifstream in(dir_ + "/etcd.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string dir_;
  void MakeCertificates() {
    const std::string script =
        "set -e; cd '" + dir_ + "'; "
        "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1 2>/dev/null; chmod 600 $1; }; "
        "key ca.key; openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj /CN=membroker-test-ca; "
        "sign() { key $1.key; openssl req -new -key $1.key -out $1.csr -subj /CN=$2; "
        "  printf '%s\\n' \"$3\" > $1.ext; "
        "  openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $1.crt -days 2 -extfile $1.ext 2>/dev/null; }; "
        "sign server etcd 'subjectAltName=IP:127.0.0.1'; sign client membroker 'extendedKeyUsage=clientAuth'; "
        "key other-ca.key; openssl req -x509 -new -key other-ca.key -out other-ca.crt -days 2 -subj /CN=someone-else";
    RunResult r = RunProgram({"/bin/sh", "-c", script});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  bool tls_ = false;
  uint16_t client_port_ = 0, peer_port_ = 0;
  pid_t pid_ = -1;
  std::string root_password_;
};

std::string PasswordFile(const std::string& dir, const std::string& name, const std::string& password) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << password << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

// A lease of 10 s unless a test needs records to go sooner: a loaded machine
// that stalls a broker's keep-alives for less than that changes no verdict.
std::vector<std::string> ClusterArgs(const Etcd& etcd, const std::string& host, const std::string& ns = "t",
                                     const std::string& ttl_s = "10") {
  return {"--cluster", etcd.url(), "--cluster-namespace", ns, "--host-name", host, "--cluster-ttl-s", ttl_s};
}

// `membrokerctl list hosts --json` through the binary; null when it answered an error.
json Hosts(const BrokerProcess& b) {
  RunResult r = RunProgram({BinaryPath("membrokerctl"), "--admin-socket", b.admin_socket(), "--json", "list", "hosts"});
  if (r.exit_code != 0) return nullptr;
  json j = json::parse(r.output, nullptr, false);
  return j.is_array() ? j : json(nullptr);
}

const json* HostIn(const json& hosts, const std::string& name) {
  if (!hosts.is_array()) return nullptr;
  for (const json& h : hosts)
    if (h.value("host", "") == name) return &h;
  return nullptr;
}

std::string StatText(const BrokerProcess& b, const std::string& key) {
  json j = json::parse(b.Admin("stats --json"), nullptr, false);
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

#define SKIP_WITHOUT_ETCD() \
  if (!Etcd::Installed()) GTEST_SKIP() << "etcd-server and etcd-client are not installed (scripts/test installs them)"

TEST(Cluster, HostsFindEachOtherAndADeadHostsRecordVanishes) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess a(ClusterArgs(etcd, "host-a"));
  BrokerProcess b(ClusterArgs(etcd, "host-b", "t", "2"));  // its record goes 2 s after its SIGKILL
  json hosts;
  ASSERT_TRUE(WaitFor([&] {
    hosts = Hosts(a);
    return HostIn(hosts, "host-a") != nullptr && HostIn(hosts, "host-b") != nullptr;
  })) << hosts.dump() << a.Admin("stats");
  EXPECT_TRUE((*HostIn(hosts, "host-a"))["self"].get<bool>());
  EXPECT_FALSE((*HostIn(hosts, "host-b"))["self"].get<bool>());
  EXPECT_EQ((*HostIn(hosts, "host-b"))["pid"].get<int>(), b.pid());
  const uint64_t b_generation = (*HostIn(hosts, "host-b"))["generation"].get<uint64_t>();
  EXPECT_EQ(a.Stat("cluster_up"), 1u);
  EXPECT_EQ(b.Stat("cluster_generation"), b_generation);
  // As an operator reads it: the table's header, and a row per host.
  RunResult text = RunProgram({BinaryPath("membrokerctl"), "--admin-socket", a.admin_socket(), "list", "hosts"});
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_EQ(text.output.rfind("HOST", 0), 0u) << text.output;
  EXPECT_NE(text.output.find("host-b"), std::string::npos) << text.output;
  EXPECT_NE(a.Admin("metrics").find("membroker_cluster_up 1"), std::string::npos);

  // SIGKILL: no goodbye, no revoke. Only the lease's end removes the record.
  b.Kill();
  ASSERT_TRUE(WaitFor([&] {
    hosts = Hosts(a);
    return hosts.is_array() && HostIn(hosts, "host-b") == nullptr;
  })) << hosts.dump();
  EXPECT_GE(a.Stat("cluster_hosts_gone"), 1u);

  // Its replacement registers anew: a new generation, told apart from the old.
  b.Restart();
  ASSERT_TRUE(WaitFor([&] {
    hosts = Hosts(a);
    return HostIn(hosts, "host-b") != nullptr;
  })) << hosts.dump();
  EXPECT_GT((*HostIn(hosts, "host-b"))["generation"].get<uint64_t>(), b_generation);
  EXPECT_EQ((*HostIn(hosts, "host-b"))["pid"].get<int>(), b.pid());

  // An orderly stop revokes the lease: the record goes without waiting for the TTL.
  EXPECT_EQ(b.Stop(), 0);
  EXPECT_EQ(etcd.Ctl({"get", "--prefix", "/membroker/t/hosts/host-b"}).output, "");
}

TEST(Cluster, AHostListsTheEnginesThatListenAndDropsThemWhenTheyGo) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess b(ClusterArgs(etcd, "host-e"));
  auto c = Client::Connect({b.socket(), "engines"});
  ASSERT_TRUE(c.ok());
  const std::string secret = SecretFile(b.dir(), "cluster-test-secret");
  std::string address;
  {
    TransferEngine engine(*c);
    Status st = engine.Initialize("decode-0", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret}});
    MB_UCX_OR_SKIP(st);
    ASSERT_TRUE(st.ok()) << st.ToString();
    NetworkStats ns;
    ASSERT_TRUE(engine.GetNetworkStats(ns).ok());
    address = ns.listen_address;
    json hosts;
    ASSERT_TRUE(WaitFor([&] {
      const json* h = HostIn(hosts = Hosts(b), "host-e");
      return h != nullptr && (*h)["engines"] == "decode-0=" + address;
    })) << hosts.dump();
    // As another host's broker reads it, straight from etcd.
    EXPECT_NE(etcd.Ctl({"get", "/membroker/t/hosts/host-e", "--print-value-only"}).output.find(address),
              std::string::npos);
  }
  json hosts;
  ASSERT_TRUE(WaitFor([&] {
    const json* h = HostIn(hosts = Hosts(b), "host-e");
    return h != nullptr && (*h)["engines"] == "-";
  })) << hosts.dump();
}

// The issue's first case: a prefill engine on host a finds decode-0 on host b
// by its name alone and writes KV blocks into it, over the network path.
TEST(Cluster, AnEngineOnAnotherHostIsConnectedByItsName) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess a(ClusterArgs(etcd, "host-a")), b(ClusterArgs(etcd, "host-b"));
  auto ca = Client::Connect({a.socket(), "prefill"});
  auto cb = Client::Connect({b.socket(), "decode"});
  ASSERT_TRUE(ca.ok() && cb.ok());
  const std::string secret = SecretFile(a.dir(), "cluster-secret");
  TransferEngine decode(*cb), prefill(*ca);
  Status init = decode.Initialize("decode-0", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret}});
  MB_UCX_OR_SKIP(init);
  ASSERT_TRUE(init.ok()) << init.ToString();
  constexpr size_t kSize = 1 << 20;
  Memory remote = Register(*cb, decode, kSize);
  ASSERT_TRUE(prefill.Initialize("prefill-0", {{"secret_file", secret}}).ok());
  Memory local = Register(*ca, prefill, kSize);

  // Resolved through host a's table of the cluster; waits (up to the timeout)
  // for host b's record to list decode-0.
  Status st = prefill.Connect("decode-0", 60000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ConnectionInfo info;
  ASSERT_TRUE(prefill.GetConnectionInfo("decode-0", info).ok());
  EXPECT_EQ(info.path, "ucx");
  EXPECT_EQ(info.engine, "decode-0");
  for (size_t i = 0; i < kSize; ++i) local.data()[i] = static_cast<char>(i * 7 + 3);
  std::vector<TransferOpDesc> blocks;
  for (size_t i = 0; i < 64; ++i) blocks.push_back({local.addr() + i * 16384, remote.addr() + i * 16384, 16384});
  ASSERT_TRUE(prefill.TransferSync("decode-0", WRITE, blocks, 30000).ok());
  ASSERT_EQ(std::memcmp(remote.data(), local.data(), kSize), 0);

  // A name no host has: NOT_FOUND at once without a wait, TIMEOUT after one.
  EXPECT_EQ(prefill.Connect("nowhere", 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(prefill.Connect("nowhere", 300).code(), ErrorCode::kTimeout);

  // A connect that waits for an engine that appears later on the other host.
  auto cb1 = Client::Connect({b.socket(), "decode-1"});
  ASSERT_TRUE(cb1.ok());
  Status waited = Status(ErrorCode::kInternal, "not run");
  std::thread connector([&] { waited = prefill.Connect("decode-1", 60000); });
  TransferEngine decode1(*cb1);
  Status init1 = decode1.Initialize("decode-1", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret}});
  connector.join();  // before any ASSERT: a joinable thread must not outlive the test body
  ASSERT_TRUE(init1.ok()) << init1.ToString();
  ASSERT_TRUE(waited.ok()) << waited.ToString();
  EXPECT_TRUE(prefill.GetConnectionInfo("decode-1", info).ok());
  // A transfer completes the connection's wire-up on both sides before it is
  // torn down: UCX (1.13, Debian's) asserts when a listener's worker is
  // destroyed with its wire-up reply still queued (docs/CLUSTER.md).
  Memory remote1 = Register(*cb1, decode1, 4096);
  ASSERT_TRUE(prefill.TransferSync("decode-1", WRITE, {{local.addr(), remote1.addr(), 4096}}, 30000).ok());
  ASSERT_EQ(std::memcmp(remote1.data(), local.data(), 4096), 0);
  EXPECT_EQ(prefill.Disconnect("decode-1", 5000).code(), ErrorCode::kOk);
  EXPECT_EQ(prefill.Disconnect("decode-0", 5000).code(), ErrorCode::kOk);
}

// `membrokerctl list names --cluster --json` through the binary; null on an error.
json ClusterNames(const BrokerProcess& b) {
  RunResult r = RunProgram(
      {BinaryPath("membrokerctl"), "--admin-socket", b.admin_socket(), "--json", "list", "names", "--cluster"});
  if (r.exit_code != 0) return nullptr;
  json j = json::parse(r.output, nullptr, false);
  return j.is_array() ? j : json(nullptr);
}

// The next `want` events of a subscriber, read as they come (the bound only
// keeps a broken build from hanging). As "kind@host", e.g. "published@host-b".
std::vector<std::string> NextEvents(Client& c, size_t want) {
  static const char* kKinds[] = {"published", "unpublished", "holder_died", "host_gone"};
  std::vector<std::string> got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
    auto ev = c.WaitEvents(1000);
    if (!ev.ok()) break;
    for (const NameEvent& e : ev->events)
      got.push_back(std::string(kKinds[static_cast<int>(e.kind) % 4]) + "@" + e.host + ":" + e.name);
  }
  return got;
}

// A name published for the cluster on host b is found from host a: at once,
// or by a lookup that waits for it; it goes when it is unpublished, when b's
// broker is SIGKILLed (within the lease's TTL) and comes back with a larger
// generation when b's replacement publishes it again; a take-over keeps it.
TEST(Cluster, ANamePublishedForTheClusterIsFoundFromEveryHost) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess a(ClusterArgs(etcd, "host-a")), b(ClusterArgs(etcd, "host-b", "t", "2"));
  auto ca = Client::Connect({a.socket(), "reader"});
  auto cb = Client::Connect({b.socket(), "publisher"});
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_TRUE(WaitFor([&] { return HostIn(Hosts(a), "host-b") != nullptr; }));
  // Subscribers on a: one to the cluster's events under models/, one to this host's only.
  auto cluster_events = Client::Connect({a.socket(), "cluster-events"});
  auto local_events = Client::Connect({a.socket(), "local-events"});
  ASSERT_TRUE(cluster_events.ok() && local_events.ok());
  ASSERT_TRUE(cluster_events->SubscribeCluster("models/").ok());
  ASSERT_TRUE(local_events->Subscribe("models/").ok());
  EXPECT_EQ(ca->LookupCluster("models/w", 0).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(ca->LookupCluster("models/w", 100).status().code(), ErrorCode::kTimeout);

  // A lookup on a that waits, answered when b's record lists the name.
  Result<ClusterNameInfo> waited = Status(ErrorCode::kInternal, "not run");
  std::thread looker([&] { waited = ca->LookupCluster("models/w", 60000); });
  AllocationProp prop;
  auto h = cb->MallocPhysical(1 << 20, prop);
  Status published = h.ok() ? cb->Publish("models/w", *h, kPublishCluster | kPublishReadOnly, "dtype=bf16")
                            : h.status();
  looker.join();  // before any ASSERT: a joinable thread must not outlive the test body
  ASSERT_TRUE(published.ok()) << published.ToString();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->host, "host-b");
  EXPECT_EQ(waited->generation, b.Stat("cluster_generation"));
  EXPECT_EQ(waited->size, size_t{1} << 20);
  EXPECT_TRUE(waited->read_only);
  EXPECT_EQ(waited->metadata, "dtype=bf16");
  EXPECT_EQ(NextEvents(*cluster_events, 1), std::vector<std::string>{"published@host-b:models/w"});
  // On its own host, from the broker's own table.
  auto here = cb->LookupCluster("models/w");
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_EQ(here->host, "host-b");
  // A name published without the flag stays this host's.
  ASSERT_TRUE(cb->Publish("local/only", *h).ok());
  EXPECT_EQ(ca->LookupCluster("local/only").status().code(), ErrorCode::kNotFound);
  // As an operator reads it on host a.
  json names;
  ASSERT_TRUE(WaitFor([&] {
    names = ClusterNames(a);
    return names.is_array() && names.size() == 1;
  })) << names.dump();
  EXPECT_EQ(names[0]["name"], "models/w");
  EXPECT_EQ(names[0]["host"], "host-b");
  EXPECT_EQ(names[0]["metadata_bytes"], 10);

  // Unpublished: gone from every host.
  ASSERT_TRUE(cb->Unpublish("models/w").ok());
  ASSERT_TRUE(WaitFor([&] { return ca->LookupCluster("models/w").status().code() == ErrorCode::kNotFound; }));
  EXPECT_EQ(NextEvents(*cluster_events, 1), std::vector<std::string>{"unpublished@host-b:models/w"});

  // A take-over keeps it listed, under the new broker's generation.
  ASSERT_TRUE(cb->Publish("models/w", *h, kPublishCluster).ok());
  ASSERT_TRUE(WaitFor([&] { return ca->LookupCluster("models/w").ok(); }));
  const uint64_t before = ca->LookupCluster("models/w")->generation;
  EXPECT_EQ(NextEvents(*cluster_events, 1), std::vector<std::string>{"published@host-b:models/w"});
  ASSERT_EQ(b.TakeOver(), 0);
  ASSERT_TRUE(WaitFor([&] {
    auto at = ca->LookupCluster("models/w");
    return at.ok() && at->generation > before;
  }));
  // The old broker's record went (its lease revoked), the new one's came.
  EXPECT_EQ(NextEvents(*cluster_events, 2),
            (std::vector<std::string>{"host_gone@host-b:models/w", "published@host-b:models/w"}));

  // b's broker SIGKILLed: its record, and the name with it, vanish within the TTL.
  b.Kill();
  ASSERT_TRUE(WaitFor([&] { return ca->LookupCluster("models/w").status().code() == ErrorCode::kNotFound; }));
  names = ClusterNames(a);
  EXPECT_TRUE(names.is_array() && names.empty()) << names.dump();
  EXPECT_EQ(NextEvents(*cluster_events, 1), std::vector<std::string>{"host_gone@host-b:models/w"});
  // Other hosts' events reach cluster subscriptions only.
  auto none = local_events->WaitEvents(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->events.empty());
}

// The membroker-share program, run as an operator runs it: ready once it
// prints its "serving as" line (read with a bound); SIGTERMed at the end.
class ShareProcess {
 public:
  ShareProcess(const std::string& socket, const std::string& secret_file) {
    int out[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<std::string> args{BinaryPath("membroker-share"), "--socket", socket, "--listen", "127.0.0.1:0",
                                  "--secret-file", secret_file};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    from_ = out[0];
  }
  ~ShareProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      // Bounded: a share that does not end within 60 s is killed (and the test fails).
      if (!WaitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; })) {
        ADD_FAILURE() << "membroker-share did not end on SIGTERM";
        Kill();
      } else {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "membroker-share ended with " << status;
      }
    }
    ::close(from_);
  }
  // Its first line of output, once it serves ("" when none came within 60 s).
  std::string Ready() {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(from_, buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    return line;
  }
  void Kill() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int from_ = -1;
};

unsigned char Pattern(size_t i, unsigned seed) { return static_cast<unsigned char>(i * 131 + (i >> 12) * 7 + seed); }

// A name published read-only for the cluster on host b is fetched into host
// a's memory in one call, through b's membroker-share, every byte checked:
// its bytes arrive whole; a name that is not read-only is refused; bytes
// written after the share took their checksum are DATA_LOSS, never a quiet
// copy; two names of one allocation are both served, and one unpublished
// leaves the other; a replaced name's new bytes arrive; a share SIGKILLed and
// started again serves again; an unpublished name is NOT_FOUND.
TEST(Cluster, ANameIsFetchedFromAnotherHostWithEveryByteChecked) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess a(ClusterArgs(etcd, "host-a")), b(ClusterArgs(etcd, "host-b"));
  const std::string secret = SecretFile(b.dir(), "share-secret");
  auto cb = Client::Connect({b.socket(), "publisher"});
  auto ca = Client::Connect({a.socket(), "fetcher"});
  ASSERT_TRUE(ca.ok() && cb.ok());
  EXPECT_EQ(ca->cluster_host(), "host-a");
  TransferEngine engine(*ca);
  Status init = engine.Initialize("fetcher-0", {{"secret_file", secret}});
  MB_UCX_OR_SKIP(init);
  ASSERT_TRUE(init.ok()) << init.ToString();

  constexpr size_t kSize = 3 << 20;
  auto h = cb->MallocPhysical(kSize);
  ASSERT_TRUE(h.ok());
  auto src = MapWhole(*cb, *h);
  ASSERT_TRUE(src.ok());
  for (size_t i = 0; i < kSize; ++i) src->as<unsigned char>()[i] = Pattern(i, 1);
  ASSERT_TRUE(cb->Publish("models/w", *h, kPublishCluster | kPublishReadOnly, "dtype=bf16").ok());
  ASSERT_TRUE(cb->Publish("models/rw", *h, kPublishCluster).ok());

  auto share = std::make_unique<ShareProcess>(b.socket(), secret);
  const std::string ready = share->Ready();
  ASSERT_NE(ready.find("serving as membroker-share@host-b on 127.0.0.1:"), std::string::npos) << ready;

  // Fetched whole: new memory of host a, its bytes those published on b.
  auto check = [&](const FetchedObject& f, unsigned seed) {
    auto m = MapWhole(*ca, f.handle);
    if (!m.ok()) return ::testing::AssertionFailure() << m.status().ToString();
    for (size_t i = 0; i < kSize; ++i)
      if (m->as<unsigned char>()[i] != Pattern(i, seed)) return ::testing::AssertionFailure() << "byte " << i;
    return ::testing::AssertionSuccess();
  };
  const uint64_t live = a.Stat("allocations_live");  // the engine's own
  auto f = FetchNamed(*ca, engine, "models/w", 60000);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->copied);
  EXPECT_EQ(f->host, "host-b");
  EXPECT_EQ(f->size, kSize);
  EXPECT_EQ(f->metadata, "dtype=bf16");
  EXPECT_EQ(f->generation, b.Stat("cluster_generation"));
  EXPECT_EQ(ca->LookupCluster("models/w")->allocation, h->id());
  EXPECT_EQ(a.Stat("allocations_live"), live + 1);  // the copy, and nothing else
  EXPECT_TRUE(check(*f, 1));
  ASSERT_TRUE(ca->FreePhysical(f->handle).ok());

  // A second name of the same allocation: served from the same mapping; its
  // unpublish leaves the first name served.
  ASSERT_TRUE(cb->Publish("models/alias", *h, kPublishCluster | kPublishReadOnly).ok());
  auto alias = FetchNamed(*ca, engine, "models/alias", 60000);
  ASSERT_TRUE(alias.ok()) << alias.status().ToString();
  EXPECT_TRUE(check(*alias, 1));
  ASSERT_TRUE(ca->FreePhysical(alias->handle).ok());
  ASSERT_TRUE(cb->Unpublish("models/alias").ok());
  ASSERT_TRUE(WaitFor([&] { return ca->LookupCluster("models/alias").status().code() == ErrorCode::kNotFound; }));
  auto again = FetchNamed(*ca, engine, "models/w", 60000);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(check(*again, 1));
  ASSERT_TRUE(ca->FreePhysical(again->handle).ok());

  // Not read-only: its bytes could change under the copy.
  EXPECT_EQ(FetchNamed(*ca, engine, "models/rw", 1000).status().code(), ErrorCode::kUnsupported);
  // On its own host: the object itself, no copy.
  auto cb2 = Client::Connect({b.socket(), "local-fetcher"});
  ASSERT_TRUE(cb2.ok());
  TransferEngine unused(*cb2);
  auto here = FetchNamed(*cb2, unused, "models/w", 0);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_FALSE(here->copied);
  EXPECT_EQ(here->handle.id(), h->id());

  // Written after the share took its checksum (the publisher kept a writable
  // mapping): the copy is refused, not handed over.
  src->as<unsigned char>()[kSize / 2] ^= 0x40;
  EXPECT_EQ(FetchNamed(*ca, engine, "models/w", 30000).status().code(), ErrorCode::kDataLoss);
  EXPECT_EQ(a.WaitForStat("allocations_live", live), live);  // the refused copy freed

  // Replaced by new bytes: those arrive (the share serves the new object).
  auto h2 = cb->MallocPhysical(kSize);
  ASSERT_TRUE(h2.ok());
  {
    auto m2 = MapWhole(*cb, *h2);
    ASSERT_TRUE(m2.ok());
    for (size_t i = 0; i < kSize; ++i) m2->as<unsigned char>()[i] = Pattern(i, 2);
  }
  ASSERT_TRUE(cb->Publish("models/w", *h2, kPublishCluster | kPublishReadOnly | kPublishReplace).ok());
  // Once host a's view names the new allocation, a fetch brings its bytes,
  // never the replaced object's (the card names its allocation; a card the
  // share has not replaced yet is waited out).
  ASSERT_TRUE(WaitFor([&] {
    auto at = ca->LookupCluster("models/w");
    return at.ok() && at->allocation == h2->id();
  }));
  auto f2 = FetchNamed(*ca, engine, "models/w", 30000);
  ASSERT_TRUE(f2.ok()) << f2.status().ToString();
  EXPECT_TRUE(check(*f2, 2));

  // The share SIGKILLed and started again: the next fetch reconnects.
  share->Kill();
  share = std::make_unique<ShareProcess>(b.socket(), secret);
  ASSERT_NE(share->Ready().find("serving as"), std::string::npos);
  auto f3 = FetchNamed(*ca, engine, "models/w", 60000);
  ASSERT_TRUE(f3.ok()) << f3.status().ToString();
  EXPECT_TRUE(check(*f3, 2));

  // Unpublished: gone from every host.
  ASSERT_TRUE(cb->Unpublish("models/w").ok());
  ASSERT_TRUE(WaitFor([&] { return ca->LookupCluster("models/w").status().code() == ErrorCode::kNotFound; }));
  EXPECT_EQ(FetchNamed(*ca, engine, "models/w", 0).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine.Disconnect(NameShare::EngineName("host-b"), 5000).code(), ErrorCode::kOk);
}

// Broker memory mapped whole through the C API, freed in order at the end.
struct CMemory {
  mb_client* client;
  mb_handle* handle = nullptr;
  mb_reservation* range = nullptr;
  mb_mapping* map = nullptr;
  CMemory(mb_client* c, mb_handle* h) : client(c), handle(h) {
    if (handle != nullptr && mb_reserve(c, mb_handle_size(h), 0, &range) == MB_OK)
      (void)mb_map(c, range, 0, 0, 0, h, &map);
  }
  ~CMemory() {
    if (map != nullptr) mb_unmap(map);
    if (range != nullptr) mb_reservation_release(range);
    if (handle != nullptr) mb_handle_free(handle);
  }
  unsigned char* data() const { return static_cast<unsigned char*>(mb_mapping_data(map)); }
};

// The same from C (membroker/membroker.h), called as a C program calls it:
// an engine on host b found from host a by its name alone, over the network
// path; a name published for the cluster on b looked up and fetched on a,
// its bytes checked.
TEST(Cluster, FromCAnEngineAndANameOfAnotherHostAreFoundByName) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess a(ClusterArgs(etcd, "host-a")), b(ClusterArgs(etcd, "host-b"));
  const std::string secret = SecretFile(b.dir(), "c-secret");
  mb_client *ca = nullptr, *cb = nullptr;
  ASSERT_EQ(mb_connect(a.socket().c_str(), "c-a", 0, &ca), MB_OK);
  ASSERT_EQ(mb_connect(b.socket().c_str(), "c-b", 0, &cb), MB_OK);
  const char* keys[] = {"listen_address", "secret_file"};
  const char* values[] = {"127.0.0.1:0", secret.c_str()};
  mb_engine *decode = nullptr, *prefill = nullptr;
  const int made = mb_engine_create_with_options(cb, "c-decode-0", keys, values, 2, &decode);
#ifndef MEMBROKER_TEST_HAVE_NET_MODULE
  if (made == MB_UNSUPPORTED) {
    mb_client_close(ca);
    mb_client_close(cb);
    GTEST_SKIP() << "libmembroker built without UCX";
  }
#endif
  ASSERT_EQ(made, MB_OK) << mb_last_error_message();
  ASSERT_EQ(mb_engine_create_with_options(ca, "c-prefill-0", keys + 1, values + 1, 1, &prefill), MB_OK);
  {
    // An engine of another host, by its name.
    ASSERT_EQ(mb_engine_connect(prefill, "c-decode-0", 60000), MB_OK) << mb_last_error_message();
    char path[16] = "", transports[64] = "";
    ASSERT_EQ(mb_engine_connection_path(prefill, "c-decode-0", path, sizeof path, transports, sizeof transports),
              MB_OK);
    EXPECT_STREQ(path, "ucx");
    mb_handle *there_h = nullptr, *here_h = nullptr;
    ASSERT_EQ(mb_malloc_physical(cb, 4096, MB_NORMAL_ONLY, 0, &there_h), MB_OK);
    ASSERT_EQ(mb_malloc_physical(ca, 4096, MB_NORMAL_ONLY, 0, &here_h), MB_OK);
    CMemory there(cb, there_h), here(ca, here_h);
    ASSERT_TRUE(there.map != nullptr && here.map != nullptr);
    uint64_t there_reg = 0, here_reg = 0;
    ASSERT_EQ(mb_engine_register(decode, reinterpret_cast<uintptr_t>(there.data()), 4096, &there_reg), MB_OK);
    ASSERT_EQ(mb_engine_register(prefill, reinterpret_cast<uintptr_t>(here.data()), 4096, &here_reg), MB_OK);
    std::memset(here.data(), 0x6b, 4096);
    mb_transfer_desc d{reinterpret_cast<uintptr_t>(here.data()), reinterpret_cast<uintptr_t>(there.data()), 4096};
    ASSERT_EQ(mb_engine_transfer_sync(prefill, "c-decode-0", MB_WRITE, &d, 1, 30000), MB_OK)
        << mb_last_error_message();
    EXPECT_EQ(std::memcmp(there.data(), here.data(), 4096), 0);
    EXPECT_EQ(mb_engine_disconnect(prefill, "c-decode-0", 5000), MB_OK);
    EXPECT_EQ(mb_engine_deregister(decode, there_reg), MB_OK);
    EXPECT_EQ(mb_engine_deregister(prefill, here_reg), MB_OK);
  }
  {
    // A name of another host, found and fetched.
    constexpr size_t kSize = 1 << 20;
    mb_handle* published = nullptr;
    ASSERT_EQ(mb_malloc_physical(cb, kSize, MB_NORMAL_ONLY, 0, &published), MB_OK);
    CMemory object(cb, published);
    ASSERT_TRUE(object.map != nullptr);
    for (size_t i = 0; i < kSize; ++i) object.data()[i] = Pattern(i, 3);
    ASSERT_EQ(mb_publish(cb, "c/w", published, MB_PUBLISH_CLUSTER | MB_PUBLISH_READ_ONLY), MB_OK);
    ShareProcess share(b.socket(), secret);
    ASSERT_NE(share.Ready().find("serving as"), std::string::npos);
    mb_cluster_name where{};
    ASSERT_EQ(mb_lookup_cluster(ca, "c/w", 60000, &where), MB_OK);
    EXPECT_STREQ(where.host, "host-b");
    EXPECT_EQ(where.size, kSize);
    mb_handle* fetched = nullptr;
    mb_cluster_name from{};
    ASSERT_EQ(mb_fetch_named(ca, prefill, "c/w", 60000, &fetched, &from), MB_OK) << mb_last_error_message();
    EXPECT_STREQ(from.host, "host-b");
    CMemory copy(ca, fetched);
    ASSERT_TRUE(copy.map != nullptr);
    size_t wrong = 0;
    for (size_t i = 0; i < kSize; ++i) wrong += copy.data()[i] != Pattern(i, 3);
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(mb_engine_disconnect(prefill, NameShare::EngineName("host-b").c_str(), 5000), MB_OK);
  }
  mb_engine_destroy(prefill);
  mb_engine_destroy(decode);
  mb_client_close(ca);
  mb_client_close(cb);
}

// Without --cluster, the flag and the lookup say so.
TEST(Cluster, ANameForTheClusterNeedsACluster) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "no-cluster"});
  ASSERT_TRUE(c.ok());
  AllocationProp prop;
  auto h = c->MallocPhysical(4096, prop);
  ASSERT_TRUE(h.ok());
  Status st = c->Publish("models/w", *h, kPublishCluster);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("--cluster"), std::string::npos) << st.ToString();
  EXPECT_EQ(c->LookupCluster("models/w").status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(c->SubscribeCluster("models/").code(), ErrorCode::kUnsupported);
  EXPECT_EQ(b.Stat("named_objects"), 0u);
}

TEST(Cluster, ABrokerRestartedBeforeItsLeaseEndsTakesBackItsNameAtOnce) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  // A TTL of a minute: a registration within it proves the stale record was
  // recognised (same boot and pid namespace, its pid gone), not waited out.
  std::vector<std::string> args = ClusterArgs(etcd, "host-r");
  args.back() = "60";
  BrokerProcess b(args);
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1; })) << b.Admin("stats");
  const uint64_t first = b.Stat("cluster_generation");
  b.Kill();
  b.Restart();
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1; }, 30)) << b.Admin("stats");
  EXPECT_GT(b.Stat("cluster_generation"), first);
  // Its own table follows from the watch: the old record's deletion and the new one arrive as events.
  json hosts;
  ASSERT_TRUE(WaitFor([&] {
    const json* h = HostIn(hosts = Hosts(b), "host-r");
    return h != nullptr && (*h)["pid"].get<int>() == b.pid();
  })) << hosts.dump();
}

// A take-over: the old broker revokes its lease as it hands over; the new one
// registers the host again, its own pid under a larger generation.
TEST(Cluster, ATakeOverRegistersTheHostAgainUnderTheNewBroker) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess watcher(ClusterArgs(etcd, "host-w"));
  BrokerProcess b(ClusterArgs(etcd, "host-t"));
  json hosts;
  ASSERT_TRUE(WaitFor([&] { return HostIn(hosts = Hosts(watcher), "host-t") != nullptr; })) << hosts.dump();
  const uint64_t before = (*HostIn(hosts, "host-t"))["generation"].get<uint64_t>();
  const pid_t old_pid = b.pid();
  EXPECT_EQ(b.TakeOver(), 0);
  ASSERT_NE(b.pid(), old_pid);
  ASSERT_TRUE(WaitFor([&] {
    const json* h = HostIn(hosts = Hosts(watcher), "host-t");
    return h != nullptr && (*h)["pid"].get<int>() == b.pid();
  })) << hosts.dump();
  EXPECT_GT((*HostIn(hosts, "host-t"))["generation"].get<uint64_t>(), before);
  EXPECT_EQ(b.Stat("cluster_up"), 1u);
}

TEST(Cluster, AHostNameHeldByALiveBrokerIsNotTaken) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess first(ClusterArgs(etcd, "same"));
  ASSERT_TRUE(WaitFor([&] { return first.Stat("cluster_up") == 1; })) << first.Admin("stats");
  BrokerProcess second(ClusterArgs(etcd, "same"));
  ASSERT_TRUE(WaitFor([&] { return StatText(second, "cluster") == "waiting"; })) << second.Admin("stats");
  EXPECT_NE(StatText(second, "cluster_error").find("registered by pid " + std::to_string(first.pid())),
            std::string::npos)
      << second.Admin("stats");
  json hosts;
  ASSERT_TRUE(WaitFor([&] {
    const json* h = HostIn(hosts = Hosts(first), "same");
    return h != nullptr && (*h)["pid"].get<int>() == first.pid();
  })) << hosts.dump();
  // The holder stops (its lease revoked): the waiting broker registers.
  EXPECT_EQ(first.Stop(), 0);
  ASSERT_TRUE(WaitFor([&] { return second.Stat("cluster_up") == 1; })) << second.Admin("stats");
  ASSERT_TRUE(WaitFor([&] {
    const json* h = HostIn(hosts = Hosts(second), "same");
    return h != nullptr && (*h)["pid"].get<int>() == second.pid();
  })) << hosts.dump();
}

TEST(Cluster, EtcdOutOfReachNeverStopsLocalWork) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  etcd.Kill();
  // Started while etcd is down: it serves, and says why the cluster is not there.
  BrokerProcess b(ClusterArgs(etcd, "host-u"));
  ASSERT_TRUE(WaitFor([&] { return StatText(b, "cluster") == "unreachable"; })) << b.Admin("stats");
  RunResult hosts = RunProgram({BinaryPath("membrokerctl"), "--admin-socket", b.admin_socket(), "list", "hosts"});
  EXPECT_NE(hosts.exit_code, 0);
  EXPECT_NE(hosts.output.find("NOT_CONNECTED: etcd is out of reach"), std::string::npos) << hosts.output;
  const auto local_work = [&] {
    auto c = Client::Connect({b.socket(), "cluster-test"});
    if (!c.ok()) return false;
    AllocationProp prop;
    auto mem = c->MallocPhysical(1 << 20, prop);
    return mem.ok() && c->FreePhysical(*mem).ok();
  };
  EXPECT_TRUE(local_work());

  etcd.Start();
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1; })) << b.Admin("stats");
  ASSERT_TRUE(WaitFor([&] { return HostIn(Hosts(b), "host-u") != nullptr; }));

  // etcd dies mid-run and comes back with its data: local work goes on throughout.
  etcd.Kill();
  ASSERT_TRUE(WaitFor([&] { return StatText(b, "cluster") == "unreachable"; })) << b.Admin("stats");
  EXPECT_TRUE(local_work());
  EXPECT_EQ(b.Admin("check").find("consistent") != std::string::npos, true);
  etcd.Start();
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1 && HostIn(Hosts(b), "host-u") != nullptr; }))
      << b.Admin("stats");
  EXPECT_TRUE(local_work());
}

TEST(Cluster, HostileRecordsInEtcdAreIgnored) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  BrokerProcess b(ClusterArgs(etcd, "host-h"));
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1; })) << b.Admin("stats");
  const std::string boot = "0123abcd-0123-4567-89ab-0123456789ab";
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"garbage", "not json at all"},
      {"deep", std::string(60000, '[')},
      {"wrong-name", R"({"v":1,"host":"other","pid":1,"boot_id":")" + boot + R"(","pid_ns":1,"started":1,"engines":[]})"},
      {"bad-address", R"({"v":1,"host":"bad-address","pid":1,"boot_id":")" + boot +
                          R"(","pid_ns":1,"started":1,"engines":[{"name":"e","address":"evil\n:1"}]})"},
      {"esc\x1b[2J", R"({"v":1})"},
      {"huge", std::string(70000, ' ') + "{}"},
  };
  for (const auto& [name, value] : hostile)
    ASSERT_EQ(etcd.Ctl({"put", "/membroker/t/hosts/" + name, value}).exit_code, 0);
  // One good record from "other software", to see that the broker has read past the bad ones.
  ASSERT_EQ(etcd.Ctl({"put", "/membroker/t/hosts/fine",
                      R"({"v":1,"host":"fine","pid":7,"boot_id":")" + boot +
                          R"(","pid_ns":1,"started":1,"engines":[{"name":"decode-0","address":"10.0.0.2:4000"}]})"})
                .exit_code,
            0);
  json hosts;
  ASSERT_TRUE(WaitFor([&] { return HostIn(hosts = Hosts(b), "fine") != nullptr; })) << hosts.dump();
  EXPECT_EQ(hosts.size(), 2u) << hosts.dump();  // host-h and fine
  EXPECT_EQ((*HostIn(hosts, "fine"))["engines"].get<std::string>(), "decode-0=10.0.0.2:4000");
  EXPECT_EQ(b.Stat("cluster_invalid_records"), hostile.size());
  // A broker started now reads them all at once (the range, not the watch): the same verdict.
  BrokerProcess late(ClusterArgs(etcd, "host-late"));
  ASSERT_TRUE(WaitFor([&] { return HostIn(hosts = Hosts(late), "host-late") != nullptr; })) << hosts.dump();
  EXPECT_EQ(hosts.size(), 3u) << hosts.dump();
  EXPECT_EQ(late.Stat("cluster_invalid_records"), hostile.size());
  EXPECT_NE(b.Admin("check").find("consistent"), std::string::npos);
}

TEST(Cluster, ABrokerAuthenticatesAsAUserThatMayTouchItsNamespaceOnly) {
  SKIP_WITHOUT_ETCD();
  Etcd etcd;
  etcd.EnableAuth("mb-secret-pw");
  char tmpl[] = "/tmp/membroker-auth-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  std::vector<std::string> args = ClusterArgs(etcd, "host-auth");
  args.insert(args.end(), {"--cluster-user", "mb", "--cluster-password-file", PasswordFile(dir, "good", "mb-secret-pw")});
  BrokerProcess b(args, /*log_to_file=*/true);
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1 && HostIn(Hosts(b), "host-auth") != nullptr; }))
      << b.Admin("stats");
  EXPECT_NE(etcd.Ctl({"get", "/membroker/t/hosts/host-auth"}).output.find("host-auth"), std::string::npos);
  const std::string config = b.Admin("config");
  EXPECT_NE(config.find("cluster-user: mb"), std::string::npos) << config;
  EXPECT_NE(config.find("cluster-password-file: " + dir + "/good"), std::string::npos) << config;

  // A wrong password: refused by etcd, said in the stats; the broker serves on.
  std::vector<std::string> wrong = ClusterArgs(etcd, "host-wrong");
  wrong.insert(wrong.end(), {"--cluster-user", "mb", "--cluster-password-file", PasswordFile(dir, "bad", "not-it")});
  BrokerProcess w(wrong, /*log_to_file=*/true);
  ASSERT_TRUE(WaitFor([&] { return StatText(w, "cluster_error").find("authentication failed") != std::string::npos; }))
      << w.Admin("stats");
  EXPECT_EQ(w.Stat("cluster_up"), 0u);
  EXPECT_EQ(w.Stat("clients_connected"), 0u);  // it answers
  // A namespace the user may not touch: refused, and said.
  std::vector<std::string> other = ClusterArgs(etcd, "host-other", "elsewhere");
  other.insert(other.end(), {"--cluster-user", "mb", "--cluster-password-file", PasswordFile(dir, "good2", "mb-secret-pw")});
  BrokerProcess o(other, /*log_to_file=*/true);
  ASSERT_TRUE(WaitFor([&] { return StatText(o, "cluster_error").find("permission denied") != std::string::npos; }))
      << o.Admin("stats");
  // No password in a log line or a stat.
  for (const BrokerProcess* p : {&b, &w, &o}) {
    std::ifstream in(p->log_path());
    const std::string log(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(log.find("mb-secret-pw"), std::string::npos);
    EXPECT_EQ(log.find("not-it"), std::string::npos);
    EXPECT_EQ(p->Admin("stats").find("secret"), std::string::npos);
    EXPECT_EQ(p->Admin("config").find("secret"), std::string::npos);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST(Cluster, OverTlsWithClientCertificates) {
  SKIP_WITHOUT_ETCD();
  if (::access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "openssl is not installed (scripts/test installs it)";
  Etcd etcd(/*tls=*/true);
  const std::string d = etcd.dir();
  std::vector<std::string> args = ClusterArgs(etcd, "host-tls");
  args.insert(args.end(), {"--cluster-ca", d + "/ca.crt", "--cluster-cert", d + "/client.crt", "--cluster-key",
                           d + "/client.key"});
  BrokerProcess b(args);
  ASSERT_TRUE(WaitFor([&] { return b.Stat("cluster_up") == 1 && HostIn(Hosts(b), "host-tls") != nullptr; }))
      << b.Admin("stats");
  EXPECT_NE(b.Admin("config").find("cluster: etcds://127.0.0.1:"), std::string::npos);

  // No client certificate: etcd refuses the handshake. The broker says so and serves on.
  std::vector<std::string> no_cert = ClusterArgs(etcd, "host-nocert");
  no_cert.insert(no_cert.end(), {"--cluster-ca", d + "/ca.crt"});
  BrokerProcess n(no_cert);
  ASSERT_TRUE(WaitFor([&] { return StatText(n, "cluster") == "unreachable"; })) << n.Admin("stats");
  EXPECT_NE(StatText(n, "cluster_error").find("etcd at https://127.0.0.1:"), std::string::npos) << n.Admin("stats");
  // etcd's certificate from a CA this broker does not trust: refused on our side.
  std::vector<std::string> wrong_ca = ClusterArgs(etcd, "host-wrongca");
  wrong_ca.insert(wrong_ca.end(), {"--cluster-ca", d + "/other-ca.crt", "--cluster-cert", d + "/client.crt",
                                   "--cluster-key", d + "/client.key"});
  BrokerProcess w(wrong_ca);
  ASSERT_TRUE(WaitFor([&] { return StatText(w, "cluster") == "unreachable"; })) << w.Admin("stats");
  EXPECT_NE(StatText(w, "cluster_error").find("certificate"), std::string::npos) << w.Admin("stats");
  json hosts = Hosts(b);
  EXPECT_EQ(hosts.size(), 1u) << hosts.dump();  // neither got in

  // A key file others may read is refused at start; TLS settings without etcds:// too.
  ASSERT_EQ(::chmod((d + "/client.key").c_str(), 0644), 0);
  std::vector<std::string> loose = args;
  loose.insert(loose.begin(), {"--socket", d + "/loose.sock"});
  EXPECT_NE(RunBrokerExpectingExit(loose).output.find("--cluster-key " + d + "/client.key is readable by others"),
            std::string::npos);
  EXPECT_NE(RunBrokerExpectingExit({"--socket", d + "/plain.sock", "--cluster", "etcd://127.0.0.1:1", "--cluster-ca",
                                    d + "/ca.crt"})
                .output.find("need an etcds:// cluster"),
            std::string::npos);
}

TEST(Cluster, BadSettingsAreRefusedAtStart) {
  EXPECT_NE(RunBrokerExpectingExit({"--cluster", "http://127.0.0.1:2379"}).output.find("etcd://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(RunBrokerExpectingExit({"--cluster", "etcd://127.0.0.1:2379", "--host-name", "a b"}).output.find(
                "bad value 'a b' for host-name"),
            std::string::npos);
  char tmpl[] = "/tmp/membroker-pw-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string password = PasswordFile(dir, "pw", "secret");
  ASSERT_EQ(::chmod(password.c_str(), 0644), 0);
  RunResult r = RunBrokerExpectingExit({"--socket", dir + "/b.sock", "--cluster", "etcd://127.0.0.1:1",
                                        "--cluster-user", "u", "--cluster-password-file", password});
  EXPECT_NE(r.output.find("readable by others than its owner"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("secret"), std::string::npos);
  // Refused before the broker made anything: no socket, no state file.
  EXPECT_EQ(RunProgram({"/bin/ls", "-A", dir}).output, "pw\n");
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace membroker::testing
