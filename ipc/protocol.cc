#include "membroker/ipc/protocol.h"

#include <flatbuffers/flatbuffers.h>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/framing.h"
#include "membroker_generated.h"

namespace membroker::ipc {

namespace fb = flatbuffers;
namespace w = membroker::wire;

// Every code of status.h's list is the schema's code of the same name and
// value, and the schema has no other.
#define MEMBROKER_ERROR_MATCHES_SCHEMA(value, enumerator, wire, py)                                   \
  static_assert(static_cast<int>(w::ErrorCode_##wire) == value && static_cast<int>(ErrorCode::enumerator) == value, \
                "status.h's " #enumerator " is not the schema's " #wire);
MEMBROKER_ERROR_CODES(MEMBROKER_ERROR_MATCHES_SCHEMA)
#undef MEMBROKER_ERROR_MATCHES_SCHEMA
#define MEMBROKER_ERROR_COUNT(value, enumerator, wire, py) +1
static_assert(static_cast<int>(w::ErrorCode_MAX) + 1 == 0 MEMBROKER_ERROR_CODES(MEMBROKER_ERROR_COUNT),
              "the schema's ErrorCode has codes status.h does not list");
#undef MEMBROKER_ERROR_COUNT
static_assert(static_cast<int>(w::PagePolicy_MAX) == static_cast<int>(PagePolicy::kHuge1GOnly));
static_assert(static_cast<int>(w::PagePolicy_HUGE_FIRST) == static_cast<int>(PagePolicy::kHugeFirst));
static_assert(static_cast<int>(w::NameEventKind_MAX) == static_cast<int>(NameEventKind::kHostGone));
static_assert(static_cast<int>(w::NameEventKind_UNPUBLISHED) == static_cast<int>(NameEventKind::kUnpublished));
static_assert(static_cast<int>(w::NameEventKind_HOST_GONE) == static_cast<int>(NameEventKind::kHostGone));
// The flag constants of protocol.h are the schema's bits.
static_assert(kMallocPinned == w::MallocFlags_PINNED && kMallocSameAddress == w::MallocFlags_SAME_ADDRESS &&
              kMallocExport == w::MallocFlags_EXPORT && kMallocKnownFlags == w::MallocFlags_ANY);
static_assert(kExportNoPidCheck == w::ExportFlags_NO_PID_CHECK && kExportReadOnly == w::ExportFlags_READ_ONLY &&
              kExportKnownFlags == w::ExportFlags_ANY);
static_assert(kPublishReadOnly == w::PublishFlags_READ_ONLY && kPublishPersist == w::PublishFlags_PERSIST &&
              kPublishReplace == w::PublishFlags_REPLACE && kPublishCluster == w::PublishFlags_CLUSTER &&
              kPublishKnownFlags == w::PublishFlags_ANY);
static_assert(kFlagNoReplyOnSuccess == w::EnvelopeFlags_NO_REPLY_ON_SUCCESS);

namespace {

struct Encoder {
  fb::FlatBufferBuilder& b;
  bool key_tables = false;  // a KV batch's keys as clients before packed keys sent them

  fb::Offset<void> operator()(const HelloRequest& m) {
    auto name = b.CreateString(m.client_name);
    return w::CreateHelloRequest(b, name, m.protocol_version, m.features).Union();
  }
  fb::Offset<void> operator()(const HelloReply& m) {
    std::vector<fb::Offset<w::Granularity>> gs;
    for (const auto& g : m.granularities)
      gs.push_back(w::CreateGranularity(b, static_cast<w::PagePolicy>(g.policy), g.minimum,
                                        g.recommended));
    auto vec = b.CreateVector(gs);
    auto host = b.CreateString(m.host);
    return w::CreateHelloReply(b, m.client_id, m.protocol_version, m.features, vec, host).Union();
  }
  fb::Offset<void> operator()(const MallocRequest& m) {
    return w::CreateMallocRequest(b, m.size, static_cast<w::PagePolicy>(m.policy),
                                  static_cast<w::MallocFlags>(m.flags),
                                  static_cast<w::ExportFlags>(m.export_flags), m.device)
                .Union();
  }
  fb::Offset<void> operator()(const MallocReply& m) {
    auto token = m.token.empty() ? fb::Offset<fb::String>() : b.CreateString(m.token);
    return w::CreateMallocReply(b, m.handle, m.size, m.page_size, m.fell_back, m.pinned, m.fixed_address, m.from_pool,
                                token, m.device)
        .Union();
  }
  fb::Offset<void> operator()(const FreeRequest& m) {
    return w::CreateFreeRequest(b, m.handle).Union();
  }
  fb::Offset<void> operator()(const ExportRequest& m) {
    return w::CreateExportRequest(b, m.handle, static_cast<w::ExportFlags>(m.flags)).Union();
  }
  fb::Offset<void> operator()(const ExportReply& m) {
    auto t = b.CreateString(m.token);
    return w::CreateExportReply(b, t).Union();
  }
  fb::Offset<void> operator()(const SetPidRequest& m) {
    auto t = b.CreateString(m.token);
    auto p = b.CreateVector(m.pids);
    return w::CreateSetPidRequest(b, t, p).Union();
  }
  fb::Offset<void> operator()(const ImportRequest& m) {
    auto t = b.CreateString(m.token);
    return w::CreateImportRequest(b, t).Union();
  }
  fb::Offset<void> operator()(const ImportReply& m) {
    auto meta = m.metadata.empty() ? fb::Offset<fb::Vector<uint8_t>>()
                                   : b.CreateVector(reinterpret_cast<const uint8_t*>(m.metadata.data()),
                                                    m.metadata.size());
    return w::CreateImportReply(b, m.handle, m.size, m.page_size, m.read_only, m.pinned, m.fixed_address, meta,
                                m.device)
        .Union();
  }
  fb::Offset<void> operator()(const PingRequest&) {
    return w::CreatePingRequest(b).Union();
  }
  fb::Offset<void> operator()(const GoodbyeRequest&) {
    return w::CreateGoodbyeRequest(b).Union();
  }
  fb::Offset<void> operator()(const OkReply&) {
    return w::CreateOkReply(b).Union();
  }
  fb::Offset<void> operator()(const RegisterHostRequest& m) {
    return w::CreateRegisterHostRequest(b, m.address, m.size, m.flags).Union();
  }
  fb::Offset<void> operator()(const UnregisterHostRequest& m) {
    return w::CreateUnregisterHostRequest(b, m.address).Union();
  }
  fb::Offset<void> operator()(const EngineInitRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateEngineInitRequest(b, n, m.control_allocation, m.restoring).Union();
  }
  fb::Offset<void> operator()(const EngineFinalizeRequest&) {
    return w::CreateEngineFinalizeRequest(b).Union();
  }
  fb::Offset<void> operator()(const EngineRegisterRequest& m) {
    auto name = m.name.empty() ? fb::Offset<fb::String>() : b.CreateString(m.name);
    return w::CreateEngineRegisterRequest(b, m.address, m.length, m.allocation, m.offset, name).Union();
  }
  fb::Offset<void> operator()(const EngineRegisterReply& m) {
    return w::CreateEngineRegisterReply(b, m.region).Union();
  }
  fb::Offset<void> operator()(const EngineDeregisterRequest& m) {
    return w::CreateEngineDeregisterRequest(b, m.region).Union();
  }
  fb::Offset<void> operator()(const EngineConnectRequest& m) {
    auto r = b.CreateString(m.remote);
    return w::CreateEngineConnectRequest(b, r, m.timeout_ms).Union();
  }
  fb::Offset<void> operator()(const EngineRegionsRequest& m) {
    auto r = b.CreateString(m.remote);
    return w::CreateEngineRegionsRequest(b, r).Union();
  }
  fb::Offset<void> operator()(const EngineInfoReply& m) {
    std::vector<fb::Offset<w::EngineRegion>> rs;
    for (const auto& r : m.regions) {
      auto name = r.name.empty() ? fb::Offset<fb::String>() : b.CreateString(r.name);
      rs.push_back(w::CreateEngineRegion(b, r.id, r.address, r.length, r.allocation, r.offset, r.read_only, name));
    }
    auto vec = b.CreateVector(rs);
    return w::CreateEngineInfoReply(b, m.pid, m.slot, m.control_allocation, vec).Union();
  }
  fb::Offset<void> operator()(const EngineImportRequest& m) {
    auto r = b.CreateString(m.remote);
    return w::CreateEngineImportRequest(b, r, m.allocation).Union();
  }
  fb::Offset<void> operator()(const EngineReleaseRequest& m) {
    return w::CreateEngineReleaseRequest(b, m.allocation).Union();
  }
  fb::Offset<void> operator()(const EngineDisconnectRequest& m) {
    auto r = b.CreateString(m.remote);
    return w::CreateEngineDisconnectRequest(b, r).Union();
  }
  fb::Offset<void> operator()(const EngineNotifyRequest& m) {
    auto r = b.CreateString(m.remote);
    auto n = b.CreateString(m.name);
    auto msg = b.CreateString(m.message);
    return w::CreateEngineNotifyRequest(b, r, n, msg).Union();
  }
  fb::Offset<void> operator()(const EngineGetNotifiesRequest&) {
    return w::CreateEngineGetNotifiesRequest(b).Union();
  }
  fb::Offset<void> operator()(const EngineNotifiesReply& m) {
    std::vector<fb::Offset<w::EngineNotify>> ns;
    for (const auto& n : m.notifies) {
      auto f = b.CreateString(n.from);
      auto nm = b.CreateString(n.name);
      auto msg = b.CreateString(n.message);
      ns.push_back(w::CreateEngineNotify(b, f, nm, msg));
    }
    auto vec = b.CreateVector(ns);
    return w::CreateEngineNotifiesReply(b, vec, m.dropped).Union();
  }
  fb::Offset<void> operator()(const PublishRequest& m) {
    auto n = b.CreateString(m.name);
    auto meta = m.metadata.empty() ? fb::Offset<fb::Vector<uint8_t>>()
                                   : b.CreateVector(reinterpret_cast<const uint8_t*>(m.metadata.data()),
                                                    m.metadata.size());
    return w::CreatePublishRequest(b, n, m.allocation, static_cast<w::PublishFlags>(m.flags), meta).Union();
  }
  fb::Offset<void> operator()(const LookupRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateLookupRequest(b, n, m.timeout_ms).Union();
  }
  fb::Offset<void> operator()(const UnpublishRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateUnpublishRequest(b, n).Union();
  }
  fb::Offset<void> operator()(const ListNamesRequest& m) {
    auto p = b.CreateString(m.prefix);
    auto a = b.CreateString(m.after);
    return w::CreateListNamesRequest(b, p, a).Union();
  }
  fb::Offset<void> operator()(const ListNamesReply& m) {
    std::vector<fb::Offset<w::NamedObject>> os;
    for (const auto& o : m.objects) {
      auto n = b.CreateString(o.name);
      os.push_back(w::CreateNamedObject(b, n, o.allocation, o.size, o.read_only, o.persist,
                                        o.publisher_pid));
    }
    auto vec = b.CreateVector(os);
    return w::CreateListNamesReply(b, vec, m.truncated).Union();
  }
  fb::Offset<void> operator()(const SubscribeRequest& m) {
    auto p = b.CreateString(m.prefix);
    return w::CreateSubscribeRequest(b, p, m.cluster).Union();
  }
  fb::Offset<void> operator()(const WaitEventsRequest& m) {
    return w::CreateWaitEventsRequest(b, m.timeout_ms).Union();
  }
  fb::Offset<void> operator()(const EventsReply& m) {
    std::vector<fb::Offset<w::NameEvent>> es;
    for (const auto& e : m.events) {
      auto n = b.CreateString(e.name);
      auto h = e.host.empty() ? fb::Offset<fb::String>() : b.CreateString(e.host);
      es.push_back(w::CreateNameEvent(b, static_cast<w::NameEventKind>(e.kind), n, e.allocation, e.pid, h));
    }
    auto vec = b.CreateVector(es);
    return w::CreateEventsReply(b, vec, m.dropped).Union();
  }
  fb::Offset<void> operator()(const EnginePeersRequest&) {
    return w::CreateEnginePeersRequest(b).Union();
  }
  fb::Offset<void> operator()(const EnginePeersReply& m) {
    std::vector<fb::Offset<w::EnginePeer>> ps;
    for (const auto& p : m.peers) ps.push_back(w::CreateEnginePeer(b, p.slot, p.pid));
    return w::CreateEnginePeersReply(b, b.CreateVector(ps)).Union();
  }
  fb::Offset<void> operator()(const ReattachRequest& m) {
    std::vector<fb::Offset<w::ReattachHandle>> hs;
    for (const auto& h : m.handles)
      hs.push_back(w::CreateReattachHandle(b, h.handle, h.created, h.pinned, h.fixed_address));
    return w::CreateReattachRequest(b, b.CreateVector(hs)).Union();
  }
  fb::Offset<void> operator()(const ReattachReply& m) {
    std::vector<fb::Offset<w::ReattachResult>> rs;
    for (const auto& r : m.results) {
      auto msg = r.message.empty() ? fb::Offset<fb::String>()
                                   : b.CreateString(r.message.substr(0, kMaxErrorMessageBytes));
      rs.push_back(w::CreateReattachResult(b, static_cast<w::ErrorCode>(r.code), msg, r.pinned));
    }
    return w::CreateReattachReply(b, b.CreateVector(rs)).Union();
  }
  // An export's allowed processes (RestoreExportRequest, TakeOverExport).
  fb::Offset<fb::Vector<fb::Offset<w::AllowedProcess>>> Pids(const std::vector<AllowedPid>& pids) {
    std::vector<fb::Offset<w::AllowedProcess>> ps;
    for (const auto& p : pids) ps.push_back(w::CreateAllowedProcess(b, p.pid, p.start_time));
    return b.CreateVector(ps);
  }
  fb::Offset<void> operator()(const RestoreExportRequest& m) {
    auto t = b.CreateString(m.token);
    return w::CreateRestoreExportRequest(b, m.handle, t, static_cast<w::ExportFlags>(m.flags), Pids(m.pids))
        .Union();
  }
  fb::Offset<void> operator()(const TakeOverHello& m) {
    return w::CreateTakeOverHello(b, m.pid).Union();
  }
  fb::Offset<void> operator()(const TakeOverSockets&) { return w::CreateTakeOverSockets(b).Union(); }
  fb::Offset<void> operator()(const TakeOverKvDisk&) { return w::CreateTakeOverKvDisk(b).Union(); }
  fb::Offset<void> operator()(const EngineResolveRequest& m) {
    auto r = b.CreateString(m.remote);
    return w::CreateEngineResolveRequest(b, r, m.timeout_ms).Union();
  }
  fb::Offset<void> operator()(const EngineResolveReply& m) {
    auto h = b.CreateString(m.host);
    auto a = b.CreateString(m.address);
    return w::CreateEngineResolveReply(b, h, m.generation, a).Union();
  }
  fb::Offset<void> operator()(const ClusterLookupRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateClusterLookupRequest(b, n, m.timeout_ms).Union();
  }
  fb::Offset<void> operator()(const ClusterLookupReply& m) {
    auto h = b.CreateString(m.host);
    auto meta = b.CreateVector(reinterpret_cast<const uint8_t*>(m.metadata.data()), m.metadata.size());
    return w::CreateClusterLookupReply(b, h, m.generation, m.size, m.read_only, meta, m.allocation).Union();
  }
  fb::Offset<void> operator()(const TakeOverAllocations& m) {
    std::vector<fb::Offset<w::TakeOverAllocation>> as;
    for (const auto& a : m.handles)
      as.push_back(w::CreateTakeOverAllocation(b, a.id, a.page_size, static_cast<w::PagePolicy>(a.policy),
                                               a.pinned, a.fell_back, a.fixed_address, a.creator_uid));
    return w::CreateTakeOverAllocations(b, b.CreateVector(as)).Union();
  }
  fb::Offset<void> operator()(const TakeOverExport& m) {
    auto t = b.CreateString(m.token);
    return w::CreateTakeOverExport(b, t, m.allocation, m.exporter_uid, static_cast<w::ExportFlags>(m.flags),
                                   Pids(m.pids))
        .Union();
  }
  fb::Offset<void> operator()(const TakeOverName& m) {
    auto n = b.CreateString(m.name);
    auto meta = b.CreateVector(reinterpret_cast<const uint8_t*>(m.metadata.data()), m.metadata.size());
    return w::CreateTakeOverName(b, n, m.allocation, static_cast<w::PublishFlags>(m.flags), m.uid,
                                 m.publisher_pid, meta)
        .Union();
  }
  fb::Offset<void> operator()(const TakeOverEnd& m) {
    return w::CreateTakeOverEnd(b, m.allocations, m.exports, m.names, m.kv_stores).Union();
  }
  fb::Offset<void> operator()(const TakeOverKvStore& m) {
    return w::CreateTakeOverKvStore(b, m.store, b.CreateVector(m.handles)).Union();
  }
  fb::Offset<void> operator()(const TakeOverAck&) { return w::CreateTakeOverAck(b).Union(); }
  fb::Offset<void> operator()(const WakeRequest&) { return w::CreateWakeRequest(b).Union(); }
  fb::Offset<fb::Vector<fb::Offset<w::KvKey>>> Keys(const KvKeys& keys) {
    std::vector<fb::Offset<w::KvKey>> ks;
    ks.reserve(keys.size());
    for (std::string_view k : keys)
      ks.push_back(w::CreateKvKey(b, b.CreateVector(reinterpret_cast<const uint8_t*>(k.data()), k.size())));
    return b.CreateVector(ks);
  }
  std::pair<fb::Offset<fb::Vector<uint8_t>>, fb::Offset<fb::Vector<uint32_t>>> PackedKeys(const KvKeys& keys) {
    auto bytes = b.CreateVector(reinterpret_cast<const uint8_t*>(keys.bytes().data()), keys.bytes().size());
    return {bytes, b.CreateVector(keys.ends())};
  }
  fb::Offset<fb::Vector<const w::KvRef*>> Refs(const std::vector<KvRef>& refs) {
    std::vector<w::KvRef> rs;
    rs.reserve(refs.size());
    for (const auto& r : refs) rs.emplace_back(r.slot, r.generation);
    return b.CreateVectorOfStructs(rs);
  }
  fb::Offset<void> operator()(const KvOpenRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateKvOpenRequest(b, n, m.create, m.block_size, m.capacity, static_cast<w::PagePolicy>(m.policy),
                                  m.eviction)
        .Union();
  }
  fb::Offset<void> operator()(const KvStoreReply& m) {
    return w::CreateKvStoreReply(b, m.store, m.block_size, m.blocks, m.slab_blocks, m.slabs).Union();
  }
  fb::Offset<void> operator()(const KvSlabRequest& m) { return w::CreateKvSlabRequest(b, m.store, m.slab).Union(); }
  fb::Offset<void> operator()(const KvSlabReply& m) { return w::CreateKvSlabReply(b, m.size).Union(); }
  fb::Offset<void> operator()(const KvReserveRequest& m) {
    if (key_tables) return w::CreateKvReserveRequest(b, m.store, Keys(m.keys)).Union();
    auto [bytes, ends] = PackedKeys(m.keys);
    return w::CreateKvReserveRequest(b, m.store, 0, bytes, ends).Union();
  }
  fb::Offset<void> operator()(const KvSealRequest& m) {
    std::vector<w::KvSeal> ss;
    ss.reserve(m.blocks.size());
    for (const auto& x : m.blocks) ss.emplace_back(x.slot, x.generation, x.allocation, x.offset, x.length);
    auto vec = b.CreateVectorOfStructs(ss);
    return w::CreateKvSealRequest(b, m.store, vec).Union();
  }
  fb::Offset<void> operator()(const KvAbortRequest& m) {
    auto rs = Refs(m.refs);
    return w::CreateKvAbortRequest(b, m.store, rs).Union();
  }
  fb::Offset<void> operator()(const KvGetRequest& m) {
    if (key_tables) return w::CreateKvGetRequest(b, m.store, Keys(m.keys), m.lease).Union();
    auto [bytes, ends] = PackedKeys(m.keys);
    return w::CreateKvGetRequest(b, m.store, 0, m.lease, bytes, ends).Union();
  }
  fb::Offset<void> operator()(const KvReleaseRequest& m) {
    auto rs = Refs(m.refs);
    return w::CreateKvReleaseRequest(b, m.store, rs).Union();
  }
  fb::Offset<void> operator()(const KvBlocksReply& m) {
    std::vector<w::KvBlock> bs;
    bs.reserve(m.blocks.size());
    for (const auto& x : m.blocks) bs.emplace_back(static_cast<w::ErrorCode>(x.code), x.slot, x.generation, x.length);
    auto vec = b.CreateVectorOfStructs(bs);
    return w::CreateKvBlocksReply(b, vec, m.leading).Union();
  }
  fb::Offset<void> operator()(const KvDropRequest& m) {
    auto n = b.CreateString(m.name);
    return w::CreateKvDropRequest(b, n).Union();
  }
  fb::Offset<void> operator()(const EngineNetworkRequest& m) {
    std::vector<fb::Offset<w::EngineNetConnection>> cs;
    for (const auto& c : m.connections) {
      auto r = b.CreateString(c.remote);
      auto e = b.CreateString(c.engine);
      auto p = b.CreateString(c.path);
      auto t = b.CreateString(c.transports);
      cs.push_back(w::CreateEngineNetConnection(b, r, e, p, t));
    }
    auto listen = b.CreateString(m.listen_address);
    auto vec = b.CreateVector(cs);
    return w::CreateEngineNetworkRequest(b, listen, m.accepted, m.refused, m.inbound, vec).Union();
  }
  fb::Offset<void> operator()(const ErrorReply& m) {
    std::string msg = m.message.substr(0, kMaxErrorMessageBytes);
    auto s = b.CreateString(msg);
    return w::CreateErrorReply(b, static_cast<w::ErrorCode>(m.code), s).Union();
  }
};

Status Malformed(const std::string& why) {
  return Status(ErrorCode::kProtocolError, "malformed message: " + why);
}

// Copies a capped, optional string field.
// Copies a capped, optional name field: well-formed UTF-8 too (flatbuffers
// strings are UTF-8, and names end up in JSON).
Status ReadName(const fb::String* s, size_t cap, const char* field, std::string* out);

Status ReadString(const fb::String* s, size_t cap, const char* field, std::string* out) {
  if (s == nullptr) {
    out->clear();
    return Status::Ok();
  }
  if (s->size() > cap)
    return Malformed(std::string(field) + " longer than " + std::to_string(cap) + " bytes");
  out->assign(s->c_str(), s->size());
  return Status::Ok();
}

// Copies a capped, optional byte vector.
Status ReadBytes(const fb::Vector<uint8_t>* v, size_t cap, const char* field, std::string* out) {
  out->clear();
  if (v == nullptr) return Status::Ok();
  if (v->size() > cap) return Malformed(std::string(field) + " longer than " + std::to_string(cap) + " bytes");
  out->assign(reinterpret_cast<const char*>(v->data()), v->size());
  return Status::Ok();
}

Status ReadName(const fb::String* s, size_t cap, const char* field, std::string* out) {
  MB_RETURN_IF_ERROR(ReadString(s, cap, field, out));
  if (!IsValidUtf8(*out)) return Malformed(std::string(field) + " is not valid UTF-8");
  return Status::Ok();
}

bool ValidPolicy(w::PagePolicy p) {
  return p >= w::PagePolicy_MIN && p <= w::PagePolicy_MAX;
}

Result<Message> Read(const w::HelloRequest* m) {
  HelloRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->client_name(), kMaxClientNameBytes, "client_name",
                                &r.client_name));
  r.protocol_version = m->protocol_version();
  r.features = m->features();
  return Message(std::move(r));
}

Result<Message> Read(const w::HelloReply* m) {
  HelloReply r{m->client_id(), m->protocol_version(), m->features(), {}, {}};
  if (m->host() != nullptr && m->host()->size() > 0)
    MB_RETURN_IF_ERROR(ReadName(m->host(), kMaxHostNameBytes, "host", &r.host));
  if (auto gs = m->granularities()) {
    if (gs->size() > 16) return Malformed("too many granularities");
    for (const auto* g : *gs) {
      if (!ValidPolicy(g->policy())) return Malformed("unknown page policy");
      r.granularities.push_back(
          {static_cast<PagePolicy>(g->policy()), g->minimum(), g->recommended()});
    }
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::MallocRequest* m) {
  // An unknown policy is the request's mistake, not a broken frame: the
  // broker answers PARAM_INVALID and the connection stays.
  return Message(
      MallocRequest{m->size(), static_cast<PagePolicy>(m->policy()), m->flags(), m->export_flags(), m->device()});
}

Result<Message> Read(const w::MallocReply* m) {
  if (m->device() < -1)
    return Status(ErrorCode::kProtocolError, "MallocReply names device " + std::to_string(m->device()));
  return Message(MallocReply{m->handle(), m->size(), m->page_size(), m->fell_back(), m->pinned(), m->fixed_address(),
                             m->from_pool(), m->token() ? m->token()->str() : std::string(), m->device()});
}

Result<Message> Read(const w::FreeRequest* m) {
  return Message(FreeRequest{m->handle()});
}

Result<Message> Read(const w::ExportRequest* m) {
  return Message(ExportRequest{m->handle(), m->flags()});
}

Result<Message> Read(const w::ExportReply* m) {
  ExportReply r;
  MB_RETURN_IF_ERROR(
      ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
  return Message(std::move(r));
}

Result<Message> Read(const w::SetPidRequest* m) {
  SetPidRequest r;
  MB_RETURN_IF_ERROR(ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
  if (auto p = m->pids()) {
    if (p->size() > kMaxPidsPerRequest)
      return Malformed("more than " + std::to_string(kMaxPidsPerRequest) + " pids");
    r.pids.assign(p->begin(), p->end());
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::ImportRequest* m) {
  ImportRequest r;
  MB_RETURN_IF_ERROR(
      ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
  return Message(std::move(r));
}

Result<Message> Read(const w::ImportReply* m) {
  ImportReply r{m->handle(),        m->size(), m->page_size(), m->read_only(), m->pinned(),
                m->fixed_address(), {},        m->device()};
  if (r.device < -1) return Status(ErrorCode::kProtocolError, "ImportReply names device " + std::to_string(r.device));
  MB_RETURN_IF_ERROR(ReadBytes(m->metadata(), kMaxObjectMetadataBytes, "metadata", &r.metadata));
  return Message(std::move(r));
}

Result<Message> Read(const w::RegisterHostRequest* m) {
  return Message(RegisterHostRequest{m->address(), m->size(), m->flags()});
}

Result<Message> Read(const w::UnregisterHostRequest* m) {
  return Message(UnregisterHostRequest{m->address()});
}

Result<Message> Read(const w::EngineInitRequest* m) {
  EngineInitRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxEngineNameBytes, "name", &r.name));
  r.control_allocation = m->control_allocation();
  r.restoring = m->restoring();
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineFinalizeRequest*) {
  return Message(EngineFinalizeRequest{});
}

Result<Message> Read(const w::EngineRegisterRequest* m) {
  EngineRegisterRequest r{m->address(), m->length(), m->allocation(), m->offset(), {}};
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxRegionNameBytes, "region name", &r.name));
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineRegisterReply* m) {
  return Message(EngineRegisterReply{m->region()});
}

Result<Message> Read(const w::EngineDeregisterRequest* m) {
  return Message(EngineDeregisterRequest{m->region()});
}

Result<Message> Read(const w::EngineConnectRequest* m) {
  EngineConnectRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
  r.timeout_ms = m->timeout_ms();
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineRegionsRequest* m) {
  EngineRegionsRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(),
                                kMaxEngineNameBytes, "remote", &r.remote));
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineInfoReply* m) {
  EngineInfoReply r{m->pid(), m->slot(), m->control_allocation(), {}};
  if (auto rs = m->regions()) {
    if (rs->size() > kMaxEngineRegions) return Malformed("too many regions");
    for (const auto* g : *rs) {
      EngineRegion region{g->id(), g->address(), g->length(), g->allocation(), g->offset(), g->read_only(), {}};
      MB_RETURN_IF_ERROR(ReadName(g->name(), kMaxRegionNameBytes, "region name", &region.name));
      r.regions.push_back(std::move(region));
    }
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineImportRequest* m) {
  EngineImportRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
  r.allocation = m->allocation();
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineReleaseRequest* m) {
  return Message(EngineReleaseRequest{m->allocation()});
}

Result<Message> Read(const w::EngineDisconnectRequest* m) {
  EngineDisconnectRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(),
                                kMaxEngineNameBytes, "remote", &r.remote));
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineNotifyRequest* m) {
  EngineNotifyRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxNotifyNameBytes, "name", &r.name));
  MB_RETURN_IF_ERROR(ReadString(m->message(), kMaxNotifyMessageBytes, "message", &r.message));
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineGetNotifiesRequest*) {
  return Message(EngineGetNotifiesRequest{});
}

Result<Message> Read(const w::EngineNotifiesReply* m) {
  EngineNotifiesReply r;
  r.dropped = m->dropped();
  if (auto ns = m->notifies()) {
    if (ns->size() > kMaxNotifiesPerReply) return Malformed("too many notifies");
    for (const auto* n : *ns) {
      EngineNotify e;
      MB_RETURN_IF_ERROR(ReadName(n->from(), kMaxEngineNameBytes, "from", &e.from));
      MB_RETURN_IF_ERROR(ReadName(n->name(), kMaxNotifyNameBytes, "name", &e.name));
      MB_RETURN_IF_ERROR(
          ReadString(n->message(), kMaxNotifyMessageBytes, "message", &e.message));
      r.notifies.push_back(std::move(e));
    }
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::PublishRequest* m) {
  PublishRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxObjectNameBytes, "name", &r.name));
  r.allocation = m->allocation();
  r.flags = m->flags();
  MB_RETURN_IF_ERROR(ReadBytes(m->metadata(), kMaxObjectMetadataBytes, "metadata", &r.metadata));
  return Message(std::move(r));
}

Result<Message> Read(const w::LookupRequest* m) {
  LookupRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxObjectNameBytes, "name", &r.name));
  r.timeout_ms = m->timeout_ms();
  return Message(std::move(r));
}

Result<Message> Read(const w::UnpublishRequest* m) {
  UnpublishRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxObjectNameBytes, "name", &r.name));
  return Message(std::move(r));
}

Result<Message> Read(const w::ListNamesRequest* m) {
  ListNamesRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->prefix(), kMaxObjectNameBytes, "prefix", &r.prefix));
  MB_RETURN_IF_ERROR(ReadName(m->after(), kMaxObjectNameBytes, "after", &r.after));
  return Message(std::move(r));
}

Result<Message> Read(const w::ListNamesReply* m) {
  ListNamesReply r;
  r.truncated = m->truncated();
  if (auto os = m->objects()) {
    if (os->size() > kMaxNamesPerReply) return Malformed("too many names");
    for (const auto* o : *os) {
      NamedObject n{"", o->allocation(), o->size(), o->read_only(), o->persist(), o->publisher_pid()};
      MB_RETURN_IF_ERROR(ReadName(o->name(), kMaxObjectNameBytes, "name", &n.name));
      r.objects.push_back(std::move(n));
    }
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::SubscribeRequest* m) {
  SubscribeRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->prefix(), kMaxObjectNameBytes, "prefix", &r.prefix));
  r.cluster = m->cluster();
  return Message(std::move(r));
}

Result<Message> Read(const w::WaitEventsRequest* m) {
  return Message(WaitEventsRequest{m->timeout_ms()});
}

Result<Message> Read(const w::EventsReply* m) {
  EventsReply r;
  r.dropped = m->dropped();
  if (auto es = m->events()) {
    if (es->size() > kMaxEventsPerReply) return Malformed("too many events");
    for (const auto* e : *es) {
      if (e->kind() > w::NameEventKind_MAX) return Malformed("unknown event kind");
      NameEvent n{static_cast<NameEventKind>(e->kind()), "", e->allocation(), e->pid(), ""};
      MB_RETURN_IF_ERROR(ReadName(e->name(), kMaxObjectNameBytes, "name", &n.name));
      MB_RETURN_IF_ERROR(ReadName(e->host(), kMaxHostNameBytes, "host", &n.host));
      r.events.push_back(std::move(n));
    }
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::PingRequest*) {
  return Message(PingRequest{});
}

Result<Message> Read(const w::GoodbyeRequest*) {
  return Message(GoodbyeRequest{});
}

Result<Message> Read(const w::OkReply*) {
  return Message(OkReply{});
}

Result<Message> Read(const w::ErrorReply* m) {
  ErrorReply r;
  auto code = static_cast<int>(m->code());
  r.code = (code >= 0 && code <= static_cast<int>(w::ErrorCode_MAX))
               ? static_cast<ErrorCode>(code)
               : ErrorCode::kInternal;
  MB_RETURN_IF_ERROR(
      ReadString(m->message(), kMaxErrorMessageBytes, "message", &r.message));
  return Message(std::move(r));
}

Result<Message> Read(const w::EnginePeersRequest*) { return Message(EnginePeersRequest{}); }

Result<Message> Read(const w::EnginePeersReply* m) {
  EnginePeersReply r;
  if (auto ps = m->peers()) {
    if (ps->size() > kMaxEnginePeers) return Malformed("too many engine peers");
    for (const auto* p : *ps) r.peers.push_back({p->slot(), p->pid()});
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::ReattachRequest* m) {
  ReattachRequest r;
  if (auto hs = m->handles()) {
    if (hs->size() > kMaxReattachHandles)
      return Malformed("more than " + std::to_string(kMaxReattachHandles) + " handles to reattach");
    for (const auto* h : *hs)
      r.handles.push_back({h->handle(), h->created(), h->pinned(), h->fixed_address()});
  }
  return Message(std::move(r));
}

Result<Message> Read(const w::ReattachReply* m) {
  ReattachReply r;
  if (auto rs = m->results()) {
    if (rs->size() > kMaxReattachHandles) return Malformed("too many reattach results");
    for (const auto* x : *rs) {
      ReattachResult out;
      const auto code = static_cast<int>(x->code());
      out.code = (code >= 0 && code <= static_cast<int>(w::ErrorCode_MAX)) ? static_cast<ErrorCode>(code)
                                                                          : ErrorCode::kInternal;
      out.pinned = x->pinned();
      MB_RETURN_IF_ERROR(ReadString(x->message(), kMaxErrorMessageBytes, "message", &out.message));
      r.results.push_back(std::move(out));
    }
  }
  return Message(std::move(r));
}

// An export's allowed processes (RestoreExportRequest, TakeOverExport).
Status ReadPids(const fb::Vector<fb::Offset<w::AllowedProcess>>* ps, std::vector<AllowedPid>* out) {
  if (ps == nullptr) return Status::Ok();
  if (ps->size() > kMaxPidsPerRequest) return Malformed("more than " + std::to_string(kMaxPidsPerRequest) + " pids");
  for (const auto* p : *ps) out->push_back({p->pid(), p->start_time()});
  return Status::Ok();
}

Result<Message> Read(const w::RestoreExportRequest* m) {
  RestoreExportRequest r;
  r.handle = m->handle();
  r.flags = static_cast<uint32_t>(m->flags());
  MB_RETURN_IF_ERROR(ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
  MB_RETURN_IF_ERROR(ReadPids(m->pids(), &r.pids));
  return Message(std::move(r));
}

Result<Message> Read(const w::TakeOverHello* m) { return Message(TakeOverHello{m->pid()}); }
Result<Message> Read(const w::TakeOverSockets*) { return Message(TakeOverSockets{}); }
Result<Message> Read(const w::TakeOverKvDisk*) { return Message(TakeOverKvDisk{}); }

Result<Message> Read(const w::EngineResolveRequest* m) {
  EngineResolveRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
  r.timeout_ms = m->timeout_ms();
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineResolveReply* m) {
  EngineResolveReply r;
  MB_RETURN_IF_ERROR(ReadName(m->host(), kMaxHostNameBytes, "host", &r.host));
  r.generation = m->generation();
  MB_RETURN_IF_ERROR(ReadName(m->address(), kMaxNetAddressBytes, "address", &r.address));
  if (r.host.empty() != r.address.empty()) return Malformed("a host without an address, or an address without a host");
  return Message(std::move(r));
}
Result<Message> Read(const w::ClusterLookupRequest* m) {
  ClusterLookupRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxObjectNameBytes, "name", &r.name));
  r.timeout_ms = m->timeout_ms();
  return Message(std::move(r));
}

Result<Message> Read(const w::ClusterLookupReply* m) {
  ClusterLookupReply r;
  MB_RETURN_IF_ERROR(ReadName(m->host(), kMaxHostNameBytes, "host", &r.host));
  r.generation = m->generation();
  r.size = m->size();
  r.read_only = m->read_only();
  MB_RETURN_IF_ERROR(ReadBytes(m->metadata(), kMaxObjectMetadataBytes, "metadata", &r.metadata));
  r.allocation = m->allocation();
  return Message(std::move(r));
}
Result<Message> Read(const w::TakeOverAllocations* m) {
  TakeOverAllocations r;
  if (auto as = m->handles()) {
    if (as->size() > kMaxReattachHandles) return Malformed("too many allocations in one frame");
    for (const auto* a : *as) {
      if (a->policy() > w::PagePolicy_MAX) return Malformed("unknown page policy");
      r.handles.push_back({a->id(), a->page_size(), static_cast<PagePolicy>(a->policy()), a->pinned(),
                           a->fell_back(), a->fixed_address(), a->creator_uid()});
    }
  }
  return Message(std::move(r));
}
Result<Message> Read(const w::TakeOverExport* m) {
  TakeOverExport r;
  MB_RETURN_IF_ERROR(ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
  r.allocation = m->allocation();
  r.exporter_uid = m->exporter_uid();
  r.flags = static_cast<uint32_t>(m->flags());
  MB_RETURN_IF_ERROR(ReadPids(m->pids(), &r.pids));
  return Message(std::move(r));
}
Result<Message> Read(const w::TakeOverName* m) {
  TakeOverName r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxObjectNameBytes, "name", &r.name));
  r.allocation = m->allocation();
  r.flags = static_cast<uint32_t>(m->flags());
  r.uid = m->uid();
  r.publisher_pid = m->publisher_pid();
  MB_RETURN_IF_ERROR(ReadBytes(m->metadata(), kMaxObjectMetadataBytes, "metadata", &r.metadata));
  return Message(std::move(r));
}
Result<Message> Read(const w::TakeOverEnd* m) {
  return Message(TakeOverEnd{m->allocations(), m->exports(), m->names(), m->kv_stores()});
}
Result<Message> Read(const w::TakeOverKvStore* m) {
  TakeOverKvStore r;
  r.store = m->store();
  if (auto parts = m->parts()) {
    if (parts->size() > kMaxReattachHandles) return Malformed("too many store parts in one frame");
    r.handles.assign(parts->begin(), parts->end());
  }
  return Message(std::move(r));
}
Result<Message> Read(const w::TakeOverAck*) { return Message(TakeOverAck{}); }
Result<Message> Read(const w::WakeRequest*) { return Message(WakeRequest{}); }

// KV-cache stores: every batch at most kMaxKvBatch long, every key 1 to
// kMaxKvKeyBytes bytes, packed (key_bytes, key_ends) or a table each (keys,
// as clients before packed keys sent them), not both.
Status ReadKeyTables(const fb::Vector<fb::Offset<w::KvKey>>* v, KvKeys* out) {
  if (v == nullptr) return Status::Ok();
  if (v->size() > kMaxKvBatch) return Malformed("more than " + std::to_string(kMaxKvBatch) + " keys");
  out->reserve(v->size(), v->size() * 32);  // (content hashes are 32 bytes)
  for (const auto* k : *v) {
    const fb::Vector<uint8_t>* bytes = k->bytes();
    if (bytes == nullptr || bytes->size() == 0) return Malformed("an empty key");
    if (bytes->size() > kMaxKvKeyBytes)
      return Malformed("key longer than " + std::to_string(kMaxKvKeyBytes) + " bytes");
    out->push_back(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  }
  return Status::Ok();
}
template <typename Request>
Status ReadKeys(const Request* m, KvKeys* out) {
  const fb::Vector<fb::Offset<w::KvKey>>* v = m->keys();
  const fb::Vector<uint8_t>* bytes = m->key_bytes();
  const fb::Vector<uint32_t>* ends = m->key_ends();
  if (bytes == nullptr && ends == nullptr) return ReadKeyTables(v, out);
  if (v != nullptr) return Malformed("keys both packed and as tables");
  if (bytes == nullptr || ends == nullptr) return Malformed("packed keys without their bytes or their ends");
  if (ends->size() > kMaxKvBatch) return Malformed("more than " + std::to_string(kMaxKvBatch) + " keys");
  const std::string_view all(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  uint32_t begin = 0;
  for (uint32_t end : *ends) {
    if (end <= begin) return Malformed("an empty key, or key ends out of order");
    if (end - begin > kMaxKvKeyBytes)
      return Malformed("key longer than " + std::to_string(kMaxKvKeyBytes) + " bytes");
    if (end > all.size()) return Malformed("a key ends past the keys' bytes");
    begin = end;
  }
  if (begin != all.size()) return Malformed("key bytes past the last key");
  out->Assign(all, std::span<const uint32_t>(ends->data(), ends->size()));  // (checked: one copy of each)
  return Status::Ok();
}
Status ReadRefs(const fb::Vector<const w::KvRef*>* v, std::vector<KvRef>* out) {
  if (v == nullptr) return Status::Ok();
  if (v->size() > kMaxKvBatch) return Malformed("more than " + std::to_string(kMaxKvBatch) + " refs");
  out->reserve(v->size());
  for (const auto* r : *v) out->push_back({r->slot(), r->generation()});
  return Status::Ok();
}
Result<Message> Read(const w::KvOpenRequest* m) {
  KvOpenRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxKvStoreNameBytes, "store name", &r.name));
  r.create = m->create();
  r.block_size = m->block_size();
  r.capacity = m->capacity();
  r.policy = static_cast<PagePolicy>(m->policy());  // checked by the broker (PARAM_INVALID)
  r.eviction = m->eviction();
  return Message(std::move(r));
}
Result<Message> Read(const w::KvStoreReply* m) {
  return Message(KvStoreReply{m->store(), m->block_size(), m->blocks(), m->slab_blocks(), m->slabs()});
}
Result<Message> Read(const w::KvSlabRequest* m) { return Message(KvSlabRequest{m->store(), m->slab()}); }
Result<Message> Read(const w::KvSlabReply* m) { return Message(KvSlabReply{m->size()}); }
Result<Message> Read(const w::KvReserveRequest* m) {
  KvReserveRequest r;
  r.store = m->store();
  MB_RETURN_IF_ERROR(ReadKeys(m, &r.keys));
  return Message(std::move(r));
}
Result<Message> Read(const w::KvSealRequest* m) {
  KvSealRequest r;
  r.store = m->store();
  if (const auto* v = m->blocks()) {
    if (v->size() > kMaxKvBatch) return Malformed("more than " + std::to_string(kMaxKvBatch) + " blocks");
    for (const auto* x : *v)
      r.blocks.push_back({x->slot(), x->generation(), x->allocation(), x->offset(), x->length()});
  }
  return Message(std::move(r));
}
Result<Message> Read(const w::KvAbortRequest* m) {
  KvAbortRequest r;
  r.store = m->store();
  MB_RETURN_IF_ERROR(ReadRefs(m->refs(), &r.refs));
  return Message(std::move(r));
}
Result<Message> Read(const w::KvGetRequest* m) {
  KvGetRequest r;
  r.store = m->store();
  r.lease = m->lease();
  MB_RETURN_IF_ERROR(ReadKeys(m, &r.keys));
  return Message(std::move(r));
}
Result<Message> Read(const w::KvReleaseRequest* m) {
  KvReleaseRequest r;
  r.store = m->store();
  MB_RETURN_IF_ERROR(ReadRefs(m->refs(), &r.refs));
  return Message(std::move(r));
}
Result<Message> Read(const w::KvBlocksReply* m) {
  KvBlocksReply r;
  r.leading = m->leading();
  if (const auto* v = m->blocks()) {
    if (v->size() > kMaxKvBatch) return Malformed("more than " + std::to_string(kMaxKvBatch) + " blocks");
    for (const auto* x : *v) {
      const int code = static_cast<int>(x->code());
      if (code < 0 || code > static_cast<int>(w::ErrorCode_MAX)) return Malformed("unknown error code in a block");
      r.blocks.push_back({static_cast<ErrorCode>(code), x->slot(), x->generation(), x->length()});
    }
  }
  if (r.leading > r.blocks.size()) return Malformed("a leading run longer than the blocks");
  return Message(std::move(r));
}
Result<Message> Read(const w::KvDropRequest* m) {
  KvDropRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->name(), kMaxKvStoreNameBytes, "store name", &r.name));
  return Message(std::move(r));
}

Result<Message> Read(const w::EngineNetworkRequest* m) {
  EngineNetworkRequest r;
  MB_RETURN_IF_ERROR(ReadName(m->listen_address(), kMaxNetAddressBytes, "listen_address", &r.listen_address));
  r.accepted = m->accepted();
  r.refused = m->refused();
  r.inbound = m->inbound();
  if (auto cs = m->connections()) {
    if (cs->size() > kMaxNetConnections) return Malformed("too many network connections");
    for (const auto* c : *cs) {
      EngineNetConnection e;
      MB_RETURN_IF_ERROR(ReadName(c->remote(), kMaxNetAddressBytes, "remote", &e.remote));
      MB_RETURN_IF_ERROR(ReadName(c->engine(), kMaxEngineNameBytes, "engine", &e.engine));
      MB_RETURN_IF_ERROR(ReadName(c->path(), 16, "path", &e.path));
      MB_RETURN_IF_ERROR(ReadName(c->transports(), kMaxNetTransportsBytes, "transports", &e.transports));
      r.connections.push_back(std::move(e));
    }
  }
  return Message(std::move(r));
}

// The wire union's tags are Message's indices + 1 (the list's order).
#define MEMBROKER_WIRE_TAG(T, direction, fds)                                        \
  static_assert(static_cast<size_t>(w::Message_##T) == MessageIndex<T>() + 1,         \
                #T " is not at the same place in messages.h and the schema's union");
MEMBROKER_MESSAGES(MEMBROKER_WIRE_TAG)
#undef MEMBROKER_WIRE_TAG
static_assert(static_cast<size_t>(w::Message_MAX) == std::variant_size_v<Message>,
              "the schema's union and messages.h list different messages");

Result<Message> DecodeBody(const w::Envelope* env) {
  // The verifier accepts a union type whose table is absent; we do not.
  if (env->body_type() != w::Message_NONE && env->body() == nullptr)
    return Malformed("union type set but body missing");
  switch (env->body_type()) {
#define MEMBROKER_READ_CASE(T, direction, fds) \
  case w::Message_##T:                         \
    return Read(env->body_as_##T());
    MEMBROKER_MESSAGES(MEMBROKER_READ_CASE)
#undef MEMBROKER_READ_CASE
    case w::Message_NONE:
      return Malformed("envelope has no body");
  }
  return Malformed("unknown message type " + std::to_string(env->body_type()));
}

}  // namespace

namespace {
// The encoded bytes, in b's buffer until its next use.
std::span<const uint8_t> EncodeWith(fb::FlatBufferBuilder& b, uint16_t version, uint64_t request_id, uint32_t flags,
                                    const Message& body, bool key_tables) {
  b.Clear();  // (keeps the buffer it grew to)
  auto [type, offset] = std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        return std::pair{static_cast<w::Message>(MessageIndex<T>() + 1), Encoder{b, key_tables}(m)};
      },
      body);
  auto root = w::CreateEnvelope(b, version, request_id, static_cast<w::EnvelopeFlags>(flags), type, offset);
  b.Finish(root);
  return {b.GetBufferPointer(), b.GetSize()};
}
// (A batch of keys outgrows less: each growth copies the buffer.)
constexpr size_t kFirstBuffer = 1024;
}  // namespace

std::vector<uint8_t> Encode(const Envelope& env) {
  fb::FlatBufferBuilder b(kFirstBuffer);
  const auto bytes = EncodeWith(b, env.protocol_version, env.request_id, env.flags, env.body, false);
  return {bytes.begin(), bytes.end()};
}
std::vector<uint8_t> EncodeWithKeyTables(const Envelope& env) {
  fb::FlatBufferBuilder b(kFirstBuffer);
  const auto bytes = EncodeWith(b, env.protocol_version, env.request_id, env.flags, env.body, true);
  return {bytes.begin(), bytes.end()};
}

struct MessageEncoder::Builder {
  fb::FlatBufferBuilder b{kFirstBuffer};
};
MessageEncoder::MessageEncoder() : builder_(std::make_unique<Builder>()) {}
MessageEncoder::~MessageEncoder() = default;
std::span<const uint8_t> MessageEncoder::operator()(uint64_t request_id, uint32_t flags, const Message& body) {
  return EncodeWith(builder_->b, kProtocolVersion, request_id, flags, body, false);
}

Result<Envelope> Decode(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxFrameBytes) return Malformed("frame too large");
  if (bytes.size() < sizeof(fb::uoffset_t)) return Malformed("frame too short");
  // Depth and table caps keep the verifier's own work bounded.
  fb::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/16, /*max_tables=*/4096);
  if (!w::VerifyEnvelopeBuffer(verifier)) return Malformed("flatbuffers verification failed");
  const w::Envelope* env = w::GetEnvelope(bytes.data());
  MB_ASSIGN_OR_RETURN(Message body, DecodeBody(env));
  return Envelope{env->protocol_version(), env->request_id(), env->flags(), std::move(body)};
}

const char* MessageName(const Message& body) {
#define MEMBROKER_NAME(T, direction, fds) #T,
  static constexpr const char* kNames[] = {MEMBROKER_MESSAGES(MEMBROKER_NAME)};
#undef MEMBROKER_NAME
  return kNames[body.index()];
}

size_t ExpectedFds(const Message& body) {
  return std::visit(
      [](const auto& m) -> size_t {
        using T = std::decay_t<decltype(m)>;
        if constexpr (kFdsOf<T> == kOneFdPerEntry)
          return m.handles.size();
        else
          return kFdsOf<T>;
      },
      body);
}

bool IsRequest(const Message& body) {
  return std::visit([](const auto& m) { return kIsRequest<std::decay_t<decltype(m)>>; }, body);
}

Status StatusOf(const Message& body) {
  const auto* e = std::get_if<ErrorReply>(&body);
  if (e == nullptr) return Status::Ok();
  if (e->code == ErrorCode::kOk)  // an error reply must carry an error
    return Status(ErrorCode::kProtocolError, "error reply without an error code: " + e->message);
  return Status(e->code, e->message);
}

}  // namespace membroker::ipc
