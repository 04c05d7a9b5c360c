// The restart identity: SipHash-2-4 against the reference vectors, memfd tags,
// and the state file's checks and id blocks (broker/restart/state_file.h).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "memory/address_window.h"
#include "restart/state_file.h"
#include "restart/siphash.h"

namespace membroker::broker {
namespace {

// The reference implementation's vectors (key 00..0f, message 00..len-1).
TEST(SipHash, MatchesTheReferenceVectors) {
  SipKey key;
  for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i);
  uint8_t msg[64];
  for (int i = 0; i < 64; ++i) msg[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(SipHash24(key, msg, 0), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(SipHash24(key, msg, 1), 0x74f839c593dc67fdull);
  EXPECT_EQ(SipHash24(key, msg, 8), 0x93f5f5799a932462ull);
  EXPECT_EQ(SipHash24(key, msg, 15), 0xa129ca6149be45e5ull);  // the paper's example
}

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/membroker-identity.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/state";
  }
  void TearDown() override { (void)!std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string dir_, path_;
};

TEST_F(StateFileTest, TagsAreMadeWithItsKeyOnly) {
  auto a = StateFile::Open(path_);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string name = (*a)->NameFor("membroker:client1");
  EXPECT_EQ(name.rfind("membroker:client1:", 0), 0u);
  EXPECT_TRUE((*a)->Tagged(name));
  std::string tampered = name;
  tampered.back() = tampered.back() == '0' ? '1' : '0';
  EXPECT_FALSE((*a)->Tagged(tampered));
  EXPECT_FALSE((*a)->Tagged("membroker:client1"));
  EXPECT_FALSE((*a)->Tagged(""));
  EXPECT_FALSE(StateFile::Ephemeral()->Tagged(name)) << "another key must not check";
  // The next broker on the same file has the same key.
  a->reset();
  auto b = StateFile::Open(path_);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*b)->Tagged(name));
}

TEST_F(StateFileTest, EachBrokerStartsAboveEveryIdBefore) {
  uint64_t first = 0, limit = 0;
  {
    auto a = StateFile::Open(path_);
    ASSERT_TRUE(a.ok());
    first = (*a)->first_id();
    EXPECT_EQ(first, 1u);
    ASSERT_TRUE((*a)->Reserve((*a)->limit() + 5).ok());  // ids past the first block
    limit = (*a)->limit();
    EXPECT_GT(limit, StateFile::kIdBlock);
  }
  auto b = StateFile::Open(path_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->first_id(), limit + 1);
}

TEST_F(StateFileTest, AFileOthersCanReadOrACorruptOneIsRefused) {
  ASSERT_TRUE(StateFile::Open(path_).ok());
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  auto open = StateFile::Open(path_);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status().ToString();
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  ASSERT_EQ(::truncate(path_.c_str(), 7), 0);
  open = StateFile::Open(path_);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("not a membrokerd state file"), std::string::npos);
}

TEST(AddressWindow, ClaimTakesExactlyAFreeRange) {
  AddressWindow w(0x400000000000ull, 1ull << 30);
  EXPECT_TRUE(w.Claim(0x400000200000ull, 2 << 20));
  EXPECT_FALSE(w.Claim(0x400000200000ull, 4096)) << "taken";
  EXPECT_FALSE(w.Claim(0x3fffffe00000ull, 2 << 20)) << "outside the window";
  EXPECT_EQ(w.used(), uint64_t{2 << 20});
  const uint64_t other = w.Allocate(2 << 20, 2 << 20);
  EXPECT_NE(other, 0x400000200000ull);
  w.Free(0x400000200000ull);
  EXPECT_TRUE(w.Claim(0x400000200000ull, 2 << 20)) << "free again";
}

}  // namespace
}  // namespace membroker::broker
