// What two transfer engines on different hosts say to each other, inside UCX
// active messages: the handshake (Hello, then Welcome or Refused), the
// acceptor's registered ranges with their packed rkeys (in Welcome, then one
// RegionAdded or RegionGone per change: each RegionAdded answered once the
// connector knows the range, each RegionGone once it no longer uses it), and
// notifies with their answers.
//
// Little-endian, length-prefixed, one message per active message. Decode
// trusts nothing: every length is checked against what is left and against
// the limits below, and a message that does not parse is PROTOCOL_ERROR.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "membroker/status.h"

namespace membroker::detail::wire {

inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kMaxSecretBytes = 4096;
inline constexpr size_t kMaxRkeyBytes = 8192;
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kMaxMessageBytes = 4 << 20;

struct Region {
  uint64_t handle = 0;  // the owner's MemHandle
  uint64_t address = 0;
  uint64_t length = 0;
  bool read_only = false;
  std::string rkey;  // ucp_rkey_pack's bytes
};
struct Hello {
  uint32_t version = kVersion;
  std::string secret;  // empty: none configured
  std::string engine;  // the connector's engine name
};
struct Welcome {
  std::string engine;
  std::array<uint8_t, 16> identity{};  // also in its control block: tells a same-host peer
  std::vector<Region> regions;
};
struct Refused {
  int32_t code = 0;  // an ErrorCode
  std::string reason;
};
struct RegionAdded {
  Region region;
};
struct RegionGone {
  uint64_t handle = 0;
};
struct RegionGoneAck {
  uint64_t handle = 0;
};
struct Notify {
  uint64_t seq = 0;
  std::string name;
  std::string message;
};
struct NotifyAck {
  uint64_t seq = 0;
  int32_t code = 0;
  std::string message;
};

struct RegionAddedAck {
  uint64_t handle = 0;
};

using Message = std::variant<Hello, Welcome, Refused, RegionAdded, RegionGone, RegionGoneAck, Notify, NotifyAck,
                             RegionAddedAck>;

std::string Encode(const Message& m);
Result<Message> Decode(std::span<const uint8_t> bytes);

}  // namespace membroker::detail::wire
