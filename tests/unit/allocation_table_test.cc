// The broker's bookkeeping rules: holders, tokens, import permissions, ledgers.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "memory/allocation_table.h"
#include "memory/ledger.h"

namespace membroker::broker {
namespace {

PhysicalMemory Mem(uint64_t size = 4096) {
  auto m = CreatePhysicalMemory("t", size, ipc::PagePolicy::kNormalOnly);
  EXPECT_TRUE(m.ok());
  return std::move(*m);
}

TEST(AllocationTable, LivesWhileAnyHolderRemains) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(8192), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  EXPECT_EQ(t.counters().bytes_live, 8192u);
  t.AddHolder(id);
  EXPECT_FALSE(t.DropHolder(id).has_value());  // creator left, importer still holds
  ASSERT_NE(t.Find(id), nullptr);
  auto gone = t.DropHolder(id);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->size, 8192u);
  EXPECT_EQ(t.Find(id), nullptr);
  EXPECT_EQ(t.counters().bytes_live, 0u);
  EXPECT_EQ(t.counters().allocations_freed, 1u);
  EXPECT_FALSE(t.DropHolder(id).has_value());  // double drop is harmless
}

TEST(AllocationTable, TokensDieWithTheirAllocation) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, ipc::kExportNoPidCheck);
  ASSERT_TRUE(tok.ok());
  EXPECT_TRUE(t.CheckImport(*tok, {2, 50, 1000}).ok());
  t.DropHolder(id);
  EXPECT_EQ(t.CheckImport(*tok, {2, 50, 1000}).code(), ErrorCode::kNotFound);
  EXPECT_EQ(t.export_count(), 0u);
}

TEST(AllocationTable, PidAllowListIsEnforced) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, 0);
  ASSERT_TRUE(tok.ok());
  pid_t me = ::getpid(), parent = ::getppid();
  EXPECT_EQ(t.CheckImport(*tok, {2, me, 1000}).code(), ErrorCode::kNotFound);  // no pids yet
  EXPECT_TRUE(t.SetPids(*tok, 1, {me}).ok());
  EXPECT_TRUE(t.CheckImport(*tok, {2, me, 1000}).ok());
  EXPECT_EQ(t.CheckImport(*tok, {3, parent, 1000}).code(), ErrorCode::kNotFound);
  // A connection whose process has exited is refused even with a listed pid.
  EXPECT_EQ(t.CheckImport(*tok, {2, me, 1000, /*alive=*/false}).code(), ErrorCode::kNotFound);
  // Only the exporter may change the list; bad and dead pids are refused.
  EXPECT_EQ(t.SetPids(*tok, 2, {parent}).code(), ErrorCode::kNotFound);
  EXPECT_EQ(t.SetPids(*tok, 1, {0}).code(), ErrorCode::kParamInvalid);
  pid_t child = ::fork();
  if (child == 0) _exit(0);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(t.SetPids(*tok, 1, {child}).code(), ErrorCode::kParamInvalid);
}

TEST(AllocationTable, AllowListFollowsTheProcessNotThePidNumber) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, 0);
  ASSERT_TRUE(tok.ok());
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(go[1]);
    char c;
    (void)!::read(go[0], &c, 1);
    _exit(0);
  }
  ASSERT_TRUE(t.SetPids(*tok, 1, {child}).ok());
  EXPECT_TRUE(t.CheckImport(*tok, {2, child, 1000}).ok());
  ::close(go[1]);  // the child exits
  ::waitpid(child, nullptr, 0);
  // Whoever gets that pid number next is not the process that was named.
  EXPECT_EQ(t.CheckImport(*tok, {2, child, 1000}).code(), ErrorCode::kNotFound);
  ::close(go[0]);
}

TEST(AllocationTable, NoPidCheckStillRequiresTheSameUid) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, ipc::kExportNoPidCheck);
  ASSERT_TRUE(tok.ok());
  EXPECT_TRUE(t.CheckImport(*tok, {2, 77, 1000}).ok());
  EXPECT_EQ(t.CheckImport(*tok, {2, 77, 1001}).code(), ErrorCode::kNotFound);
}

TEST(AllocationTable, WrongTokenLooksExactlyLikeAMissingOne) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, 0);
  ASSERT_TRUE(tok.ok());
  Status denied = t.CheckImport(*tok, {2, 50, 1000}).status();
  Status missing = t.CheckImport("nonexistent", {2, 50, 1000}).status();
  EXPECT_EQ(denied.code(), missing.code());
  EXPECT_EQ(denied.message(), missing.message());
}

TEST(AllocationTable, ExportRejectsUnknownFlagsAndHandles) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  EXPECT_EQ(t.Export(id, 1, 0, 1u << 9).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(t.Export(id + 100, 1, 0, 0).code(), ErrorCode::kInvalidHandle);
}

TEST(AllocationTable, ReadOnlyExportCarriesAReadOnlyFd) {
  AllocationTable t;
  uint64_t id = t.Insert(Mem(), ipc::PagePolicy::kNormalOnly, 1, 1000).id;
  auto tok = t.Export(id, 1, 1000, ipc::kExportReadOnly | ipc::kExportNoPidCheck);
  ASSERT_TRUE(tok.ok());
  auto e = t.CheckImport(*tok, {2, 1, 1000});
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE((*e)->read_only_fd.valid());
}

TEST(Ledger, OneReferencePerClientPerAllocation) {
  Ledger l;
  EXPECT_TRUE(l.Add(5));
  EXPECT_FALSE(l.Add(5));
  EXPECT_TRUE(l.Holds(5));
  EXPECT_TRUE(l.Remove(5));
  EXPECT_FALSE(l.Remove(5));  // double free
  l.Add(1);
  l.Add(2);
  auto all = l.TakeAll();
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(l.size(), 0u);
}

}  // namespace
}  // namespace membroker::broker
