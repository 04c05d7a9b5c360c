// libFuzzer: arbitrary frames and fd patterns through a real broker's socket,
// decode and dispatch path, in one process. After each input the broker's
// tables must agree (Broker::CheckTables), and once the client disconnects the
// broker must hold and charge nothing (Broker::Idle).
//
// Input: [u8 start][records...]; start bit 0 sends a valid handshake first.
// Record: [u8 flags][u16 length, little endian][length bytes]; flags & 7 fds
// (duplicates of /dev/null) ride along with the frame.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "broker.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

using namespace membroker;

namespace {

broker::Broker* TheBroker(std::string* socket_path) {
  static std::string path;
  static broker::Broker* b = [] {
    // Under $TMPDIR, which scripts/fuzz points at a folder it removes after the
    // run: libFuzzer ends with _Exit, so this process cannot remove its own.
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/membroker-fuzz.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    const std::string dir = tmpl;
    path = dir + "/broker.sock";
    broker::Options o;
    o.socket_path = path;
    o.admin_socket_path = dir + "/admin.sock";
    o.max_bytes = 64 << 20;
    o.inline_alloc_bytes = o.max_bytes;  // no worker threads: deterministic
    o.background_delay_ms = 0;           // and no timers
    o.log_level = 0;                     // errors only: a log line per input would dominate
    auto r = broker::Broker::Create(o);
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz: cannot start broker: %s\n", r.status().ToString().c_str());
      std::abort();
    }
    return r->release();
  }();
  *socket_path = path;
  return b;
}

void Drain(int fd) {
  ipc::Frame f;
  bool would_block = false;
  while (ipc::RecvFrame(fd, &f, &would_block).ok()) {
  }
}

void SendAndServe(broker::Broker* b, int fd, const uint8_t* bytes, size_t n, int nfds) {
  static int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<int> fds(nfds, devnull);
  char empty = 0;
  iovec iov{n ? const_cast<uint8_t*>(bytes) : reinterpret_cast<uint8_t*>(&empty), n};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 8));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * nfds);
  }
  for (int tries = 0; tries < 4; ++tries) {
    if (::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0 || errno != EAGAIN) break;
    b->RunOnce();
    Drain(fd);
  }
  b->RunOnce();
  Drain(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path;
  broker::Broker* b = TheBroker(&path);
  auto sock = ipc::ConnectSeqpacket(path);
  if (!sock.ok()) std::abort();
  int fd = sock->get();
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  b->RunOnce();  // accept
  size_t pos = 0;
  if (size > 0) {
    if (data[0] & 1) {
      auto hello = ipc::Encode({ipc::kProtocolVersion, 1, 0, ipc::HelloRequest{"fuzz"}});
      SendAndServe(b, fd, hello.data(), hello.size(), 0);
    }
    pos = 1;
  }
  while (pos + 3 <= size) {
    int nfds = data[pos] & 7;
    size_t len = data[pos + 1] | (static_cast<size_t>(data[pos + 2]) << 8);
    pos += 3;
    if (len > size - pos) len = size - pos;
    SendAndServe(b, fd, data + pos, len, nfds);
    pos += len;
  }
  // Mid-session, with whatever the input made: the tables must agree.
  if (Status st = b->CheckTables(); !st.ok()) {
    std::fprintf(stderr, "fuzz: %s\n", st.message().c_str());
    std::abort();
  }
  sock->reset();
  for (int i = 0; i < 3 && b->live_sessions() > 0; ++i) b->RunOnce();
  b->RemoveOwnerless();  // persistent names and KV stores outlive their creator by design
  if (Status st = b->CheckTables(); !st.ok()) {
    std::fprintf(stderr, "fuzz: after disconnect: %s\n", st.message().c_str());
    std::abort();
  }
  if (!b->Idle()) {
    std::fprintf(stderr, "fuzz: broker not idle after disconnect: %zu sessions, %zu allocations\n%s",
                 b->live_sessions(), b->live_allocations(), b->AdminCommand("stats").c_str());
    std::abort();
  }
  return 0;
}
