// What anyone who can reach a listening engine's port can do to it, from raw
// TCP: garbage, silence, half-closes, a flood of silent connections, a
// recorded handshake replayed. The engine must live, close and count each
// one, keep serving its legitimate peers, and come back to no connection
// held on its port. Built only with the network module.
#include <arpa/inet.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/transfer_engine.h"
#include "net_engines.h"
#include "transfer/ucx/handshake.h"

namespace membroker::testing {
namespace {

namespace hs = detail::handshake;
using Clock = std::chrono::steady_clock;
constexpr size_t kSize = 1 << 20;
constexpr auto kBound = std::chrono::seconds(60);  // only a broken engine waits this long

int PortOf(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A TCP connection to ip:port (127.0.0.1 by default) from this thread.
ipc::UniqueFd Open(int port, in_addr_t ip = htonl(INADDR_LOOPBACK)) {
  ipc::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = ip;
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// Reads until the peer closes (true) or the bound passes (false).
bool ClosedByPeer(int fd) {
  const auto until = Clock::now() + kBound;
  char buf[4096];
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

// One frame, read whole (bounded).
hs::Frame ReadFrame(int fd) {
  hs::FrameReader r;
  const auto until = Clock::now() + kBound;
  while (Clock::now() < until) {
    auto wanted = r.Wanted();
    if (!wanted.ok()) break;
    if (*wanted == 0) {
      auto f = hs::Decode(r.body());
      if (f.ok()) return *f;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, std::min(*wanted, sizeof(buf)), 0);
    if (n <= 0) break;
    r.Append(buf, static_cast<size_t>(n));
  }
  ADD_FAILURE() << "no whole frame";
  return hs::Refuse{};
}

// The inodes of this process's sockets (/proc/self/fd).
std::set<std::string> OurSockets() {
  std::set<std::string> ours;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(path.c_str(), target, sizeof(target) - 1) <= 0) continue;
    const std::string t(target);
    if (t.rfind("socket:[", 0) == 0) ours.insert(t.substr(8, t.size() - 9));
  }
  ::closedir(d);
  return ours;
}

// This process's IPv4 TCP sockets from /proc/net/tcp: the local address
// (network order), the local port, and whether it listens.
struct TcpSocket {
  in_addr_t ip;
  int port;
  bool listening;
};
std::vector<TcpSocket> OurTcpSockets() {
  const std::set<std::string> ours = OurSockets();
  std::vector<TcpSocket> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, skip, inode;
    in >> slot >> local >> remote >> state;
    for (int i = 0; i < 5; ++i) in >> skip;  // tx:rx tr:when retrnsmt uid timeout
    in >> inode;
    if (!ours.count(inode)) continue;
    // The address prints as the host-order hex of its network-order word.
    out.push_back({static_cast<in_addr_t>(std::stoul(local.substr(0, local.find(':')), nullptr, 16)),
                   std::stoi(local.substr(local.find(':') + 1), nullptr, 16), state == "0A"});
  }
  return out;
}

// Sockets of this process accepted on `port` (not the listening one): the
// listener's side of connections to it.
size_t AcceptedOn(int port) {
  size_t n = 0;
  for (const TcpSocket& s : OurTcpSockets()) n += s.port == port && !s.listening;
  return n;
}

uint64_t Refused(TransferEngine& e) {
  NetworkStats ns;
  EXPECT_TRUE(e.GetNetworkStats(ns).ok());
  return ns.refused;
}

// Waits (bounded) until the engine counted at least `n` refusals.
uint64_t WaitForRefused(TransferEngine& e, uint64_t n) {
  const auto until = Clock::now() + kBound;
  uint64_t got = Refused(e);
  while (got < n && Clock::now() < until) {
    std::this_thread::yield();
    got = Refused(e);
  }
  return got;
}

class ListenerAbuse : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = *Client::Connect({a_.socket(), "listener"});
    cb_ = *Client::Connect({b_.socket(), "connector"});
    secret_ = SecretFile(a_.dir(), "loopback-secret");
  }
  BrokerProcess a_, b_;
  Client ca_, cb_;
  std::string secret_;
};

// This process's stderr into a file while it lives (the engines log their
// refusals there); the brokers, started before, keep the real one.
class StderrCapture {
 public:
  StderrCapture() : path_("/tmp/membroker-stderr-" + std::to_string(::getpid())) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    ipc::UniqueFd file(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (saved_ < 0 || !file.valid() || ::dup2(file.get(), 2) < 0) std::abort();
  }
  ~StderrCapture() { Stop(); }
  // Restores stderr and returns what was written meanwhile.
  std::string Stop() {
    if (saved_ < 0) return text_;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    text_ = ss.str();
    ::unlink(path_.c_str());
    return text_;
  }

 private:
  std::string path_, text_;
  int saved_ = -1;
};

size_t CountLines(const std::string& text, const std::string& containing) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(containing) != std::string::npos;
  return n;
}

TEST_F(ListenerAbuse, RawBytesSilenceAndFloodsAreClosedCountedAndHarmless) {
  StderrCapture log;  // refusals are logged at most 10 lines a minute: checked at the end
  const auto started = Clock::now();
  TransferEngine decode(ca_), prefill(cb_);
  const std::string addr = ListenOnLoopback(decode, "decode", secret_);
  ASSERT_FALSE(addr.empty());
  const int port = PortOf(addr);
  Memory remote = Register(ca_, decode, kSize);
  ASSERT_TRUE(prefill.Initialize("prefill", {{"secret_file", secret_}}).ok());
  Memory local = Register(cb_, prefill, kSize);
  ASSERT_TRUE(prefill.Connect(addr, 5000).ok());
  EXPECT_EQ(AcceptedOn(port), 0u) << "the handshake's socket outlived it";

  // What killed UCX's own listener (17 zero bytes, 3000 of them, a 16-byte
  // header whose length says 2^64-1), a length past the limit, an empty
  // frame, a close at once, a half-close: each closed by the engine.
  std::vector<std::string> garbage = {std::string(17, '\0'), std::string(3000, '\0'),
                                      std::string(8, '\0') + std::string(8, '\xff'), std::string(4, '\xff'),
                                      std::string("\x01\0\0\0\x09", 5)};
  std::vector<ipc::UniqueFd> abusers;
  for (const std::string& g : garbage) {
    abusers.push_back(Open(port));
    SendAll(abusers.back().get(), g);
  }
  abusers.push_back(Open(port));
  ASSERT_EQ(::shutdown(abusers.back().get(), SHUT_WR), 0);
  for (auto& fd : abusers) EXPECT_TRUE(ClosedByPeer(fd.get()));
  Open(port);  // closed at once by us
  const uint64_t refused_garbage = garbage.size() + 2;
  EXPECT_EQ(WaitForRefused(decode, refused_garbage), refused_garbage);

  // 200 silent connections, more than the 64 that may wait: the oldest make
  // room, the rest are closed at the 5 s deadline.
  std::vector<ipc::UniqueFd> silent;
  for (int i = 0; i < 200; ++i) silent.push_back(Open(port));
  // Once the engine took all 200 in (each is either counted or still holds a
  // socket; read in this order, one closed in between is in neither), a
  // legitimate connector still gets in: it only makes room too.
  const auto until = Clock::now() + kBound;
  while (Refused(decode) - refused_garbage + AcceptedOn(port) < 200 && Clock::now() < until) std::this_thread::yield();
  Client cc = *Client::Connect({b_.socket(), "second"});  // one engine per client
  TransferEngine second(cc);
  ASSERT_TRUE(second.Initialize("second", {{"secret_file", secret_}}).ok());
  Memory second_local = Register(cc, second, kSize);
  Status st = second.Connect(addr, 10000);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(second.TransferSync(addr, READ, {{second_local.addr(), remote.addr(), 4096}}, 10000).ok());
  for (auto& fd : silent) EXPECT_TRUE(ClosedByPeer(fd.get()));
  EXPECT_EQ(WaitForRefused(decode, refused_garbage + 200), refused_garbage + 200);

  // UCX's own transports listen too (its TCP transport, for the endpoints the
  // handshake leads to): the same garbage at each of their ports.
  size_t ucx_ports = 0;
  for (const TcpSocket& listener : OurTcpSockets()) {
    if (!listener.listening || listener.port == port) continue;
    ++ucx_ports;
    for (const std::string& g : garbage) {
      ipc::UniqueFd fd = Open(listener.port, listener.ip);
      SendAll(fd.get(), g);
    }
  }
  EXPECT_GT(ucx_ports, 0u) << "UCX's TCP transport listens nowhere?";
  // The engine lives, its first connector still transfers, and no socket is
  // left on its port.
  for (size_t i = 0; i < kSize; ++i) remote.data()[i] = static_cast<char>(i * 3 + 1);
  ASSERT_TRUE(prefill.TransferSync(addr, READ, {{local.addr(), remote.addr(), kSize}}, 10000).ok());
  EXPECT_EQ(std::memcmp(local.data(), remote.data(), kSize), 0);
  EXPECT_EQ(AcceptedOn(port), 0u);
  NetworkStats ns;
  ASSERT_TRUE(decode.GetNetworkStats(ns).ok());
  EXPECT_EQ(ns.accepted, 2u);
  EXPECT_EQ(a_.WaitForStat("engine_network_refused", refused_garbage + 200), refused_garbage + 200);
  // 207 refusals, but at most 10 lines in each minute the test took (a
  // window that ended says how many it left out), and at least one.
  const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(Clock::now() - started).count() + 1;
  const std::string text = log.Stop();
  const size_t lines = CountLines(text, "\"decode\" refused a connection");
  EXPECT_GE(lines, 1u) << text;
  EXPECT_LE(lines, static_cast<size_t>(10 * minutes)) << text;
  EXPECT_GE(CountLines(text, "(no more such lines this minute)"), 1u) << text;
}

TEST_F(ListenerAbuse, TheSecretNeverCrossesTheWireAndARecordedProofDoesNotReplay) {
  TransferEngine decode(ca_), prefill(cb_);
  const std::string addr = ListenOnLoopback(decode, "decode", secret_);
  ASSERT_FALSE(addr.empty());
  const int port = PortOf(addr);
  ASSERT_TRUE(prefill.Initialize("prefill", {{"secret_file", secret_}}).ok());

  // A listener of the test's own: it records what prefill sends.
  ipc::UniqueFd fake(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(at);
  ASSERT_EQ(::bind(fake.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  ASSERT_EQ(::listen(fake.get(), 1), 0);
  ASSERT_EQ(::getsockname(fake.get(), reinterpret_cast<sockaddr*>(&at), &len), 0);
  const std::string fake_addr = "127.0.0.1:" + std::to_string(ntohs(at.sin_port));
  auto connecting = std::async(std::launch::async, [&] { return prefill.Connect(fake_addr, 10000); });
  ipc::UniqueFd conn(::accept4(fake.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn.valid());
  SendAll(conn.get(), hs::Encode(hs::Challenge{hs::kVersion, hs::Random<32>()}));
  hs::Frame proof = ReadFrame(conn.get());
  ASSERT_TRUE(std::holds_alternative<hs::Proof>(proof));
  const std::string recorded = hs::Encode(proof);
  EXPECT_EQ(recorded.find("loopback-secret"), std::string::npos) << "the secret crossed the wire";
  EXPECT_TRUE(std::get<hs::Proof>(proof).has_secret);
  conn.reset();  // prefill sees the connection closed during the handshake
  EXPECT_EQ(connecting.get().code(), ErrorCode::kNotConnected);

  // Replayed to the real engine, it answers another challenge: refused.
  ipc::UniqueFd replay = Open(port);
  ASSERT_TRUE(std::holds_alternative<hs::Challenge>(ReadFrame(replay.get())));
  SendAll(replay.get(), recorded);
  hs::Frame answer = ReadFrame(replay.get());
  ASSERT_TRUE(std::holds_alternative<hs::Refuse>(answer));
  EXPECT_EQ(std::get<hs::Refuse>(answer).code, static_cast<int32_t>(ErrorCode::kPermissionDenied));
  EXPECT_NE(std::get<hs::Refuse>(answer).reason.find("wrong secret (or replayed"), std::string::npos)
      << std::get<hs::Refuse>(answer).reason;
  EXPECT_TRUE(ClosedByPeer(replay.get()));
  EXPECT_EQ(WaitForRefused(decode, 1), 1u);

  // A listener that does not hold the secret cannot pass for one that does.
  auto fooled = std::async(std::launch::async, [&] { return prefill.Connect(fake_addr, 10000); });
  conn = ipc::UniqueFd(::accept4(fake.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn.valid());
  SendAll(conn.get(), hs::Encode(hs::Challenge{hs::kVersion, hs::Random<32>()}));
  ASSERT_TRUE(std::holds_alternative<hs::Proof>(ReadFrame(conn.get())));
  hs::Accept forged;
  forged.token = hs::Random<16>();
  forged.engine = "decode";
  forged.worker_address = "not a worker";
  SendAll(conn.get(), hs::Encode(forged));
  Status st = fooled.get();
  EXPECT_EQ(st.code(), ErrorCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("did not prove it holds the secret"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace membroker::testing
