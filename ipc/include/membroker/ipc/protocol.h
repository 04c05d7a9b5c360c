// The one encode/decode layer between C++ messages and the flatbuffers wire
// format (schemas/membroker.fbs). Nothing else in membroker touches flatbuffers.
// Decode verifies every frame before reading any field, in every build type,
// and caps every length.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "membroker/status.h"

namespace membroker::ipc {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kMaxClientNameBytes = 256;
inline constexpr size_t kMaxTokenBytes = 128;
inline constexpr size_t kMaxPidsPerRequest = 1024;
inline constexpr size_t kMaxErrorMessageBytes = 1024;

// Envelope flag: the sender does not wait; the broker answers only on failure.
inline constexpr uint32_t kFlagNoReplyOnSuccess = 1u << 0;

// Malloc flags.
inline constexpr uint32_t kMallocPinned = 1u << 0;
inline constexpr uint32_t kMallocSameAddress = 1u << 1;
inline constexpr uint32_t kMallocKnownFlags = kMallocPinned | kMallocSameAddress;

// Export flags.
inline constexpr uint32_t kExportNoPidCheck = 1u << 0;
inline constexpr uint32_t kExportReadOnly = 1u << 1;
inline constexpr uint32_t kExportKnownFlags = kExportNoPidCheck | kExportReadOnly;

enum class PagePolicy : uint8_t { kNormalOnly = 0, kHugeFirst = 1, kHugeOnly = 2, kHuge1GOnly = 3 };

struct Granularity {
  PagePolicy policy = PagePolicy::kNormalOnly;
  uint64_t minimum = 0;
  uint64_t recommended = 0;
  bool operator==(const Granularity&) const = default;
};

struct HelloRequest {
  std::string client_name;
  uint16_t protocol_version = kProtocolVersion;
  uint64_t features = 0;
  bool operator==(const HelloRequest&) const = default;
};
struct HelloReply {
  uint64_t client_id = 0;
  uint16_t protocol_version = kProtocolVersion;
  uint64_t features = 0;
  std::vector<Granularity> granularities;
  bool operator==(const HelloReply&) const = default;
};
struct MallocRequest {
  uint64_t size = 0;
  PagePolicy policy = PagePolicy::kNormalOnly;
  uint32_t flags = 0;
  bool operator==(const MallocRequest&) const = default;
};
struct MallocReply {  // + the allocation's fd
  uint64_t handle = 0;
  uint64_t size = 0;
  uint64_t page_size = 0;
  bool fell_back = false;
  bool pinned = false;
  uint64_t fixed_address = 0;
  bool from_pool = false;
  bool operator==(const MallocReply&) const = default;
};
struct FreeRequest {
  uint64_t handle = 0;
  bool operator==(const FreeRequest&) const = default;
};
struct ExportRequest {
  uint64_t handle = 0;
  uint32_t flags = 0;
  bool operator==(const ExportRequest&) const = default;
};
struct ExportReply {
  std::string token;
  bool operator==(const ExportReply&) const = default;
};
struct SetPidRequest {
  std::string token;
  std::vector<int32_t> pids;
  bool operator==(const SetPidRequest&) const = default;
};
struct ImportRequest {
  std::string token;
  bool operator==(const ImportRequest&) const = default;
};
struct ImportReply {  // + the allocation's fd
  uint64_t handle = 0;
  uint64_t size = 0;
  uint64_t page_size = 0;
  bool read_only = false;
  bool pinned = false;
  uint64_t fixed_address = 0;
  bool operator==(const ImportReply&) const = default;
};
struct RegisterHostRequest {
  uint64_t address = 0;
  uint64_t size = 0;
  uint32_t flags = 0;
  bool operator==(const RegisterHostRequest&) const = default;
};
struct UnregisterHostRequest {
  uint64_t address = 0;
  bool operator==(const UnregisterHostRequest&) const = default;
};
struct PingRequest {
  bool operator==(const PingRequest&) const = default;
};
struct GoodbyeRequest {
  bool operator==(const GoodbyeRequest&) const = default;
};
struct OkReply {
  bool operator==(const OkReply&) const = default;
};
struct ErrorReply {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

using Message =
    std::variant<HelloRequest, HelloReply, MallocRequest, MallocReply, FreeRequest,
                 ExportRequest, ExportReply, SetPidRequest, ImportRequest, ImportReply,
                 PingRequest, GoodbyeRequest, OkReply, ErrorReply, RegisterHostRequest,
                 UnregisterHostRequest>;

struct Envelope {
  uint16_t protocol_version = kProtocolVersion;
  uint64_t request_id = 0;
  uint32_t flags = 0;
  Message body;
  bool operator==(const Envelope&) const = default;
};

// Serialises env into a self-contained byte buffer (at most kMaxFrameBytes for
// any message whose strings respect the caps above).
std::vector<uint8_t> Encode(const Envelope& env);

// Verifies and decodes one frame. Any malformed, truncated or over-long input
// gives PROTOCOL_ERROR; it never crashes or reads out of bounds.
Result<Envelope> Decode(std::span<const uint8_t> bytes);

// The name of the message type held in body, for logs and errors.
const char* MessageName(const Message& body);

// How many fds a message of this type carries (checked on receipt).
size_t ExpectedFds(const Message& body);

}  // namespace membroker::ipc
