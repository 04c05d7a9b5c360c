// Raw-socket clients that break the protocol: each gets a defined error or a
// disconnect of its own connection; the broker keeps serving everyone else and
// leaks no fds.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "raw_client.h"
#include "membroker/client.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

namespace membroker::testing {
namespace {

using namespace membroker::ipc;

class Abuse : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Client::Connect({broker.socket(), "bystander"});
    ASSERT_TRUE(c.ok());
    bystander = std::move(*c);
    auto h = bystander.MallocPhysical(4096);
    ASSERT_TRUE(h.ok());
    held = std::move(*h);
    ASSERT_TRUE(bystander.Ping().ok());
    fds_before = broker.FdCount();
  }
  void TearDown() override {
    // Whatever happened, the bystander is still served and nothing leaked.
    EXPECT_TRUE(bystander.Ping().ok());
    EXPECT_EQ(broker.WaitForStat("clients_connected", 1), 1u);
    EXPECT_EQ(broker.Stat("allocations_live"), 1u);
    EXPECT_EQ(broker.WaitForStat("bytes_returning", 0), 0u);  // large frees closed by a worker
    EXPECT_EQ(broker.FdCount(), fds_before);
  }
  BrokerProcess broker;
  Client bystander;
  PhysicalHandle held;
  size_t fds_before = 0;
};

TEST_F(Abuse, GarbageFrameDisconnectsOnlyThatClient) {
  {
    RawClient raw(broker.socket());
    raw.Hello();
    ASSERT_TRUE(raw.SendRaw(std::vector<uint8_t>(200, 0xee)).ok());
    EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
  }
  EXPECT_EQ(broker.Stat("protocol_errors"), 1u);
}

TEST_F(Abuse, RequestBeforeHandshakeIsRefused) {
  RawClient raw(broker.socket());
  ASSERT_TRUE(raw.SendMsg(MallocRequest{4096}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kProtocolError);
  EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
}

TEST_F(Abuse, WrongProtocolVersionIsRefused) {
  RawClient raw(broker.socket());
  ASSERT_TRUE(raw.SendMsg(HelloRequest{"old", 99, 0}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kVersionMismatch);
  RawClient raw2(broker.socket());
  ASSERT_TRUE(raw2.SendMsg(HelloRequest{"x", kProtocolVersion, 0}, 0, /*envelope version=*/7).ok());
  EXPECT_EQ(ErrorOf(raw2.Next()), ErrorCode::kVersionMismatch);
}

TEST_F(Abuse, FdsAttachedToARequestAreClosedAndTheClientDropped) {
  RawClient raw(broker.socket());
  raw.Hello();
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int fds[] = {devnull, devnull, devnull};
  ASSERT_TRUE(raw.SendMsg(PingRequest{}, 0, kProtocolVersion, fds).ok());
  ::close(devnull);
  EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
}

// The wake socket must be an AF_UNIX datagram socket: a file, a stream
// socket or a WakeRequest without its fd gets a clear error, and the broker
// never writes to what it refused.
TEST_F(Abuse, AWakeFdThatIsNotADatagramSocketIsRefused) {
  RawClient raw(broker.socket());
  raw.Hello();
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_TRUE(raw.SendMsg(WakeRequest{}, 0, kProtocolVersion, {&devnull, 1}).ok());
  ::close(devnull);
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  int stream[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream), 0);
  ASSERT_TRUE(raw.SendMsg(WakeRequest{}, 0, kProtocolVersion, {&stream[1], 1}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  ASSERT_TRUE(raw.SendMsg(PingRequest{}).ok());  // still served
  EXPECT_TRUE(std::holds_alternative<OkReply>(raw.Next()->body));
  char byte;
  EXPECT_EQ(::recv(stream[0], &byte, 1, MSG_DONTWAIT), -1) << "the broker wrote to a socket it refused";
  ::close(stream[0]);
  ::close(stream[1]);
  ASSERT_TRUE(raw.SendMsg(WakeRequest{}).ok());  // no fd: out of protocol
  EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
}

TEST_F(Abuse, UnknownForeignAndFreedHandles) {
  RawClient raw(broker.socket());
  raw.Hello();
  // The bystander's allocation id is not this client's to free or export.
  ASSERT_TRUE(raw.SendMsg(FreeRequest{held.id()}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
  ASSERT_TRUE(raw.SendMsg(ExportRequest{held.id(), 0}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
  ASSERT_TRUE(raw.SendMsg(FreeRequest{999999}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
  // Own handle: free once fine, twice an error.
  ASSERT_TRUE(raw.SendMsg(MallocRequest{4096}).ok());
  Frame f;
  auto m = raw.Next(&f);
  ASSERT_TRUE(m.ok());
  uint64_t id = std::get<MallocReply>(m->body).handle;
  ASSERT_TRUE(raw.SendMsg(FreeRequest{id}).ok());
  EXPECT_TRUE(std::holds_alternative<OkReply>(raw.Next()->body));
  ASSERT_TRUE(raw.SendMsg(FreeRequest{id}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
  ASSERT_TRUE(raw.SendMsg(ExportRequest{id, 0}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kInvalidHandle);
}

TEST_F(Abuse, OneWayRequestsAnswerOnlyFailures) {
  RawClient raw(broker.socket());
  raw.Hello();
  ASSERT_TRUE(raw.SendMsg(FreeRequest{424242}, kFlagNoReplyOnSuccess).ok());
  uint64_t failed_rid = raw.last_rid();
  ASSERT_TRUE(raw.SendMsg(PingRequest{}, kFlagNoReplyOnSuccess).ok());  // succeeds: silent
  ASSERT_TRUE(raw.SendMsg(PingRequest{}).ok());
  uint64_t ping_rid = raw.last_rid();
  auto first = raw.Next();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->request_id, failed_rid);
  EXPECT_EQ(ErrorOf(first), ErrorCode::kInvalidHandle);
  auto second = raw.Next();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->request_id, ping_rid);
  EXPECT_TRUE(std::holds_alternative<OkReply>(second->body));
}

TEST_F(Abuse, RepliesSentAsRequestsAreRefused) {
  RawClient raw(broker.socket());
  raw.Hello();
  ASSERT_TRUE(raw.SendMsg(OkReply{}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kProtocolError);
  ASSERT_TRUE(raw.SendMsg(HelloRequest{"again"}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kProtocolError);
  ASSERT_TRUE(raw.SendMsg(PingRequest{}).ok());  // still connected
  EXPECT_TRUE(std::holds_alternative<OkReply>(raw.Next()->body));
}

TEST_F(Abuse, BadSizesAndFlags) {
  RawClient raw(broker.socket());
  raw.Hello();
  ASSERT_TRUE(raw.SendMsg(MallocRequest{0}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  ASSERT_TRUE(raw.SendMsg(MallocRequest{UINT64_MAX}).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  MallocRequest bad_flags{4096, ipc::PagePolicy::kNormalOnly, 0x80};
  ASSERT_TRUE(raw.SendMsg(bad_flags).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  MallocRequest bad_export_flags{4096, ipc::PagePolicy::kNormalOnly, ipc::kMallocExport, 0x80};
  ASSERT_TRUE(raw.SendMsg(bad_export_flags).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  MallocRequest export_flags_alone{4096, ipc::PagePolicy::kNormalOnly, 0, ipc::kExportNoPidCheck};
  ASSERT_TRUE(raw.SendMsg(export_flags_alone).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kParamInvalid);
  EXPECT_EQ(broker.Stat("allocations_live"), 1u);  // the bystander's
  EXPECT_EQ(broker.Stat("exports_live"), 0u);
  SetPidRequest bad_pid{"x", {-5}};
  ASSERT_TRUE(raw.SendMsg(bad_pid).ok());
  EXPECT_EQ(ErrorOf(raw.Next()), ErrorCode::kNotFound);
}

TEST_F(Abuse, ClientThatNeverReadsIsDisconnectedNotBuffered) {
  RawClient raw(broker.socket());
  raw.Hello();
  Status st;
  int sent = 0;
  for (; sent < 200000; ++sent) {
    st = raw.SendMsg(PingRequest{});
    if (!st.ok()) break;
  }
  EXPECT_FALSE(st.ok()) << "broker kept buffering replies for a client that never reads";
  EXPECT_EQ(broker.WaitForStat("clients_kicked", 1), 1u);
}

TEST_F(Abuse, OversizedFrameDisconnectsThatClient) {
  RawClient raw(broker.socket());
  raw.Hello();
  std::vector<uint8_t> big(kMaxFrameBytes + 4096, 0x42);
  ASSERT_EQ(::send(raw.fd(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
  EXPECT_EQ(broker.Stat("protocol_errors"), 1u);
}

TEST_F(Abuse, EmptyAndTinyFrames) {
  RawClient raw(broker.socket());
  raw.Hello();
  ASSERT_TRUE(raw.SendRaw(std::vector<uint8_t>{}).ok());
  EXPECT_EQ(raw.Next().code(), ErrorCode::kNotConnected);
  RawClient raw2(broker.socket());
  ASSERT_TRUE(raw2.SendRaw(std::vector<uint8_t>{1, 2, 3}).ok());
  EXPECT_EQ(raw2.Next().code(), ErrorCode::kNotConnected);
}

}  // namespace
}  // namespace membroker::testing
