// What two transfer engines on different hosts say to each other, inside UCX
// active messages, once the handshake (handshake.h, on a socket of its own)
// admitted the connector: the acceptor's registered ranges (in Welcome, then one RegionAdded or
// RegionGone per change: each RegionAdded answered once the connector knows
// the range, each RegionGone once it no longer uses it), and notifies with
// their answers. The bytes of transfers travel in data messages of their own
// (DataHeader below), which the acceptor checks against its ranges.
//
// Little-endian, length-prefixed, one message per active message, whose UCX
// header is the receiver's token (kTokenBytes; a data message's header
// continues with its DataHeader). Decode
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

inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kTokenBytes = 16;
inline constexpr size_t kMaxMessageBytes = 4 << 20;
// The UCX active-message ids: every Message, and every data message (DataHeader).
inline constexpr unsigned kAmId = 0x4d42;
inline constexpr unsigned kDataAmId = 0x4d43;

struct Region {
  uint64_t handle = 0;  // the owner's MemHandle
  uint64_t address = 0;
  uint64_t length = 0;
  bool read_only = false;
  std::string name;  // "" or a region name (ipc::kMaxRegionNameBytes)
};
struct Welcome {
  std::string engine;
  std::array<uint8_t, 16> identity{};  // also in its control block: tells a same-host peer
  std::vector<Region> regions;
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
// The sender closes the connection (Disconnect, or its engine finalizes):
// each side's endpoint is its own, so the other would not hear of it otherwise.
struct Goodbye {
  std::string reason;
};

using Message =
    std::variant<Welcome, RegionAdded, RegionGone, RegionGoneAck, Notify, NotifyAck, RegionAddedAck, Goodbye>;

std::string Encode(const Message& m);
Result<Message> Decode(std::span<const uint8_t> bytes);

// A transfer's piece, in the header of a data message (its bytes, if any, in
// the message's data). The connector sends kWrite (bytes for the acceptor's
// address) and kReadRequest (asking for length bytes at address); the
// acceptor answers each with kWriteAck or kReadData (the bytes), code 0 when
// done, else the ErrorCode that refused it (nothing written or sent).
// Small descriptors travel together: kWriteV and kReadV carry `address`
// segments (1 to kMaxSegments) of `length` bytes in all; their data starts
// with the segments' table (EncodeSegments), followed for kWriteV by the
// bytes of each in turn. They are answered as one (kWriteAck, or kReadData
// with the bytes of each segment in turn), all or nothing.
enum class DataKind : uint8_t {
  kWrite = 1,
  kWriteAck = 2,
  kReadRequest = 3,
  kReadData = 4,
  kWriteV = 5,
  kReadV = 6,
};
struct DataHeader {
  DataKind kind = DataKind::kWrite;
  int32_t code = 0;
  uint64_t tag = 0;      // the connector's name for the piece, echoed in the answer
  uint64_t address = 0;  // in the acceptor's memory
  uint64_t length = 0;   // bytes written, asked for, acknowledged or carried
};
inline constexpr size_t kDataHeaderBytes = 1 + 4 + 8 * 3;
using EncodedDataHeader = std::array<uint8_t, kDataHeaderBytes>;

EncodedDataHeader EncodeData(const DataHeader& h);
// The UCX header of a data message: the receiver's token, then the DataHeader.
using RoutedDataHeader = std::array<uint8_t, kTokenBytes + kDataHeaderBytes>;
RoutedDataHeader EncodeRouted(const std::array<uint8_t, kTokenBytes>& token, const DataHeader& h);
// Checks the size, the kind, that a range does not wrap, and a batch's count.
Result<DataHeader> DecodeData(std::span<const uint8_t> bytes);

inline constexpr size_t kMaxSegments = 256;
inline constexpr size_t kSegmentBytes = 16;
struct Segment {
  uint64_t address = 0;
  uint64_t length = 0;
};
std::string EncodeSegments(const std::vector<Segment>& segments);
// `count` segments from the table at the start of bytes: none empty or
// wrapping, their lengths summing to `total`.
Result<std::vector<Segment>> DecodeSegments(std::span<const uint8_t> bytes, size_t count, uint64_t total);

}  // namespace membroker::detail::wire
