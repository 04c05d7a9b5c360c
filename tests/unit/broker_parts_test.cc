// Small broker parts with rules of their own: size text, quota specs, the
// same-address window, accounting limits, settings.
#include <gtest/gtest.h>

#include "memory/accounting.h"
#include "memory/address_window.h"
#include "options.h"
#include "size_text.h"

namespace membroker::broker {
namespace {

TEST(SizeText, SuffixesHexAndRejects) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseSize("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_TRUE(ParseSize("64K", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(ParseSize("2m", &v));
  EXPECT_EQ(v, 2u << 20);
  EXPECT_TRUE(ParseSize("1T", &v));
  EXPECT_EQ(v, 1ull << 40);
  EXPECT_TRUE(ParseSize("0x400000000000", &v));
  EXPECT_EQ(v, 0x400000000000ull);
  for (const char* bad : {"", "-1", "12Q", "K", "99999999999999999999", "20000000000T"})
    EXPECT_FALSE(ParseSize(bad, &v)) << bad;
}

TEST(SizeText, CountsAreDecimalOnly) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseCount("1024", &v));
  EXPECT_EQ(v, 1024u);
  EXPECT_TRUE(ParseCount("18446744073709551615", &v));
  EXPECT_EQ(v, UINT64_MAX);
  // A uid of "1K" or a timeout of "0x10" is a mistake, not 1024 or 16.
  for (const char* bad : {"", "1K", "0x10", "-1", " 1", "1 ", "18446744073709551616", "123456789012345678901"})
    EXPECT_FALSE(ParseCount(bad, &v)) << bad;
}

TEST(QuotaSpec, ParsesAndRejects) {
  QuotaLimits q;
  ASSERT_TRUE(q.Parse("bytes=1G,pinned=64M,allocations=100,imports=unlimited").ok());
  EXPECT_EQ(q.bytes, 1u << 30);
  EXPECT_EQ(q.pinned_bytes, 64u << 20);
  EXPECT_EQ(q.allocations, 100u);
  EXPECT_EQ(q.imports, QuotaLimits::kUnlimited);
  EXPECT_EQ(q.kv_bytes, QuotaLimits::kUnlimited);
  ASSERT_TRUE(q.Parse("kv=2G").ok());
  EXPECT_EQ(q.kv_bytes, 2ull << 30);
  EXPECT_EQ(q.Parse("bytes").code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(q.Parse("colour=red").code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(q.Parse("bytes=lots").code(), ErrorCode::kParamInvalid);
}

TEST(Accounting, BudgetsThenClientThenUidLimits) {
  Accounting a;
  a.max_bytes = 1000;
  a.max_pinned_bytes = 100;
  a.client_limits.allocations = 2;
  a.uid_limits[7].bytes = 500;
  Usage client;
  EXPECT_EQ(a.Check(client, 1, Usage{1001, 0, 1, 0}).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(a.Check(client, 1, Usage{0, 101, 0, 0}).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(a.Check(Usage{0, 0, 2, 0}, 1, Usage{1, 0, 1, 0}).code(), ErrorCode::kQuotaExceeded);
  EXPECT_EQ(a.Check(client, 7, Usage{501, 0, 1, 0}).code(), ErrorCode::kQuotaExceeded);
  EXPECT_TRUE(a.Check(client, 8, Usage{501, 0, 1, 0}).ok());  // uid 8 has the default: unlimited
  a.ChargeUid(7, Usage{400, 0, 1, 0});
  Status st = a.Check(client, 7, Usage{200, 0, 1, 0});
  EXPECT_EQ(st.code(), ErrorCode::kQuotaExceeded);
  EXPECT_NE(st.message().find("limit 500: in use 400, this request needs 200"), std::string::npos);
  a.ReleaseUid(7, Usage{400, 0, 1, 0});
  EXPECT_TRUE(a.by_uid().empty());
  EXPECT_EQ(a.total().bytes, 0u);
}

TEST(AddressWindow, AlignedFirstFitAndMerging) {
  AddressWindow w(1ull << 30, 64ull << 20);
  uint64_t a = w.Allocate(4 << 20, 2 << 20);
  uint64_t b = w.Allocate(4 << 20, 2 << 20);
  EXPECT_EQ(a, 1ull << 30);
  EXPECT_EQ(b, a + (4 << 20));
  EXPECT_EQ(w.used(), 8u << 20);
  EXPECT_EQ(w.Allocate(128 << 20, 2 << 20), 0u);  // too big
  w.Free(a);
  w.Free(b);
  w.Free(b);  // unknown now: ignored
  EXPECT_EQ(w.used(), 0u);
  EXPECT_EQ(w.Allocate(64 << 20, 2 << 20), 1ull << 30);  // merged back into one range
}

TEST(Settings, FlagsAndErrors) {
  Options o;
  EXPECT_TRUE(ApplySetting("pool", "3000:normal:2", &o).ok());
  EXPECT_EQ(o.pools.back().size, 4096u);  // rounded to the page
  EXPECT_FALSE(ApplySetting("pool", "2M:huge-first:2", &o).ok());
  EXPECT_FALSE(ApplySetting("pool", "2M:normal", &o).ok());
  EXPECT_TRUE(ApplySetting("quota-uid", "1000:bytes=1G", &o).ok());
  EXPECT_TRUE(ApplySetting("quota-uid", "default:allocations=5", &o).ok());
  EXPECT_EQ(o.quota_uid_default.allocations, 5u);
  EXPECT_FALSE(ApplySetting("va-window", "0x1000:4T", &o).ok());  // not 1 GiB aligned
  EXPECT_TRUE(ApplySetting("log-level", "debug", &o).ok());
  EXPECT_EQ(o.log_level, 3);
  EXPECT_EQ(ApplySetting("no-such-thing", "1", &o).code(), ErrorCode::kParamInvalid);
}

}  // namespace
}  // namespace membroker::broker
