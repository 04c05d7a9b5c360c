// The cross-host engine path's parsing: ip:port addresses, allow-lists, and
// the engine-to-engine messages (round trips and rejections).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include "transfer/ucx/engine_wire.h"
#include "transfer/net_address.h"

namespace membroker::detail {
namespace {

TEST(NetAddress, ParsesIpv4AndIpv6WithPorts) {
  auto a = ParseHostPort("10.0.0.1:5000");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->port(), 5000);
  EXPECT_EQ(FormatAddress(a->get()), "10.0.0.1:5000");
  auto b = ParseHostPort("[fd00::1]:7");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(FormatAddress(b->get()), "[fd00::1]:7");
  EXPECT_TRUE(ParseHostPort("0.0.0.0:0", /*allow_any_port=*/true).ok());
}

TEST(NetAddress, RejectsWhatIsNotANumericAddressAndPort) {
  for (const char* bad : {"", "decode", "10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:5x",
                          "host.example:80", "fd00::1:80", "[fd00::1]80", "[fd00::1", "10.0.0.256:1"}) {
    auto r = ParseHostPort(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), ErrorCode::kParamInvalid) << bad;
    }
    EXPECT_FALSE(LooksLikeHostPort(bad)) << bad;
  }
  EXPECT_TRUE(LooksLikeHostPort("10.0.0.1:80"));
}

TEST(NetAddress, AllowListMatchesAddressesAndPrefixes) {
  auto allow = ParseAllowList(" 10.1.0.0/16, 192.168.3.7 ,fd00::/64");
  ASSERT_TRUE(allow.ok()) << allow.status().ToString();
  ASSERT_EQ(allow->size(), 3u);
  auto at = [](const char* text) { return *ParseHostPort(text); };
  EXPECT_TRUE(AddressAllowed(*allow, at("10.1.200.3:1").get()));
  EXPECT_FALSE(AddressAllowed(*allow, at("10.2.0.1:1").get()));
  EXPECT_TRUE(AddressAllowed(*allow, at("192.168.3.7:9").get()));
  EXPECT_FALSE(AddressAllowed(*allow, at("192.168.3.8:9").get()));
  EXPECT_TRUE(AddressAllowed(*allow, at("[fd00::abcd]:1").get()));
  EXPECT_FALSE(AddressAllowed(*allow, at("[fd00:0:0:1::1]:1").get()));
  // An IPv4 peer seen through an IPv6 socket (::ffff:a.b.c.d) is its IPv4 address.
  EXPECT_TRUE(AddressAllowed(*allow, at("[::ffff:10.1.0.9]:1").get()));
  auto odd = ParseAllowList("10.1.0.0/12");  // bits past the prefix are ignored, as in routing
  ASSERT_TRUE(odd.ok());
  EXPECT_TRUE(AddressAllowed(*odd, at("10.15.255.255:1").get()));
  EXPECT_TRUE(ParseAllowList("").ok());
  EXPECT_TRUE(ParseAllowList("")->empty());
  for (const char* bad : {"10.0.0.0/33", "fd00::/129", "10.0.0.0/", "example.com", "10.0.0.0/8x"})
    EXPECT_FALSE(ParseAllowList(bad).ok()) << bad;
}

TEST(EngineWire, EveryMessageRoundTrips) {
  wire::Region r{7, 0x7f0000000000, 1 << 20, true, "kv-cache"};
  std::vector<wire::Message> all = {
      wire::Welcome{"decode", {9, 8, 7}, {r}},          wire::RegionAdded{r},
      wire::RegionGone{7},                              wire::RegionGoneAck{7},
      wire::Notify{3, "kv", "layer=1"},                 wire::NotifyAck{3, 5, "full"},
      wire::RegionAddedAck{7},                          wire::Goodbye{"disconnected"}};
  for (const auto& m : all) {
    const std::string bytes = wire::Encode(m);
    auto back = wire::Decode({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->index(), m.index());
    EXPECT_EQ(wire::Encode(*back), bytes);
    // Every truncation is refused, never read past.
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto cut = wire::Decode({reinterpret_cast<const uint8_t*>(bytes.data()), n});
      EXPECT_FALSE(cut.ok()) << "message " << m.index() << " cut at " << n;
    }
  }
  auto w = wire::Decode({reinterpret_cast<const uint8_t*>(wire::Encode(all[0]).data()), wire::Encode(all[0]).size()});
  ASSERT_TRUE(w.ok());
  const auto& welcome = std::get<wire::Welcome>(*w);
  EXPECT_EQ(welcome.engine, "decode");
  ASSERT_EQ(welcome.regions.size(), 1u);
  EXPECT_EQ(welcome.regions[0].address, 0x7f0000000000u);
  EXPECT_TRUE(welcome.regions[0].read_only);
}

TEST(EngineWire, RefusesWhatNoEngineSends) {
  auto decode = [](const std::string& s) {
    return wire::Decode({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  };
  EXPECT_EQ(decode("").status().code(), ErrorCode::kProtocolError);
  EXPECT_EQ(decode(std::string("\x0a", 1)).status().code(), ErrorCode::kProtocolError);  // unknown kind
  // A range that wraps around the address space.
  std::string wraps = wire::Encode(wire::RegionAdded{wire::Region{1, ~0ull - 10, 4096, false, ""}});
  EXPECT_FALSE(decode(wraps).ok());
  // Region names: at most 32 bytes, no control bytes.
  EXPECT_FALSE(decode(wire::Encode(wire::RegionAdded{wire::Region{1, 4096, 4096, false, std::string(33, 'n')}})).ok());
  EXPECT_FALSE(decode(wire::Encode(wire::RegionAdded{wire::Region{1, 4096, 4096, false, "a\nb"}})).ok());
  EXPECT_TRUE(decode(wire::Encode(wire::RegionAdded{wire::Region{1, 4096, 4096, false, std::string(32, 'n')}})).ok());
  // An empty engine name, trailing bytes, a count larger than the bytes left.
  EXPECT_FALSE(decode(wire::Encode(wire::Welcome{"", {}, {}})).ok());
  EXPECT_FALSE(decode(wire::Encode(wire::RegionGone{1}) + "x").ok());
  std::string many = wire::Encode(wire::Welcome{"decode", {}, {}});
  many[many.size() - 4] = '\xff';  // region count 255 with no regions behind it
  EXPECT_FALSE(decode(many).ok());
}

TEST(EngineWire, DataHeadersRoundTripAndRefuseWhatNoEngineSends) {
  auto decode = [](const wire::EncodedDataHeader& h) { return wire::DecodeData({h.data(), h.size()}); };
  const wire::DataHeader read{wire::DataKind::kReadData, 6, 41, 0x7f0000001000, 65536};
  auto back = decode(wire::EncodeData(read));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, wire::DataKind::kReadData);
  EXPECT_EQ(back->code, 6);
  EXPECT_EQ(back->tag, 41u);
  EXPECT_EQ(back->address, 0x7f0000001000u);
  EXPECT_EQ(back->length, 65536u);
  wire::EncodedDataHeader h = wire::EncodeData(read);
  // Too short, too long, an unknown kind, a range that wraps, more than a message holds.
  EXPECT_EQ(wire::DecodeData({h.data(), h.size() - 1}).status().code(), ErrorCode::kProtocolError);
  std::vector<uint8_t> longer(h.begin(), h.end());
  longer.push_back(0);
  EXPECT_FALSE(wire::DecodeData(longer).ok());
  for (uint8_t kind : {0, 5, 255}) {
    h[0] = kind;
    EXPECT_FALSE(decode(h).ok()) << int(kind);
  }
  EXPECT_FALSE(decode(wire::EncodeData({wire::DataKind::kWrite, 0, 1, ~0ull - 10, 4096})).ok());
  EXPECT_FALSE(decode(wire::EncodeData({wire::DataKind::kReadRequest, 0, 1, 4096, wire::kMaxMessageBytes + 1})).ok());
  EXPECT_TRUE(decode(wire::EncodeData({wire::DataKind::kReadRequest, 0, 1, 4096, wire::kMaxMessageBytes})).ok());
  // A batch names 1 to kMaxSegments segments.
  EXPECT_TRUE(decode(wire::EncodeData({wire::DataKind::kWriteV, 0, 1, 2, 8192})).ok());
  EXPECT_FALSE(decode(wire::EncodeData({wire::DataKind::kWriteV, 0, 1, 0, 8192})).ok());
  EXPECT_FALSE(decode(wire::EncodeData({wire::DataKind::kReadV, 0, 1, wire::kMaxSegments + 1, 8192})).ok());
}

TEST(EngineWire, SegmentTablesRoundTripAndRefuseWhatNoEngineSends) {
  const std::vector<wire::Segment> segs = {{0x7f0000001000, 4096}, {0x7f0000003000, 8192}};
  const std::string table = wire::EncodeSegments(segs);
  ASSERT_EQ(table.size(), 2 * wire::kSegmentBytes);
  auto span = [](const std::string& s) { return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()); };
  auto back = wire::DecodeSegments(span(table + "bytes follow"), 2, 12288);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)[1].address, 0x7f0000003000u);
  EXPECT_EQ((*back)[1].length, 8192u);
  EXPECT_FALSE(wire::DecodeSegments(span(table), 2, 12289).ok());         // lengths that do not sum up
  EXPECT_FALSE(wire::DecodeSegments(span(table), 3, 12288).ok());         // a count past the table
  EXPECT_FALSE(wire::DecodeSegments(span(table), 0, 0).ok());             // no segments
  EXPECT_FALSE(wire::DecodeSegments(span(wire::EncodeSegments({{1, 0}})), 1, 0).ok());  // an empty one
  EXPECT_FALSE(wire::DecodeSegments(span(wire::EncodeSegments({{~0ull - 10, 4096}})), 1, 4096).ok());  // wraps
}

}  // namespace
}  // namespace membroker::detail
