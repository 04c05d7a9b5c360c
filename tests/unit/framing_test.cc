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
#include "membroker/ipc/memfd.h"

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
  auto mem = CreatePhysicalMemory("t", 4096, PagePolicy::kNormalOnly);
  ASSERT_TRUE(mem.ok());
  std::vector<uint8_t> bytes{1, 2, 3};
  int fd = mem->fd.get();
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

TEST(Memfd, SealedAgainstShrinkAndGrowAndRounded) {
  auto mem = CreatePhysicalMemory("t", 5000, PagePolicy::kNormalOnly);
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(mem->size, 8192u);
  EXPECT_EQ(mem->page_size, 4096u);
  EXPECT_NE(::ftruncate(mem->fd.get(), 4096), 0);
  EXPECT_NE(::ftruncate(mem->fd.get(), 1 << 20), 0);
  EXPECT_EQ(CreatePhysicalMemory("t", 0, PagePolicy::kNormalOnly).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(CreatePhysicalMemory("t", kMaxAllocationBytes + 1, PagePolicy::kNormalOnly).code(),
            ErrorCode::kParamInvalid);
}

TEST(Memfd, ReadOnlyReopenCannotBeMappedWritable) {
  auto mem = CreatePhysicalMemory("t", 4096, PagePolicy::kNormalOnly);
  ASSERT_TRUE(mem.ok());
  auto ro = ReopenReadOnly(mem->fd.get());
  ASSERT_TRUE(ro.ok());
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro->get(), 0);
  EXPECT_EQ(p, MAP_FAILED);
  void* r = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, ro->get(), 0);
  EXPECT_NE(r, MAP_FAILED);
  ::munmap(r, 4096);
}

TEST(Token, PrintableAndDistinct) {
  auto a = RandomToken(), b = RandomToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
}

// With getrandom refused by the kernel (a seccomp filter in a child process),
// a token is an error naming the call, not a spin.
TEST(Token, AGetrandomFailureIsAnError) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(11);
    auto t = RandomToken();
    if (t.ok()) ::_exit(1);
    if (t.status().message().find("getrandom") == std::string::npos) ::_exit(2);
    if (t.code() != ErrorCode::kPermissionDenied) ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace membroker::ipc
