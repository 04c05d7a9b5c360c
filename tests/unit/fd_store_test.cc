// What the broker writes into systemd's fd store and reads back at start
// (broker/fd_store.h): memory names that carry an allocation's description,
// and the sealed state memfd of exports and names, checked on the way in.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "restart/fd_store.h"

namespace membroker::broker {
namespace {

TEST(FdStore, MemoryNamesCarryTheAllocationAndOnlyTheirOwnSpellingParses) {
  ipc::TakeOverAllocation a{1048577, 2 << 20, ipc::PagePolicy::kHugeFirst, true, true, 0x7f0000200000, 1000};
  const std::string name = StoredMemoryName(a);
  EXPECT_EQ(name, "mem-1048577-2097152-1-1-1-7f0000200000-1000");
  EXPECT_LE(name.size(), 255u);  // FDNAME's limit
  EXPECT_EQ(name.find(':'), std::string::npos);
  auto back = ParseStoredMemoryName(name);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, a);
  for (const char* bad : {"mem-", "mem-0-4096-0-0-0-0-0", "mem-1-4096-9-0-0-0-0", "mem-1-4096-0-2-0-0-0",
                          "mem-1-4096-0-0-0-0-0x", "mem-01-4096-0-0-0-0-0", "mem-1-4096-0-0-0-0", "state-1",
                          "mem-1-4096-0-0-0-0-0 ", "mem-18446744073709551616-4096-0-0-0-0-0"})
    EXPECT_FALSE(ParseStoredMemoryName(bad).has_value()) << bad;
  EXPECT_EQ(ParseStoredStateName("state-7"), std::optional<uint64_t>(7));
  EXPECT_FALSE(ParseStoredStateName("state-07").has_value());
  EXPECT_FALSE(ParseStoredStateName("state-").has_value());
}

TEST(FdStore, KvStoreNamesCarryTheStoreItsGenerationAndThePart) {
  const std::string name = StoredKvName({9007199254740991ull, 3, 4096});
  EXPECT_EQ(name, "kv-9007199254740991-3-4096");
  auto back = ParseStoredKvName(name);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->store, 9007199254740991ull);
  EXPECT_EQ(back->generation, 3u);
  EXPECT_EQ(back->part, 4096u);
  for (const char* bad : {"kv-1-2", "kv-1-2-3-4", "kv-01-2-3", "kv-1-2-3x", "kv--1-2-3", "kv-1-2-+3", "mem-1-2-3"})
    EXPECT_FALSE(ParseStoredKvName(bad).has_value()) << bad;
}

TEST(FdStore, StateRoundTripsSealedAndDamageIsRefused) {
  std::vector<ipc::Message> records = {
      ipc::TakeOverExport{std::string(32, 'a'), 5, 1000, 0, {}},
      ipc::TakeOverName{"kept/weights", 5, 0, 1000, 42, "meta"},
      ipc::TakeOverEnd{0, 1, 1},
  };
  auto fd = WriteStoredState(records);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(::write(fd->get(), "x", 1), -1);  // sealed
  EXPECT_EQ(errno, EPERM);
  auto back = ReadStoredState(fd->get());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0], records[0]);
  EXPECT_EQ((*back)[1], records[1]);

  // Cut short, counts that disagree, no end, a stray message: all refused.
  auto damaged = [](std::vector<uint8_t> bytes) {
    ipc::UniqueFd m(::memfd_create("damaged", MFD_CLOEXEC));
    EXPECT_EQ(::write(m.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    return ReadStoredState(m.get()).code();
  };
  std::vector<uint8_t> whole(4096);
  const ssize_t n = ::pread(fd->get(), whole.data(), whole.size(), 0);
  ASSERT_GT(n, 8);
  whole.resize(static_cast<size_t>(n));
  EXPECT_EQ(damaged({whole.begin(), whole.end() - 1}), ErrorCode::kProtocolError);
  EXPECT_EQ(damaged({whole.begin(), whole.begin() + 3}), ErrorCode::kProtocolError);
  std::vector<uint8_t> huge_length = whole;
  huge_length[3] = 0x7f;
  EXPECT_EQ(damaged(huge_length), ErrorCode::kProtocolError);
  for (auto bad : {std::vector<ipc::Message>{ipc::TakeOverEnd{0, 2, 1}},
                   std::vector<ipc::Message>{ipc::TakeOverName{"x", 1, 0, 0, 0, ""}},
                   std::vector<ipc::Message>{ipc::TakeOverAck{}, ipc::TakeOverEnd{}}}) {
    auto f = WriteStoredState(bad);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(ReadStoredState(f->get()).code(), ErrorCode::kProtocolError);
  }
  EXPECT_EQ(damaged({}), ErrorCode::kProtocolError);
}

}  // namespace
}  // namespace membroker::broker
