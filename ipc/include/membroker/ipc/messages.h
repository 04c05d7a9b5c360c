// The one message list. Each line names a message's C++ type (protocol.h), its
// direction and how many fds travel with it. Everything else is derived from
// it: the order of ipc::Message's alternatives (checked against the schema's
// union at compile time), MessageName, ExpectedFds, IsRequest, Encode and
// Decode's dispatch, and the broker's (a request without a handler does not
// compile).
//
// A new message: its table in schemas/membroker.fbs (appended to the union),
// its struct in protocol.h, a line here, one Write and one Read function in
// protocol.cc, and - for a request - one Broker::Handle overload.
#pragma once

// X(Type, Direction, fds): Direction is Request (client -> broker) or Reply;
// fds kOneFdPerEntry: one per element of the message's `handles`. The
// TakeOver messages pass between two brokers (broker/restart/takeover.h), never on the
// client socket: they are "replies" so that no client may send them.
#define MEMBROKER_MESSAGES(X)           \
  X(HelloRequest, Request, 0)           \
  X(HelloReply, Reply, 0)               \
  X(MallocRequest, Request, 0)          \
  X(MallocReply, Reply, 1)              \
  X(FreeRequest, Request, 0)            \
  X(ExportRequest, Request, 0)          \
  X(ExportReply, Reply, 0)              \
  X(SetPidRequest, Request, 0)          \
  X(ImportRequest, Request, 0)          \
  X(ImportReply, Reply, 1)              \
  X(PingRequest, Request, 0)            \
  X(GoodbyeRequest, Request, 0)         \
  X(OkReply, Reply, 0)                  \
  X(ErrorReply, Reply, 0)               \
  X(RegisterHostRequest, Request, 0)    \
  X(UnregisterHostRequest, Request, 0)  \
  X(EngineInitRequest, Request, 0)      \
  X(EngineFinalizeRequest, Request, 0)  \
  X(EngineRegisterRequest, Request, 0)  \
  X(EngineRegisterReply, Reply, 0)      \
  X(EngineDeregisterRequest, Request, 0) \
  X(EngineConnectRequest, Request, 0)   \
  X(EngineRegionsRequest, Request, 0)   \
  X(EngineInfoReply, Reply, 0)          \
  X(EngineImportRequest, Request, 0)    \
  X(EngineReleaseRequest, Request, 0)   \
  X(EngineDisconnectRequest, Request, 0) \
  X(EngineNotifyRequest, Request, 0)    \
  X(EngineGetNotifiesRequest, Request, 0) \
  X(EngineNotifiesReply, Reply, 0)      \
  X(PublishRequest, Request, 0)         \
  X(LookupRequest, Request, 0)          \
  X(UnpublishRequest, Request, 0)       \
  X(ListNamesRequest, Request, 0)       \
  X(ListNamesReply, Reply, 0)           \
  X(SubscribeRequest, Request, 0)       \
  X(WaitEventsRequest, Request, 0)      \
  X(EventsReply, Reply, 0)              \
  X(EnginePeersRequest, Request, 0)     \
  X(EnginePeersReply, Reply, 0)         \
  X(ReattachRequest, Request, kOneFdPerEntry) \
  X(ReattachReply, Reply, 0)            \
  X(RestoreExportRequest, Request, 0)   \
  X(TakeOverHello, Reply, 0)          \
  X(TakeOverSockets, Reply, 1)          \
  X(TakeOverAllocations, Reply, kOneFdPerEntry) \
  X(TakeOverExport, Reply, 0)           \
  X(TakeOverName, Reply, 0)             \
  X(TakeOverEnd, Reply, 0)              \
  X(TakeOverAck, Reply, 0)              \
  X(EngineNetworkRequest, Request, 0)   \
  X(WakeRequest, Request, 1)            \
  X(KvOpenRequest, Request, 0)          \
  X(KvStoreReply, Reply, 0)             \
  X(KvSlabRequest, Request, 0)          \
  X(KvSlabReply, Reply, 1)              \
  X(KvReserveRequest, Request, 0)       \
  X(KvSealRequest, Request, 0)          \
  X(KvAbortRequest, Request, 0)         \
  X(KvGetRequest, Request, 0)           \
  X(KvReleaseRequest, Request, 0)       \
  X(KvBlocksReply, Reply, 0)            \
  X(KvDropRequest, Request, 0)         \
  X(TakeOverKvStore, Reply, kOneFdPerEntry) \
  X(TakeOverKvDisk, Reply, 1)           \
  X(EngineResolveRequest, Request, 0)   \
  X(EngineResolveReply, Reply, 0)       \
  X(ClusterLookupRequest, Request, 0)   \
  X(ClusterLookupReply, Reply, 0)

// MEMBROKER_IF_##Direction(...): its arguments for requests, nothing for
// replies; so a list walk can declare something for requests only.
#define MEMBROKER_IF_Request(...) __VA_ARGS__
#define MEMBROKER_IF_Reply(...)
