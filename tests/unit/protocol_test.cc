// Protocol round trips for every message, and rejection of malformed frames.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

namespace membroker::ipc {
namespace {

Envelope RoundTrip(const Envelope& in) {
  auto bytes = Encode(in);
  EXPECT_LE(bytes.size(), kMaxFrameBytes);
  auto out = Decode(bytes);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : Envelope{};
}

TEST(Protocol, EveryMessageRoundTrips) {
  std::vector<Message> all = {
      HelloRequest{"tokenizer-0", kProtocolVersion, 0x5},
      HelloReply{42,
                 kProtocolVersion,
                 0x1,
                 {{PagePolicy::kNormalOnly, 4096, 2 << 20}, {PagePolicy::kHuge1GOnly, 1 << 30, 1 << 30}},
                 "gpu-07"},
      MallocRequest{1 << 20, PagePolicy::kHugeFirst, kMallocExport, kExportReadOnly},
      MallocReply{7, 2 << 20, 2 << 20, true, true, 0x400000000000, true, "token"},
      FreeRequest{7},
      ExportRequest{7, kExportNoPidCheck | kExportReadOnly},
      ExportReply{"0123456789abcdef0123456789abcdef"},
      SetPidRequest{"tok", {1, 2, 300000}},
      ImportRequest{"tok"},
      ImportReply{7, 4096, 4096, true, true, 0x400000200000, ""},
      ImportReply{9, 2 << 20, 2 << 20, false, false, 0, "", 3},
      MallocReply{10, 2 << 20, 2 << 20, false, false, 0, false, "", 1},
      ImportReply{8, 4096, 4096, false, false, 0, std::string("{\"dtype\": \"<f4\"}\0x", 18)},
      PublishRequest{"tensors/w", 8, kPublishReadOnly, "meta"},
      RegisterHostRequest{0x7f0000001000, 8192, 1},
      UnregisterHostRequest{0x7f0000001000},
      PingRequest{},
      GoodbyeRequest{},
      OkReply{},
      ErrorReply{ErrorCode::kOverlap, "range overlaps"},
      EngineInitRequest{"prefill-0", 9},
      EngineFinalizeRequest{},
      EngineRegisterRequest{0x7f0000000000, 1 << 20, 9, 4096, "kv-cache"},
      EngineRegisterReply{3},
      EngineDeregisterRequest{3},
      EngineConnectRequest{"decode-0", 1000},
      EngineRegionsRequest{"decode-0"},
      EngineInfoReply{
          1234, 5, 9, {{3, 0x7f0000000000, 1 << 20, 9, 4096, true, "kv-cache"}, {4, 0x1000, 4096, 0, 0, false, ""}}},
      EngineImportRequest{"decode-0", 9},
      EngineReleaseRequest{9},
      EngineDisconnectRequest{"decode-0"},
      EngineNotifyRequest{"decode-0", "block", "ready 17"},
      EngineGetNotifiesRequest{},
      EngineNotifiesReply{{{"prefill-0", "block", "ready 17"}}, 2},
      PublishRequest{"pipeline/ring0", 7, kPublishReadOnly | kPublishPersist, ""},
      LookupRequest{"pipeline/ring0", 2500},
      UnpublishRequest{"pipeline/ring0"},
      EnginePeersRequest{},
      EnginePeersReply{{{3, 4242}, {62, 7}}},
      ReattachRequest{{{7, true, false, 0}, {1u << 20, false, true, 0x400000200000ull}}},
      ReattachReply{{{ErrorCode::kOk, "", true}, {ErrorCode::kPermissionDenied, "not ours", false}}},
      RestoreExportRequest{7, std::string(32, 'a'), kExportReadOnly, {{4242, 123456789}}},
      TakeOverHello{4242},
      TakeOverSockets{},
      TakeOverAllocations{{{7, 4096, PagePolicy::kHugeFirst, true, true, 0x400000200000ull, 1000}}},
      TakeOverExport{std::string(32, 'b'), 7, 1000, kExportNoPidCheck, {{42, 99}}},
      TakeOverName{"pipeline/ring0", 7, kPublishPersist, 1000, 4242, "f32[8]"},
      TakeOverEnd{1, 2, 3, 4},
      TakeOverKvStore{7, {0, 1, 2}},
      TakeOverKvDisk{},
      EngineResolveRequest{"decode-0", 5000},
      EngineResolveReply{},
      EngineResolveReply{"gpu-07", 15, "10.0.0.7:4000"},
      ClusterLookupRequest{"weights/llama", 5000},
      ClusterLookupReply{"gpu-07", 15, 1 << 20, true, std::string("meta\0data", 9), 77},
      TakeOverAck{},
      EngineNetworkRequest{"10.0.0.2:5000", 3, 1, 2, {{"10.0.0.3:5000", "decode", "ucx", "tcp/eth0.0"}}},
      ListNamesRequest{"pipeline/", ""},
      ListNamesRequest{"pipeline/", "pipeline/stage-7"},
      ListNamesReply{{{"pipeline/ring0", 7, 1 << 20, true, true, 4242}}, true},
      SubscribeRequest{"pipeline/"},
      SubscribeRequest{"models/", true},
      WaitEventsRequest{100},
      WakeRequest{},
      EventsReply{{{NameEventKind::kHolderDied, "pipeline/ring0", 7, 4243, ""}}, 3},
      EventsReply{{{NameEventKind::kPublished, "models/w", 0, 0, "gpu-07"}, {NameEventKind::kHostGone, "models/w", 0, 0, "gpu-07"}}, 0},
      KvOpenRequest{"llama/kv", true, 256 << 10, 1ull << 33, PagePolicy::kHugeFirst, 1},
      KvStoreReply{3, 256 << 10, 32768, 256, 128},
      KvSlabRequest{3, 127},
      KvSlabReply{64 << 20},
      KvReserveRequest{3, {"a", std::string(64, '\xff'), std::string("\0k", 2)}},
      KvSealRequest{3, {{5, 2, 9, 4096, 4000}, {6, 1, 9, 8192, 1}}},
      KvAbortRequest{3, {{5, 2}}},
      KvGetRequest{3, {"a", "b"}, true},
      KvReleaseRequest{3, {{5, 2}, {7, 9}}},
      KvBlocksReply{{{ErrorCode::kOk, 5, 2, 4000}, {ErrorCode::kStale, 6, 1, 0}}, 1},
      KvDropRequest{"llama/kv"},
  };
  std::set<size_t> covered;
  for (const Message& m : all) covered.insert(m.index());
  ASSERT_EQ(covered.size(), std::variant_size_v<Message>) << "a message type has no round-trip case";
  uint64_t rid = 1;
  for (const Message& m : all) {
    Envelope in{kProtocolVersion, rid++, kFlagNoReplyOnSuccess, m};
    EXPECT_EQ(RoundTrip(in), in) << MessageName(m);
  }
}

TEST(Protocol, ExpectedFdsOnlyForRepliesCarryingMemory) {
  EXPECT_EQ(ExpectedFds(MallocReply{}), 1u);
  EXPECT_EQ(ExpectedFds(ImportReply{}), 1u);
  EXPECT_EQ(ExpectedFds(WakeRequest{}), 1u);  // the wake socket's sending end
  EXPECT_EQ(ExpectedFds(MallocRequest{}), 0u);
  EXPECT_EQ(ExpectedFds(ErrorReply{}), 0u);
}

TEST(Protocol, GarbageIsAProtocolError) {
  std::vector<uint8_t> empty;
  EXPECT_EQ(Decode(empty).code(), ErrorCode::kProtocolError);
  std::vector<uint8_t> junk(100, 0xff);
  EXPECT_EQ(Decode(junk).code(), ErrorCode::kProtocolError);
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_EQ(Decode(zeros).code(), ErrorCode::kProtocolError);
}

TEST(Protocol, EveryTruncationIsRejectedOrHarmless) {
  auto bytes = Encode({kProtocolVersion, 9, 0, SetPidRequest{"abc", {1, 2, 3}}});
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    auto r = Decode(cut);
    EXPECT_FALSE(r.ok()) << "truncated to " << n << " bytes still decoded";
  }
}

TEST(Protocol, OverlongStringsAreRejected) {
  auto bytes = Encode({kProtocolVersion, 1, 0, HelloRequest{std::string(kMaxClientNameBytes + 1, 'x')}});
  auto r = Decode(bytes);
  EXPECT_EQ(r.code(), ErrorCode::kProtocolError);
  EXPECT_NE(r.status().message().find("client_name"), std::string::npos);
  auto tok = Encode({kProtocolVersion, 1, 0, ImportRequest{std::string(kMaxTokenBytes + 1, 'a')}});
  EXPECT_EQ(Decode(tok).code(), ErrorCode::kProtocolError);
}

TEST(Protocol, TooManyPidsAreRejected) {
  SetPidRequest m{"t", std::vector<int32_t>(kMaxPidsPerRequest + 1, 5)};
  EXPECT_EQ(Decode(Encode({kProtocolVersion, 1, 0, m})).code(), ErrorCode::kProtocolError);
}

// An unknown policy in a request is the broker's to judge (PARAM_INVALID,
// the connection stays): it decodes as it came. In a reply it is malformed.
TEST(Protocol, UnknownPagePolicyReachesTheBrokerButNotTheClient) {
  MallocRequest m{4096, static_cast<PagePolicy>(9), 0};
  auto r = Decode(Encode({kProtocolVersion, 1, 0, m}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(static_cast<int>(std::get<MallocRequest>(r->body).policy), 9);
  HelloReply h{1, kProtocolVersion, 0, {{static_cast<PagePolicy>(9), 4096, 4096}}, ""};
  EXPECT_EQ(Decode(Encode({kProtocolVersion, 1, 0, h})).code(), ErrorCode::kProtocolError);
}

TEST(Protocol, UnknownUnionTypeIsRejected) {
  auto bytes = Encode({kProtocolVersion, 1, 0, PingRequest{}});
  // Find the union type byte (PingRequest = 11) and make it unknown.
  bool patched = false;
  for (auto& b : bytes) {
    if (b == 11) {
      b = 200;
      patched = true;
      auto r = Decode(bytes);
      EXPECT_FALSE(r.ok() && std::holds_alternative<PingRequest>(r->body));
      b = 11;
    }
  }
  EXPECT_TRUE(patched);
}

// Every alternative of Message, default-constructed: it survives the wire as
// itself, its name is its type's, and the list's directions and fd counts hold.
template <size_t... I>
std::vector<Message> EveryDefaultMessage(std::index_sequence<I...>) {
  return {Message(std::in_place_index<I>)...};
}

TEST(Protocol, TheMessageListDrivesNamesFdsAndDirections) {
  auto all = EveryDefaultMessage(std::make_index_sequence<std::variant_size_v<Message>>());
  std::set<std::string> names;
  size_t requests = 0;
  for (const Message& m : all) {
    Envelope out = RoundTrip({kProtocolVersion, 9, 0, m});
    EXPECT_EQ(out.body.index(), m.index()) << MessageName(m);
    names.insert(MessageName(m));
    const std::string name = MessageName(m);
    EXPECT_EQ(IsRequest(m), name.size() > 7 && name.compare(name.size() - 7, 7, "Request") == 0) << name;
    requests += IsRequest(m);
  }
  EXPECT_EQ(names.size(), all.size());
  EXPECT_EQ(std::string(MessageName(Message(ImportReply{}))), "ImportReply");
  EXPECT_EQ(std::string(MessageName(Message(EventsReply{}))), "EventsReply");
  EXPECT_GT(requests, 20u);
}

TEST(Protocol, StatusOfIsTheOneErrorReplyConversion) {
  EXPECT_TRUE(StatusOf(OkReply{}).ok());
  EXPECT_TRUE(StatusOf(ExportReply{"t"}).ok());
  Status st = StatusOf(ErrorReply{ErrorCode::kQuotaExceeded, "over"});
  EXPECT_EQ(st.code(), ErrorCode::kQuotaExceeded);
  EXPECT_EQ(st.message(), "over");
  // An error reply that says OK is not a success.
  EXPECT_EQ(StatusOf(ErrorReply{ErrorCode::kOk, "?"}).code(), ErrorCode::kProtocolError);
}

TEST(Protocol, ErrorCodeNamesAreStable) {
  EXPECT_EQ(ErrorCodeName(ErrorCode::kParamInvalid), "PARAM_INVALID");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kOutOfRange), "OUT_OF_RANGE");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kQuotaExceeded), "QUOTA_EXCEEDED");
  EXPECT_EQ(ErrorCodeName(ErrorCode::kAddressInUse), "ADDRESS_IN_USE");
  EXPECT_EQ(static_cast<int>(ErrorCode::kResourceExhausted), 5);
  EXPECT_EQ(Status(ErrorCode::kBusy, "x").ToString(), "BUSY: x");
}

}  // namespace
}  // namespace membroker::ipc

namespace membroker::ipc {
namespace {

// The broker lists every region of an engine in one reply: with the most
// regions, each with the longest name, it still fits one frame.
TEST(Protocol, AnEngineInfoReplyWithEveryRegionNamedFitsOneFrame) {
  EngineInfoReply r{INT32_MAX, UINT32_MAX, UINT64_MAX, {}};
  for (size_t i = 0; i < kMaxEngineRegions; ++i)
    r.regions.push_back({UINT64_MAX - i, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, true,
                         std::string(kMaxRegionNameBytes - 3, 'n') + std::to_string(100 + i % 900)});
  const std::vector<uint8_t> bytes = Encode({kProtocolVersion, UINT64_MAX, 0, r});
  EXPECT_LE(bytes.size(), kMaxFrameBytes);
  auto back = Decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<EngineInfoReply>(back->body).regions.size(), kMaxEngineRegions);
}

}  // namespace
}  // namespace membroker::ipc
