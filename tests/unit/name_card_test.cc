// The share's name card (libclient/transfer/share/name_card.h): what
// FetchNamed reads from another host, so every field is checked.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "transfer/share/name_card.h"

namespace membroker::share {
namespace {

NameCard Sample() { return {"models/llama-70b", 3, 41, 0x7f0000200000, 3 << 20, 0x1234567890abcdefull}; }

std::vector<uint8_t> Page(const NameCard& c) {
  std::vector<uint8_t> page(kCardBytes, 0xee);
  EXPECT_TRUE(EncodeCard(c, page).ok());
  return page;
}

TEST(NameCard, RoundTrips) {
  auto back = DecodeCard(Page(Sample()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
  NameCard longest = Sample();
  longest.name = std::string(kCardNameMax, 'n');
  EXPECT_EQ(*DecodeCard(Page(longest)), longest);
}

TEST(NameCard, EachBadFieldIsRefused) {
  const std::vector<uint8_t> good = Page(Sample());
  // Offsets in the card's layout: magic 0, version 8, name_len 12, serial 16,
  // allocation 24, object_address 32, size 40, checksum 48, name 56.
  auto with = [&](size_t offset, const void* bytes, size_t n) {
    std::vector<uint8_t> p = good;
    std::memcpy(p.data() + offset, bytes, n);
    return DecodeCard(p).status().code();
  };
  const uint64_t zero = 0, unaligned = 0x7f0000200010, huge = uint64_t{1} << 49, wraps = ~uint64_t{0} - 4095;
  const uint32_t v2 = 2, no_name = 0, long_name = kCardNameMax + 1;
  EXPECT_EQ(with(0, &zero, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(8, &v2, 4), ErrorCode::kProtocolError);
  EXPECT_EQ(with(12, &no_name, 4), ErrorCode::kProtocolError);
  EXPECT_EQ(with(12, &long_name, 4), ErrorCode::kProtocolError);
  EXPECT_EQ(with(32, &zero, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(32, &unaligned, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(32, &wraps, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(40, &zero, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(40, &huge, 8), ErrorCode::kProtocolError);
  EXPECT_EQ(with(56, "\x01", 1), ErrorCode::kProtocolError);  // a control byte in the name
  EXPECT_EQ(with(56, "\xff", 1), ErrorCode::kProtocolError);  // not UTF-8
  EXPECT_EQ(DecodeCard({good.data(), 40}).status().code(), ErrorCode::kProtocolError);
  std::vector<uint8_t> page(kCardBytes);
  EXPECT_EQ(EncodeCard({"", 1, 1, 4096, 1, 0}, page).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(EncodeCard({std::string(kCardNameMax + 1, 'n'), 1, 1, 4096, 1, 0}, page).code(), ErrorCode::kParamInvalid);
}

TEST(NameCard, RegionNamesFitAnEnginesRegionNameAndStartWithTheNamesHash) {
  const std::string n = CardRegionName("models/w", 123456789012345);
  EXPECT_LE(n.size(), 32u);  // ipc::kMaxRegionNameBytes
  EXPECT_EQ(n.rfind(CardRegionPrefix("models/w"), 0), 0u);
  EXPECT_NE(CardRegionPrefix("models/w"), CardRegionPrefix("models/x"));
}

TEST(NameCard, TheChecksumSeesOneFlippedBitAnywhere) {
  std::vector<uint8_t> bytes(8192 + 13);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint64_t whole = Checksum(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size(); i += 37) {
    bytes[i] ^= 0x10;
    EXPECT_NE(Checksum(bytes.data(), bytes.size()), whole) << "byte " << i;
    bytes[i] ^= 0x10;
  }
  EXPECT_NE(Checksum(bytes.data(), bytes.size() - 1), whole);  // the length counts too
}

}  // namespace
}  // namespace membroker::share
