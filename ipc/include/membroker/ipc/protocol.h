// The one encode/decode layer between C++ messages and the flatbuffers wire
// format (schemas/membroker.fbs). Nothing else in membroker touches flatbuffers.
// Decode verifies every frame before reading any field, in every build type,
// and caps every length.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "membroker/ipc/kv_keys.h"
#include "membroker/ipc/page_policy.h"
#include "membroker/ipc/messages.h"
#include "membroker/status.h"

namespace membroker::ipc {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kMaxClientNameBytes = 256;
inline constexpr size_t kMaxTokenBytes = 128;
inline constexpr size_t kMaxPidsPerRequest = 1024;
inline constexpr size_t kMaxErrorMessageBytes = 1024;
inline constexpr size_t kMaxEngineNameBytes = 128;
inline constexpr size_t kMaxEngineRegions = 512;        // per engine; one reply lists them all
inline constexpr size_t kMaxNotifyNameBytes = 128;
inline constexpr size_t kMaxNotifyMessageBytes = 1024;
inline constexpr size_t kMaxNotifiesPerReply = 32;
inline constexpr size_t kMaxObjectNameBytes = 256;
inline constexpr size_t kMaxNamesPerReply = 128;
inline constexpr size_t kMaxEventsPerReply = 64;
inline constexpr size_t kMaxObjectMetadataBytes = 4096;  // a named object's (a tensor's dtype, shape...)
inline constexpr size_t kMaxEnginePeers = 63;  // = kEngineSlots (engine_control.h)
inline constexpr size_t kMaxKvStoreNameBytes = 128;
inline constexpr size_t kMaxKvKeyBytes = 64;
inline constexpr size_t kMaxKvBatch = 256;  // keys, seals or refs in one request

// Publish flags.
inline constexpr uint32_t kPublishReadOnly = 1u << 0;
inline constexpr uint32_t kPublishPersist = 1u << 1;
inline constexpr uint32_t kPublishReplace = 1u << 2;
inline constexpr uint32_t kPublishCluster = 1u << 3;  // listed in the host's cluster record
inline constexpr uint32_t kPublishKnownFlags = kPublishReadOnly | kPublishPersist | kPublishReplace | kPublishCluster;

// Envelope flag: the sender does not wait; the broker answers only on failure.
inline constexpr uint32_t kFlagNoReplyOnSuccess = 1u << 0;

// Malloc flags.
inline constexpr uint32_t kMallocPinned = 1u << 0;
inline constexpr uint32_t kMallocSameAddress = 1u << 1;
inline constexpr uint32_t kMallocExport = 1u << 2;  // export it too (export_flags), token in the reply
inline constexpr uint32_t kMallocKnownFlags = kMallocPinned | kMallocSameAddress | kMallocExport;

// Export flags.
inline constexpr uint32_t kExportNoPidCheck = 1u << 0;
inline constexpr uint32_t kExportReadOnly = 1u << 1;
inline constexpr uint32_t kExportKnownFlags = kExportNoPidCheck | kExportReadOnly;


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
  std::string host;  // this host's name in its cluster; empty without one
  bool operator==(const HelloReply&) const = default;
};
struct MallocRequest {
  uint64_t size = 0;
  PagePolicy policy = PagePolicy::kNormalOnly;
  uint32_t flags = 0;
  uint32_t export_flags = 0;
  int32_t device = -1;  // -1: host memory; N: device N
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
  std::string token;
  int32_t device = -1;  // CUDA device memory, or -1
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
  std::string metadata;  // a named object's, for lookups
  int32_t device = -1;   // CUDA device memory, or -1
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
struct EngineInitRequest {
  std::string name;
  uint64_t control_allocation = 0;
  bool restoring = false;  // hidden from Connect until initialised again without it
  bool operator==(const EngineInitRequest&) const = default;
};
struct EngineFinalizeRequest {
  bool operator==(const EngineFinalizeRequest&) const = default;
};
inline constexpr size_t kMaxRegionNameBytes = 32;  // 512 named regions still fit one EngineInfoReply frame
struct EngineRegisterRequest {
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t allocation = 0;  // 0: the engine's own HostRegister'ed memory
  uint64_t offset = 0;
  std::string name;         // optional: how peers find the range (RegionInfo)
  bool operator==(const EngineRegisterRequest&) const = default;
};
struct EngineRegisterReply {
  uint64_t region = 0;
  bool operator==(const EngineRegisterReply&) const = default;
};
struct EngineDeregisterRequest {
  uint64_t region = 0;
  bool operator==(const EngineDeregisterRequest&) const = default;
};
struct EngineConnectRequest {
  std::string remote;
  uint32_t timeout_ms = 0;
  bool operator==(const EngineConnectRequest&) const = default;
};
struct EngineRegionsRequest {
  std::string remote;
  bool operator==(const EngineRegionsRequest&) const = default;
};
struct EngineRegion {
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t allocation = 0;
  uint64_t offset = 0;
  bool read_only = false;
  std::string name;
  bool operator==(const EngineRegion&) const = default;
};
struct EngineInfoReply {
  int32_t pid = 0;
  uint32_t slot = 0;
  uint64_t control_allocation = 0;
  std::vector<EngineRegion> regions;
  bool operator==(const EngineInfoReply&) const = default;
};
struct EngineImportRequest {  // answered by ImportReply + fd
  std::string remote;
  uint64_t allocation = 0;
  bool operator==(const EngineImportRequest&) const = default;
};
struct EngineReleaseRequest {
  uint64_t allocation = 0;
  bool operator==(const EngineReleaseRequest&) const = default;
};
struct EngineDisconnectRequest {
  std::string remote;
  bool operator==(const EngineDisconnectRequest&) const = default;
};
struct EngineNotifyRequest {
  std::string remote;
  std::string name;
  std::string message;
  bool operator==(const EngineNotifyRequest&) const = default;
};
struct EngineNotify {
  std::string from;
  std::string name;
  std::string message;
  bool operator==(const EngineNotify&) const = default;
};
struct EngineGetNotifiesRequest {
  bool operator==(const EngineGetNotifiesRequest&) const = default;
};
struct EngineNotifiesReply {
  std::vector<EngineNotify> notifies;
  uint64_t dropped = 0;
  bool operator==(const EngineNotifiesReply&) const = default;
};
struct PublishRequest {
  std::string name;
  uint64_t allocation = 0;
  uint32_t flags = 0;
  std::string metadata;
  bool operator==(const PublishRequest&) const = default;
};
struct LookupRequest {  // answered by ImportReply + fd
  std::string name;
  uint32_t timeout_ms = 0;
  bool operator==(const LookupRequest&) const = default;
};
struct UnpublishRequest {
  std::string name;
  bool operator==(const UnpublishRequest&) const = default;
};
struct ListNamesRequest {
  std::string prefix;
  std::string after;  // only names after this one (the next page); empty: from the first
  bool operator==(const ListNamesRequest&) const = default;
};
struct NamedObject {
  std::string name;
  uint64_t allocation = 0;
  uint64_t size = 0;
  bool read_only = false;
  bool persist = false;
  int32_t publisher_pid = 0;
  bool operator==(const NamedObject&) const = default;
};
struct ListNamesReply {
  std::vector<NamedObject> objects;
  bool truncated = false;
  bool operator==(const ListNamesReply&) const = default;
};
struct SubscribeRequest {
  std::string prefix;
  bool cluster = false;
  bool operator==(const SubscribeRequest&) const = default;
};
struct WaitEventsRequest {
  uint32_t timeout_ms = 0;
  bool operator==(const WaitEventsRequest&) const = default;
};
enum class NameEventKind : uint8_t { kPublished = 0, kUnpublished = 1, kHolderDied = 2, kHostGone = 3 };
struct NameEvent {
  NameEventKind kind = NameEventKind::kPublished;
  std::string name;
  uint64_t allocation = 0;
  int32_t pid = 0;
  std::string host;  // another host's, for a cluster subscription; empty: this host's
  bool operator==(const NameEvent&) const = default;
};
struct EventsReply {
  std::vector<NameEvent> events;
  uint64_t dropped = 0;
  bool operator==(const EventsReply&) const = default;
};
struct EnginePeersRequest {
  bool operator==(const EnginePeersRequest&) const = default;
};
struct EnginePeer {
  uint32_t slot = 0;
  int32_t pid = 0;
  bool operator==(const EnginePeer&) const = default;
};
struct EnginePeersReply {
  std::vector<EnginePeer> peers;
  bool operator==(const EnginePeersReply&) const = default;
};
struct PingRequest {
  bool operator==(const PingRequest&) const = default;
};
// HelloRequest features: this connection re-presents what a client held
// before the broker restarted (ReattachRequest, RestoreExportRequest follow).
inline constexpr uint64_t kFeatureReattach = 1u << 0;
// Handles per ReattachRequest (each with its fd).
inline constexpr size_t kMaxReattachHandles = 64;
struct ReattachHandle {
  uint64_t handle = 0;
  bool created = false;
  bool pinned = false;
  uint64_t fixed_address = 0;
  bool operator==(const ReattachHandle&) const = default;
};
struct ReattachRequest {  // + one fd per handle
  std::vector<ReattachHandle> handles;
  bool operator==(const ReattachRequest&) const = default;
};
struct ReattachResult {
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  bool pinned = false;
  bool operator==(const ReattachResult&) const = default;
};
struct ReattachReply {
  std::vector<ReattachResult> results;
  bool operator==(const ReattachReply&) const = default;
};
struct AllowedPid {
  int32_t pid = 0;
  uint64_t start_time = 0;
  bool operator==(const AllowedPid&) const = default;
};
// Between two brokers, at a take-over (broker/restart/takeover.h).
struct TakeOverHello {
  int32_t pid = 0;
  bool operator==(const TakeOverHello&) const = default;
};
struct TakeOverSockets {  // + the listening client socket
  bool operator==(const TakeOverSockets&) const = default;
};
struct TakeOverAllocation {
  uint64_t id = 0;
  uint64_t page_size = 0;
  PagePolicy policy = PagePolicy::kNormalOnly;
  bool pinned = false;
  bool fell_back = false;
  uint64_t fixed_address = 0;
  uint32_t creator_uid = 0;
  bool operator==(const TakeOverAllocation&) const = default;
};
struct TakeOverAllocations {  // + one fd per entry
  std::vector<TakeOverAllocation> handles;
  bool operator==(const TakeOverAllocations&) const = default;
};
struct TakeOverExport {
  std::string token;
  uint64_t allocation = 0;
  uint32_t exporter_uid = 0;
  uint32_t flags = 0;
  std::vector<AllowedPid> pids;
  bool operator==(const TakeOverExport&) const = default;
};
struct TakeOverName {
  std::string name;
  uint64_t allocation = 0;
  uint32_t flags = 0;
  uint32_t uid = 0;
  int32_t publisher_pid = 0;
  std::string metadata;
  bool operator==(const TakeOverName&) const = default;
};
struct TakeOverEnd {
  uint64_t allocations = 0, exports = 0, names = 0, kv_stores = 0;
  bool operator==(const TakeOverEnd&) const = default;
};
struct TakeOverKvStore {  // + one fd per entry
  uint64_t store = 0;
  std::vector<uint32_t> handles;  // the schema's `parts`: 0 the index, N + 1 slab N
  bool operator==(const TakeOverKvStore&) const = default;
};
struct TakeOverKvDisk {  // + the disk tier's directory, locked
  bool operator==(const TakeOverKvDisk&) const = default;
};
struct TakeOverAck {
  bool operator==(const TakeOverAck&) const = default;
};
struct EngineResolveRequest {
  std::string remote;
  uint32_t timeout_ms = 0;
  bool operator==(const EngineResolveRequest&) const = default;
};
struct EngineResolveReply {
  std::string host;  // empty: this host's broker has it (or has no cluster)
  uint64_t generation = 0;
  std::string address;  // "IP:PORT" where it listens, when host is another
  bool operator==(const EngineResolveReply&) const = default;
};
struct ClusterLookupRequest {
  std::string name;
  uint32_t timeout_ms = 0;
  bool operator==(const ClusterLookupRequest&) const = default;
};
struct ClusterLookupReply {
  std::string host;
  uint64_t generation = 0;
  uint64_t size = 0;
  bool read_only = false;
  std::string metadata;
  uint64_t allocation = 0;  // the object's id at its host's broker
  bool operator==(const ClusterLookupReply&) const = default;
};
inline constexpr size_t kMaxNetAddressBytes = 64;
inline constexpr size_t kMaxHostNameBytes = 64;  // a cluster's host names (docs/CLUSTER.md)
inline constexpr size_t kMaxNetTransportsBytes = 256;
inline constexpr size_t kMaxNetConnections = 128;
struct EngineNetConnection {
  std::string remote;
  std::string engine;
  std::string path;
  std::string transports;
  bool operator==(const EngineNetConnection&) const = default;
};
struct EngineNetworkRequest {
  std::string listen_address;
  uint64_t accepted = 0;
  uint64_t refused = 0;
  uint64_t inbound = 0;
  std::vector<EngineNetConnection> connections;
  bool operator==(const EngineNetworkRequest&) const = default;
};
struct WakeRequest {
  bool operator==(const WakeRequest&) const = default;
};
struct RestoreExportRequest {
  uint64_t handle = 0;
  std::string token;
  uint32_t flags = 0;
  std::vector<AllowedPid> pids;
  bool operator==(const RestoreExportRequest&) const = default;
};
// KV-cache stores (docs/KV.md).
struct KvOpenRequest {
  std::string name;
  bool create = false;
  uint64_t block_size = 0;
  uint64_t capacity = 0;
  PagePolicy policy = PagePolicy::kNormalOnly;
  uint8_t eviction = 0;  // 0: S3-FIFO, 1: LRU
  bool operator==(const KvOpenRequest&) const = default;
};
struct KvStoreReply {
  uint64_t store = 0;
  uint64_t block_size = 0;
  uint64_t blocks = 0;
  uint64_t slab_blocks = 0;
  uint32_t slabs = 0;
  bool operator==(const KvStoreReply&) const = default;
};
struct KvSlabRequest {
  uint64_t store = 0;
  uint32_t slab = 0;
  bool operator==(const KvSlabRequest&) const = default;
};
struct KvSlabReply {
  uint64_t size = 0;
  bool operator==(const KvSlabReply&) const = default;
};
struct KvRef {
  uint64_t slot = 0;
  uint64_t generation = 0;
  bool operator==(const KvRef&) const = default;
};
struct KvReserveRequest {
  uint64_t store = 0;
  KvKeys keys;
  bool operator==(const KvReserveRequest&) const = default;
};
struct KvSeal {
  uint64_t slot = 0;
  uint64_t generation = 0;
  uint64_t allocation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const KvSeal&) const = default;
};
struct KvSealRequest {
  uint64_t store = 0;
  std::vector<KvSeal> blocks;
  bool operator==(const KvSealRequest&) const = default;
};
struct KvAbortRequest {
  uint64_t store = 0;
  std::vector<KvRef> refs;
  bool operator==(const KvAbortRequest&) const = default;
};
struct KvGetRequest {
  uint64_t store = 0;
  KvKeys keys;
  bool lease = false;
  bool operator==(const KvGetRequest&) const = default;
};
struct KvReleaseRequest {
  uint64_t store = 0;
  std::vector<KvRef> refs;
  bool operator==(const KvReleaseRequest&) const = default;
};
struct KvBlock {
  ErrorCode code = ErrorCode::kOk;
  uint64_t slot = 0;
  uint64_t generation = 0;
  uint64_t length = 0;
  bool operator==(const KvBlock&) const = default;
};
struct KvBlocksReply {
  std::vector<KvBlock> blocks;
  uint32_t leading = 0;
  bool operator==(const KvBlocksReply&) const = default;
};
struct KvDropRequest {
  std::string name;
  bool operator==(const KvDropRequest&) const = default;
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

namespace detail {
template <typename First, typename... Rest>
struct VariantOfRest {
  using type = std::variant<Rest...>;
};
}  // namespace detail

// Every message, in the order of messages.h (= the schema's union, checked in
// protocol.cc): Message's index + 1 is the wire union type.
#define MEMBROKER_COMMA_TYPE(T, direction, fds) , T
using Message = detail::VariantOfRest<void MEMBROKER_MESSAGES(MEMBROKER_COMMA_TYPE)>::type;
#undef MEMBROKER_COMMA_TYPE

// The index of T in Message, at compile time.
template <typename T, size_t I = 0>
constexpr size_t MessageIndex() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Message>, T>)
    return I;
  else
    return MessageIndex<T, I + 1>();
}

enum class Direction : uint8_t { kRequest, kReply };
// Each message's direction and fd count, from the list.
template <typename T>
inline constexpr Direction kDirectionOf = Direction::kRequest;
// A message whose fds are one per element of its `handles` (messages.h).
inline constexpr size_t kOneFdPerEntry = SIZE_MAX;
template <typename T>
inline constexpr size_t kFdsOf = 0;
#define MEMBROKER_TRAITS(T, direction, fds)                                 \
  template <>                                                               \
  inline constexpr Direction kDirectionOf<T> = Direction::k##direction;     \
  template <>                                                               \
  inline constexpr size_t kFdsOf<T> = fds;
MEMBROKER_MESSAGES(MEMBROKER_TRAITS)
#undef MEMBROKER_TRAITS

template <typename T>
inline constexpr bool kIsRequest = kDirectionOf<T> == Direction::kRequest;

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
// Encode of {kProtocolVersion, request_id, flags, body} with a builder it
// keeps: a message costs no allocation, and body is not copied into an
// Envelope. The bytes returned stay in the encoder's buffer until its next
// call: send them, or copy them to keep them. One per sender, used by one
// thread at a time (a client's connection encodes under its send lock; the
// broker on its loop).
class MessageEncoder {
 public:
  MessageEncoder();
  ~MessageEncoder();
  MessageEncoder(const MessageEncoder&) = delete;
  MessageEncoder& operator=(const MessageEncoder&) = delete;
  std::span<const uint8_t> operator()(uint64_t request_id, uint32_t flags, const Message& body);

 private:
  struct Builder;
  std::unique_ptr<Builder> builder_;
};
// Encode, with a KV batch's keys as a table each, as clients before packed
// keys sent them (a broker reads both; tests and the fuzz seeds write this).
std::vector<uint8_t> EncodeWithKeyTables(const Envelope& env);

// Verifies and decodes one frame. Any malformed, truncated or over-long input
// gives PROTOCOL_ERROR; it never crashes or reads out of bounds.
Result<Envelope> Decode(std::span<const uint8_t> bytes);

// The name of the message type held in body, for logs and errors.
const char* MessageName(const Message& body);

// How many fds a message of this type carries (checked on receipt).
size_t ExpectedFds(const Message& body);

// Whether a client may send it (the rest are the broker's replies).
bool IsRequest(const Message& body);

// The Status an ErrorReply stands for: the one conversion, used wherever a
// reply is read. Ok for any other message.
Status StatusOf(const Message& body);

}  // namespace membroker::ipc
