// RawClient: a client that speaks the wire protocol itself, for tests that
// send what the client library never would.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"

namespace membroker::testing {

class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    auto s = ipc::ConnectSeqpacket(path);
    EXPECT_TRUE(s.ok());
    if (s.ok()) sock_ = std::move(*s);
  }
  int fd() const { return sock_.get(); }
  Status SendMsg(ipc::Message m, uint32_t flags = 0, uint16_t version = ipc::kProtocolVersion,
                 std::span<const int> fds = {}) {
    auto bytes = ipc::Encode({version, next_rid_++, flags, std::move(m)});
    return ipc::SendFrame(sock_.get(), bytes, fds);
  }
  Status SendRaw(const std::vector<uint8_t>& bytes) { return ipc::SendFrame(sock_.get(), bytes, {}); }
  // The next reply, or an error Status when the broker closed the connection.
  Result<ipc::Envelope> Next(ipc::Frame* frame_out = nullptr) {
    ipc::Frame f;
    MB_RETURN_IF_ERROR(ipc::RecvFrame(sock_.get(), &f));
    auto env = ipc::Decode(f.bytes);
    if (frame_out) *frame_out = std::move(f);
    return env;
  }
  void Hello(uint64_t features = 0) {
    ASSERT_TRUE(SendMsg(ipc::HelloRequest{"raw", ipc::kProtocolVersion, features}).ok());
    auto r = Next();
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(std::holds_alternative<ipc::HelloReply>(r->body));
  }
  uint64_t last_rid() const { return next_rid_ - 1; }

 private:
  ipc::UniqueFd sock_;
  uint64_t next_rid_ = 1;
};

inline ErrorCode ErrorOf(const Result<ipc::Envelope>& r) {
  if (!r.ok()) return ErrorCode::kOk;
  auto* e = std::get_if<ipc::ErrorReply>(&r->body);
  return e ? e->code : ErrorCode::kOk;
}

}  // namespace membroker::testing
