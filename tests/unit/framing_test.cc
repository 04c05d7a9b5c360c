// Framing over a real SOCK_SEQPACKET socketpair: fds travel, truncation is a
// protocol error and leaks nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <cstddef>

#include <gtest/gtest.h>

#include "membroker/ipc/framing.h"

namespace membroker::ipc {
namespace {

struct Pair {
  UniqueFd a, b;
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
};

int OpenFdCount() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd)
    if (::fcntl(fd, F_GETFD) != -1) ++n;
  return n;
}

TEST(Framing, BytesAndFdsArriveTogether) {
  Pair p;
  UniqueFd mem(::memfd_create("t", MFD_CLOEXEC));  // an fd whose size tells it apart
  ASSERT_TRUE(mem.valid());
  ASSERT_EQ(::ftruncate(mem.get(), 4096), 0);
  std::vector<uint8_t> bytes{1, 2, 3};
  int fd = mem.get();
  ASSERT_TRUE(SendFrame(p.a.get(), bytes, std::span<const int>(&fd, 1)).ok());
  Frame f;
  ASSERT_TRUE(RecvFrame(p.b.get(), &f).ok());
  EXPECT_EQ(f.bytes, bytes);
  ASSERT_EQ(f.fds.size(), 1u);
  EXPECT_EQ(::fcntl(f.fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(::lseek(f.fds[0].get(), 0, SEEK_END), 4096);
}

TEST(Framing, OversizedFrameIsAProtocolErrorForTheReceiver) {
  Pair p;
  std::vector<uint8_t> big(kMaxFrameBytes + 100, 7);
  ASSERT_EQ(::send(p.a.get(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  Frame f;
  EXPECT_EQ(RecvFrame(p.b.get(), &f).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(SendFrame(p.a.get(), big, {}).code(), ErrorCode::kParamInvalid);
}

TEST(Framing, TooManyFdsAreClosedNotLeaked) {
  Pair p;
  int before = OpenFdCount();
  {
    std::vector<UniqueFd> owned;
    std::vector<int> raw;
    for (size_t i = 0; i < kMaxFdsPerFrame + 4; ++i) {
      owned.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      raw.push_back(owned.back().get());
    }
    // Bypass SendFrame's cap the way a hostile peer would.
    char byte = 0;
    iovec iov{&byte, 1};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * raw.size()));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * raw.size());
    std::memcpy(CMSG_DATA(c), raw.data(), sizeof(int) * raw.size());
    ASSERT_EQ(::sendmsg(p.a.get(), &msg, 0), 1);
  }
  Frame f;
  EXPECT_EQ(RecvFrame(p.b.get(), &f).code(), ErrorCode::kProtocolError);
  EXPECT_TRUE(f.fds.empty());
  EXPECT_EQ(OpenFdCount(), before);
}

// A frame whose control data holds more than SCM_RIGHTS (here the kernel adds
// SCM_CREDENTIALS, since the receiver asked for them) is refused, as
// "unexpected control message" or, when both do not fit the control buffer,
// as truncated control data; the fds that came are closed once, none handed
// out, none leaked.
TEST(Framing, UnexpectedControlMessageClosesItsFdsOnce) {
  Pair p;
  int on = 1;
  ASSERT_EQ(::setsockopt(p.b.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
  int before = OpenFdCount();
  {
    UniqueFd x(::open("/dev/null", O_RDONLY | O_CLOEXEC)), y(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    int raw[] = {x.get(), y.get()};
    std::vector<uint8_t> bytes{1, 2, 3};
    ASSERT_TRUE(SendFrame(p.a.get(), bytes, raw).ok());
  }
  Frame f;
  Status st = RecvFrame(p.b.get(), &f);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_TRUE(f.fds.empty());
  EXPECT_EQ(OpenFdCount(), before);
  // Credentials alone: the unexpected control message itself.
  std::vector<uint8_t> bytes{4};
  ASSERT_TRUE(SendFrame(p.a.get(), bytes, {}).ok());
  st = RecvFrame(p.b.get(), &f);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("unexpected control message"), std::string::npos) << st.message();
  EXPECT_EQ(OpenFdCount(), before);
}

TEST(Framing, PeerCloseIsNotConnected) {
  Pair p;
  p.a.reset();
  Frame f;
  EXPECT_EQ(RecvFrame(p.b.get(), &f).code(), ErrorCode::kNotConnected);
}

TEST(Framing, NonBlockingEmptyReadReportsWouldBlock) {
  Pair p;
  ::fcntl(p.b.get(), F_SETFL, O_NONBLOCK);
  Frame f;
  bool wb = false;
  EXPECT_FALSE(RecvFrame(p.b.get(), &f, &wb).ok());
  EXPECT_TRUE(wb);
}

TEST(Framing, PeerCredIsTheKernelsView) {
  Pair p;
  auto cred = GetPeerCred(p.a.get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::getuid());
}

}  // namespace
}  // namespace membroker::ipc
