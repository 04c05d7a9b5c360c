// The broker's memfds and tokens: sealed and rounded, read-only reopens that
// cannot be mapped writable, tokens that are printable, distinct, and an
// error (never a spin) when getrandom fails.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/memfd.h>
#include <linux/seccomp.h>

#include <cstddef>
#include <cstring>

#include <gtest/gtest.h>

#include "memory/memfd.h"
#include "memory/token.h"

namespace membroker::broker {
namespace {

using ipc::kMaxAllocationBytes;

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

// A kernel without huge pages of a size answers memfd_create(MFD_HUGETLB) with
// ENODEV (a seccomp filter plays that kernel in a child process): the huge-only
// policies are UNSUPPORTED naming why, HUGE_FIRST falls back to normal pages.
TEST(Memfd, AHugePageSizeTheKernelLacksIsUnsupported) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),  // flags, low half
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MFD_HUGETLB, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENODEV & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(11);
    for (PagePolicy p : {PagePolicy::kHugeOnly, PagePolicy::kHuge1GOnly}) {
      auto mem = CreatePhysicalMemory("t", 1 << 30, p);
      if (mem.code() != ErrorCode::kUnsupported) ::_exit(1);
      if (mem.status().message().find("no huge pages of this size") == std::string::npos) ::_exit(2);
    }
    auto fallback = CreatePhysicalMemory("t", 4 << 20, PagePolicy::kHugeFirst);
    if (!fallback.ok() || !fallback->fell_back || fallback->page_size != 4096) ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace membroker::broker
