#include "membroker/ipc/protocol.h"

#include <flatbuffers/flatbuffers.h>

#include "membroker/ipc/framing.h"
#include "membroker_generated.h"

namespace membroker::ipc {

namespace fb = flatbuffers;
namespace w = membroker::wire;

static_assert(static_cast<int>(w::ErrorCode_MAX) == static_cast<int>(ErrorCode::kAddressInUse),
              "status.h and the schema's ErrorCode must list the same codes");
static_assert(static_cast<int>(w::PagePolicy_MAX) == static_cast<int>(PagePolicy::kHuge1GOnly));

namespace {

struct Encoder {
  fb::FlatBufferBuilder& b;

  std::pair<w::Message, fb::Offset<void>> operator()(const HelloRequest& m) {
    auto name = b.CreateString(m.client_name);
    return {w::Message_HelloRequest,
            w::CreateHelloRequest(b, name, m.protocol_version, m.features).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const HelloReply& m) {
    std::vector<fb::Offset<w::Granularity>> gs;
    for (const auto& g : m.granularities)
      gs.push_back(w::CreateGranularity(b, static_cast<w::PagePolicy>(g.policy), g.minimum,
                                        g.recommended));
    auto vec = b.CreateVector(gs);
    return {w::Message_HelloReply,
            w::CreateHelloReply(b, m.client_id, m.protocol_version, m.features, vec).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const MallocRequest& m) {
    return {w::Message_MallocRequest,
            w::CreateMallocRequest(b, m.size, static_cast<w::PagePolicy>(m.policy), m.flags,
                                   m.export_flags)
                .Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const MallocReply& m) {
    auto token = m.token.empty() ? fb::Offset<fb::String>() : b.CreateString(m.token);
    return {w::Message_MallocReply,
            w::CreateMallocReply(b, m.handle, m.size, m.page_size, m.fell_back, m.pinned,
                                 m.fixed_address, m.from_pool, token)
                .Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const FreeRequest& m) {
    return {w::Message_FreeRequest, w::CreateFreeRequest(b, m.handle).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ExportRequest& m) {
    return {w::Message_ExportRequest, w::CreateExportRequest(b, m.handle, m.flags).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ExportReply& m) {
    auto t = b.CreateString(m.token);
    return {w::Message_ExportReply, w::CreateExportReply(b, t).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const SetPidRequest& m) {
    auto t = b.CreateString(m.token);
    auto p = b.CreateVector(m.pids);
    return {w::Message_SetPidRequest, w::CreateSetPidRequest(b, t, p).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ImportRequest& m) {
    auto t = b.CreateString(m.token);
    return {w::Message_ImportRequest, w::CreateImportRequest(b, t).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ImportReply& m) {
    return {w::Message_ImportReply,
            w::CreateImportReply(b, m.handle, m.size, m.page_size, m.read_only, m.pinned,
                                 m.fixed_address)
                .Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const PingRequest&) {
    return {w::Message_PingRequest, w::CreatePingRequest(b).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const GoodbyeRequest&) {
    return {w::Message_GoodbyeRequest, w::CreateGoodbyeRequest(b).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const OkReply&) {
    return {w::Message_OkReply, w::CreateOkReply(b).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const RegisterHostRequest& m) {
    return {w::Message_RegisterHostRequest,
            w::CreateRegisterHostRequest(b, m.address, m.size, m.flags).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const UnregisterHostRequest& m) {
    return {w::Message_UnregisterHostRequest,
            w::CreateUnregisterHostRequest(b, m.address).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineInitRequest& m) {
    auto n = b.CreateString(m.name);
    return {w::Message_EngineInitRequest,
            w::CreateEngineInitRequest(b, n, m.control_allocation).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineFinalizeRequest&) {
    return {w::Message_EngineFinalizeRequest, w::CreateEngineFinalizeRequest(b).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineRegisterRequest& m) {
    return {w::Message_EngineRegisterRequest,
            w::CreateEngineRegisterRequest(b, m.address, m.length, m.allocation, m.offset).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineRegisterReply& m) {
    return {w::Message_EngineRegisterReply, w::CreateEngineRegisterReply(b, m.region).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineDeregisterRequest& m) {
    return {w::Message_EngineDeregisterRequest,
            w::CreateEngineDeregisterRequest(b, m.region).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineConnectRequest& m) {
    auto r = b.CreateString(m.remote);
    return {w::Message_EngineConnectRequest,
            w::CreateEngineConnectRequest(b, r, m.timeout_ms).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineRegionsRequest& m) {
    auto r = b.CreateString(m.remote);
    return {w::Message_EngineRegionsRequest, w::CreateEngineRegionsRequest(b, r).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineInfoReply& m) {
    std::vector<fb::Offset<w::EngineRegion>> rs;
    for (const auto& r : m.regions)
      rs.push_back(w::CreateEngineRegion(b, r.id, r.address, r.length, r.allocation, r.offset,
                                         r.read_only));
    auto vec = b.CreateVector(rs);
    return {w::Message_EngineInfoReply,
            w::CreateEngineInfoReply(b, m.pid, m.slot, m.control_allocation, vec).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineImportRequest& m) {
    auto r = b.CreateString(m.remote);
    return {w::Message_EngineImportRequest,
            w::CreateEngineImportRequest(b, r, m.allocation).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineReleaseRequest& m) {
    return {w::Message_EngineReleaseRequest,
            w::CreateEngineReleaseRequest(b, m.allocation).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineDisconnectRequest& m) {
    auto r = b.CreateString(m.remote);
    return {w::Message_EngineDisconnectRequest, w::CreateEngineDisconnectRequest(b, r).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineNotifyRequest& m) {
    auto r = b.CreateString(m.remote);
    auto n = b.CreateString(m.name);
    auto msg = b.CreateString(m.message);
    return {w::Message_EngineNotifyRequest,
            w::CreateEngineNotifyRequest(b, r, n, msg).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineGetNotifiesRequest&) {
    return {w::Message_EngineGetNotifiesRequest, w::CreateEngineGetNotifiesRequest(b).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EngineNotifiesReply& m) {
    std::vector<fb::Offset<w::EngineNotify>> ns;
    for (const auto& n : m.notifies) {
      auto f = b.CreateString(n.from);
      auto nm = b.CreateString(n.name);
      auto msg = b.CreateString(n.message);
      ns.push_back(w::CreateEngineNotify(b, f, nm, msg));
    }
    auto vec = b.CreateVector(ns);
    return {w::Message_EngineNotifiesReply,
            w::CreateEngineNotifiesReply(b, vec, m.dropped).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const PublishRequest& m) {
    auto n = b.CreateString(m.name);
    return {w::Message_PublishRequest, w::CreatePublishRequest(b, n, m.allocation, m.flags).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const LookupRequest& m) {
    auto n = b.CreateString(m.name);
    return {w::Message_LookupRequest, w::CreateLookupRequest(b, n, m.timeout_ms).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const UnpublishRequest& m) {
    auto n = b.CreateString(m.name);
    return {w::Message_UnpublishRequest, w::CreateUnpublishRequest(b, n).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ListNamesRequest& m) {
    auto p = b.CreateString(m.prefix);
    return {w::Message_ListNamesRequest, w::CreateListNamesRequest(b, p).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ListNamesReply& m) {
    std::vector<fb::Offset<w::NamedObject>> os;
    for (const auto& o : m.objects) {
      auto n = b.CreateString(o.name);
      os.push_back(w::CreateNamedObject(b, n, o.allocation, o.size, o.read_only, o.persist,
                                        o.publisher_pid));
    }
    auto vec = b.CreateVector(os);
    return {w::Message_ListNamesReply, w::CreateListNamesReply(b, vec, m.truncated).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const SubscribeRequest& m) {
    auto p = b.CreateString(m.prefix);
    return {w::Message_SubscribeRequest, w::CreateSubscribeRequest(b, p).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const WaitEventsRequest& m) {
    return {w::Message_WaitEventsRequest, w::CreateWaitEventsRequest(b, m.timeout_ms).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const EventsReply& m) {
    std::vector<fb::Offset<w::NameEvent>> es;
    for (const auto& e : m.events) {
      auto n = b.CreateString(e.name);
      es.push_back(w::CreateNameEvent(b, static_cast<w::NameEventKind>(e.kind), n, e.allocation, e.pid));
    }
    auto vec = b.CreateVector(es);
    return {w::Message_EventsReply, w::CreateEventsReply(b, vec, m.dropped).Union()};
  }
  std::pair<w::Message, fb::Offset<void>> operator()(const ErrorReply& m) {
    std::string msg = m.message.substr(0, kMaxErrorMessageBytes);
    auto s = b.CreateString(msg);
    return {w::Message_ErrorReply,
            w::CreateErrorReply(b, static_cast<w::ErrorCode>(m.code), s).Union()};
  }
};

Status Malformed(const std::string& why) {
  return Status(ErrorCode::kProtocolError, "malformed message: " + why);
}

// Copies a capped, optional string field.
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

bool ValidPolicy(w::PagePolicy p) {
  return p >= w::PagePolicy_MIN && p <= w::PagePolicy_MAX;
}

Result<Message> DecodeBody(const w::Envelope* env) {
  // The verifier accepts a union type whose table is absent; we do not.
  if (env->body_type() != w::Message_NONE && env->body() == nullptr)
    return Malformed("union type set but body missing");
  switch (env->body_type()) {
    case w::Message_HelloRequest: {
      auto m = env->body_as_HelloRequest();
      HelloRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->client_name(), kMaxClientNameBytes, "client_name",
                                    &r.client_name));
      r.protocol_version = m->protocol_version();
      r.features = m->features();
      return Message(std::move(r));
    }
    case w::Message_HelloReply: {
      auto m = env->body_as_HelloReply();
      HelloReply r{m->client_id(), m->protocol_version(), m->features(), {}};
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
    case w::Message_MallocRequest: {
      auto m = env->body_as_MallocRequest();
      if (!ValidPolicy(m->policy())) return Malformed("unknown page policy");
      return Message(
          MallocRequest{m->size(), static_cast<PagePolicy>(m->policy()), m->flags(), m->export_flags()});
    }
    case w::Message_MallocReply: {
      auto m = env->body_as_MallocReply();
      return Message(MallocReply{m->handle(), m->size(), m->page_size(), m->fell_back(),
                                 m->pinned(), m->fixed_address(), m->from_pool(),
                                 m->token() ? m->token()->str() : std::string()});
    }
    case w::Message_FreeRequest:
      return Message(FreeRequest{env->body_as_FreeRequest()->handle()});
    case w::Message_ExportRequest: {
      auto m = env->body_as_ExportRequest();
      return Message(ExportRequest{m->handle(), m->flags()});
    }
    case w::Message_ExportReply: {
      ExportReply r;
      MB_RETURN_IF_ERROR(
          ReadString(env->body_as_ExportReply()->token(), kMaxTokenBytes, "token", &r.token));
      return Message(std::move(r));
    }
    case w::Message_SetPidRequest: {
      auto m = env->body_as_SetPidRequest();
      SetPidRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->token(), kMaxTokenBytes, "token", &r.token));
      if (auto p = m->pids()) {
        if (p->size() > kMaxPidsPerRequest)
          return Malformed("more than " + std::to_string(kMaxPidsPerRequest) + " pids");
        r.pids.assign(p->begin(), p->end());
      }
      return Message(std::move(r));
    }
    case w::Message_ImportRequest: {
      ImportRequest r;
      MB_RETURN_IF_ERROR(
          ReadString(env->body_as_ImportRequest()->token(), kMaxTokenBytes, "token", &r.token));
      return Message(std::move(r));
    }
    case w::Message_ImportReply: {
      auto m = env->body_as_ImportReply();
      return Message(ImportReply{m->handle(), m->size(), m->page_size(), m->read_only(),
                                 m->pinned(), m->fixed_address()});
    }
    case w::Message_RegisterHostRequest: {
      auto m = env->body_as_RegisterHostRequest();
      return Message(RegisterHostRequest{m->address(), m->size(), m->flags()});
    }
    case w::Message_UnregisterHostRequest: {
      return Message(UnregisterHostRequest{env->body_as_UnregisterHostRequest()->address()});
    }
    case w::Message_EngineInitRequest: {
      auto m = env->body_as_EngineInitRequest();
      EngineInitRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->name(), kMaxEngineNameBytes, "name", &r.name));
      r.control_allocation = m->control_allocation();
      return Message(std::move(r));
    }
    case w::Message_EngineFinalizeRequest:
      return Message(EngineFinalizeRequest{});
    case w::Message_EngineRegisterRequest: {
      auto m = env->body_as_EngineRegisterRequest();
      return Message(EngineRegisterRequest{m->address(), m->length(), m->allocation(), m->offset()});
    }
    case w::Message_EngineRegisterReply:
      return Message(EngineRegisterReply{env->body_as_EngineRegisterReply()->region()});
    case w::Message_EngineDeregisterRequest:
      return Message(EngineDeregisterRequest{env->body_as_EngineDeregisterRequest()->region()});
    case w::Message_EngineConnectRequest: {
      auto m = env->body_as_EngineConnectRequest();
      EngineConnectRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
      r.timeout_ms = m->timeout_ms();
      return Message(std::move(r));
    }
    case w::Message_EngineRegionsRequest: {
      EngineRegionsRequest r;
      MB_RETURN_IF_ERROR(ReadString(env->body_as_EngineRegionsRequest()->remote(),
                                    kMaxEngineNameBytes, "remote", &r.remote));
      return Message(std::move(r));
    }
    case w::Message_EngineInfoReply: {
      auto m = env->body_as_EngineInfoReply();
      EngineInfoReply r{m->pid(), m->slot(), m->control_allocation(), {}};
      if (auto rs = m->regions()) {
        if (rs->size() > kMaxEngineRegions) return Malformed("too many regions");
        for (const auto* g : *rs)
          r.regions.push_back({g->id(), g->address(), g->length(), g->allocation(), g->offset(),
                               g->read_only()});
      }
      return Message(std::move(r));
    }
    case w::Message_EngineImportRequest: {
      auto m = env->body_as_EngineImportRequest();
      EngineImportRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
      r.allocation = m->allocation();
      return Message(std::move(r));
    }
    case w::Message_EngineReleaseRequest:
      return Message(EngineReleaseRequest{env->body_as_EngineReleaseRequest()->allocation()});
    case w::Message_EngineDisconnectRequest: {
      EngineDisconnectRequest r;
      MB_RETURN_IF_ERROR(ReadString(env->body_as_EngineDisconnectRequest()->remote(),
                                    kMaxEngineNameBytes, "remote", &r.remote));
      return Message(std::move(r));
    }
    case w::Message_EngineNotifyRequest: {
      auto m = env->body_as_EngineNotifyRequest();
      EngineNotifyRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->remote(), kMaxEngineNameBytes, "remote", &r.remote));
      MB_RETURN_IF_ERROR(ReadString(m->name(), kMaxNotifyNameBytes, "name", &r.name));
      MB_RETURN_IF_ERROR(ReadString(m->message(), kMaxNotifyMessageBytes, "message", &r.message));
      return Message(std::move(r));
    }
    case w::Message_EngineGetNotifiesRequest:
      return Message(EngineGetNotifiesRequest{});
    case w::Message_EngineNotifiesReply: {
      auto m = env->body_as_EngineNotifiesReply();
      EngineNotifiesReply r;
      r.dropped = m->dropped();
      if (auto ns = m->notifies()) {
        if (ns->size() > kMaxNotifiesPerReply) return Malformed("too many notifies");
        for (const auto* n : *ns) {
          EngineNotify e;
          MB_RETURN_IF_ERROR(ReadString(n->from(), kMaxEngineNameBytes, "from", &e.from));
          MB_RETURN_IF_ERROR(ReadString(n->name(), kMaxNotifyNameBytes, "name", &e.name));
          MB_RETURN_IF_ERROR(
              ReadString(n->message(), kMaxNotifyMessageBytes, "message", &e.message));
          r.notifies.push_back(std::move(e));
        }
      }
      return Message(std::move(r));
    }
    case w::Message_PublishRequest: {
      auto m = env->body_as_PublishRequest();
      PublishRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->name(), kMaxObjectNameBytes, "name", &r.name));
      r.allocation = m->allocation();
      r.flags = m->flags();
      return Message(std::move(r));
    }
    case w::Message_LookupRequest: {
      auto m = env->body_as_LookupRequest();
      LookupRequest r;
      MB_RETURN_IF_ERROR(ReadString(m->name(), kMaxObjectNameBytes, "name", &r.name));
      r.timeout_ms = m->timeout_ms();
      return Message(std::move(r));
    }
    case w::Message_UnpublishRequest: {
      UnpublishRequest r;
      MB_RETURN_IF_ERROR(ReadString(env->body_as_UnpublishRequest()->name(), kMaxObjectNameBytes, "name", &r.name));
      return Message(std::move(r));
    }
    case w::Message_ListNamesRequest: {
      ListNamesRequest r;
      MB_RETURN_IF_ERROR(ReadString(env->body_as_ListNamesRequest()->prefix(), kMaxObjectNameBytes, "prefix", &r.prefix));
      return Message(std::move(r));
    }
    case w::Message_ListNamesReply: {
      auto m = env->body_as_ListNamesReply();
      ListNamesReply r;
      r.truncated = m->truncated();
      if (auto os = m->objects()) {
        if (os->size() > kMaxNamesPerReply) return Malformed("too many names");
        for (const auto* o : *os) {
          NamedObject n{"", o->allocation(), o->size(), o->read_only(), o->persist(), o->publisher_pid()};
          MB_RETURN_IF_ERROR(ReadString(o->name(), kMaxObjectNameBytes, "name", &n.name));
          r.objects.push_back(std::move(n));
        }
      }
      return Message(std::move(r));
    }
    case w::Message_SubscribeRequest: {
      SubscribeRequest r;
      MB_RETURN_IF_ERROR(ReadString(env->body_as_SubscribeRequest()->prefix(), kMaxObjectNameBytes, "prefix", &r.prefix));
      return Message(std::move(r));
    }
    case w::Message_WaitEventsRequest:
      return Message(WaitEventsRequest{env->body_as_WaitEventsRequest()->timeout_ms()});
    case w::Message_EventsReply: {
      auto m = env->body_as_EventsReply();
      EventsReply r;
      r.dropped = m->dropped();
      if (auto es = m->events()) {
        if (es->size() > kMaxEventsPerReply) return Malformed("too many events");
        for (const auto* e : *es) {
          if (e->kind() > w::NameEventKind_MAX) return Malformed("unknown event kind");
          NameEvent n{static_cast<NameEventKind>(e->kind()), "", e->allocation(), e->pid()};
          MB_RETURN_IF_ERROR(ReadString(e->name(), kMaxObjectNameBytes, "name", &n.name));
          r.events.push_back(std::move(n));
        }
      }
      return Message(std::move(r));
    }
    case w::Message_PingRequest:
      return Message(PingRequest{});
    case w::Message_GoodbyeRequest:
      return Message(GoodbyeRequest{});
    case w::Message_OkReply:
      return Message(OkReply{});
    case w::Message_ErrorReply: {
      auto m = env->body_as_ErrorReply();
      ErrorReply r;
      auto code = static_cast<int>(m->code());
      r.code = (code >= 0 && code <= static_cast<int>(w::ErrorCode_MAX))
                   ? static_cast<ErrorCode>(code)
                   : ErrorCode::kInternal;
      MB_RETURN_IF_ERROR(
          ReadString(m->message(), kMaxErrorMessageBytes, "message", &r.message));
      return Message(std::move(r));
    }
    case w::Message_NONE:
      return Malformed("envelope has no body");
  }
  return Malformed("unknown message type " + std::to_string(env->body_type()));
}

}  // namespace

std::vector<uint8_t> Encode(const Envelope& env) {
  fb::FlatBufferBuilder b(256);
  auto [type, body] = std::visit(Encoder{b}, env.body);
  auto root = w::CreateEnvelope(b, env.protocol_version, env.request_id, env.flags, type, body);
  b.Finish(root);
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
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
  static constexpr const char* kNames[] = {
      "HelloRequest",  "HelloReply",  "MallocRequest", "MallocReply", "FreeRequest",
      "ExportRequest", "ExportReply", "SetPidRequest", "ImportRequest", "ImportReply",
      "PingRequest",   "GoodbyeRequest", "OkReply",    "ErrorReply", "RegisterHostRequest",
      "UnregisterHostRequest", "EngineInitRequest", "EngineFinalizeRequest",
      "EngineRegisterRequest", "EngineRegisterReply", "EngineDeregisterRequest",
      "EngineConnectRequest", "EngineRegionsRequest", "EngineInfoReply", "EngineImportRequest",
      "EngineReleaseRequest", "EngineDisconnectRequest", "EngineNotifyRequest",
      "EngineGetNotifiesRequest", "EngineNotifiesReply", "PublishRequest", "LookupRequest",
      "UnpublishRequest", "ListNamesRequest", "ListNamesReply", "SubscribeRequest",
      "WaitEventsRequest", "EventsReply"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[body.index()];
}

size_t ExpectedFds(const Message& body) {
  return (std::holds_alternative<MallocReply>(body) || std::holds_alternative<ImportReply>(body))
             ? 1
             : 0;
}

}  // namespace membroker::ipc
