// Client calls for named objects and their events (docs/PIPELINE.md, "Named objects").
#include "client/client_core.h"
#include "membroker/client.h"
#include "membroker/ipc/escape.h"

namespace membroker {

namespace {
Status CheckName(const std::string& name) {
  return ipc::CheckName(name, ipc::kMaxObjectNameBytes, "a name");
}
uint32_t Millis(int timeout_ms) { return timeout_ms < 0 ? 0 : static_cast<uint32_t>(timeout_ms); }
}  // namespace

Status Client::Publish(const std::string& name, const PhysicalHandle& handle, uint32_t flags,
                       std::string_view metadata) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(CheckName(name));
  if (metadata.size() > ipc::kMaxObjectMetadataBytes)
    return Status(ErrorCode::kParamInvalid, "metadata is at most 4096 bytes");
  if (handle.valid() && handle.core_ != core_)
    return Status(ErrorCode::kInvalidHandle, "PhysicalHandle belongs to another Client");
  if (!handle.valid() || !core_->HoldsUnfreed(handle.id()))
    return Status(ErrorCode::kInvalidHandle, "PhysicalHandle is empty or freed");
  MB_RETURN_IF_ERROR(
      core_->conn().Call(ipc::PublishRequest{name, handle.id(), flags, std::string(metadata)}).status());
  core_->journal().RecordPublication(name, handle.id(), flags, std::string(metadata));  // for a reattach
  return Status::Ok();
}

Result<PhysicalHandle> Client::Lookup(const std::string& name, int timeout_ms) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(CheckName(name));
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::LookupRequest{name, Millis(timeout_ms)},
                                                             std::chrono::milliseconds(Millis(timeout_ms))));
  auto* m = std::get_if<ipc::ImportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "LookupRequest got a wrong reply");
  PhysicalHandle h = AdoptHandle(m->handle, std::move(r.fds[0]), m->size, m->page_size, m->read_only, m->pinned,
                                 m->fixed_address, /*created=*/false, m->device);
  h.metadata_ = std::move(m->metadata);
  return h;
}

Result<ClusterNameInfo> Client::LookupCluster(const std::string& name, int timeout_ms) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(CheckName(name));
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::ClusterLookupRequest{name, Millis(timeout_ms)},
                                                             std::chrono::milliseconds(Millis(timeout_ms))));
  auto* m = std::get_if<ipc::ClusterLookupReply>(&r.body);
  if (m == nullptr || m->host.empty()) return Status(ErrorCode::kProtocolError, "ClusterLookupRequest got a wrong reply");
  return ClusterNameInfo{std::move(m->host), m->generation, static_cast<size_t>(m->size), m->read_only,
                         std::move(m->metadata), m->allocation};
}

Status Client::Unpublish(const std::string& name) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(CheckName(name));
  MB_RETURN_IF_ERROR(core_->conn().Call(ipc::UnpublishRequest{name}).status());
  core_->journal().ForgetPublication(name);
  return Status::Ok();
}

Result<std::vector<NamedObjectInfo>> Client::ListNames(const std::string& prefix) {
  if (!core_) return detail::NotConnectedClient();
  if (prefix.size() > ipc::kMaxObjectNameBytes) return Status(ErrorCode::kParamInvalid, "prefix too long");
  // Every name, a page of at most 128 at a time, each after the last one
  // of the page before: no silent cap. A page that does not move on is the
  // broker's error, not a loop.
  std::vector<NamedObjectInfo> out;
  std::string after;
  for (;;) {
    MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::ListNamesRequest{prefix, after}));
    auto* m = std::get_if<ipc::ListNamesReply>(&r.body);
    if (m == nullptr) return Status(ErrorCode::kProtocolError, "ListNamesRequest got a wrong reply");
    for (auto& o : m->objects) {
      if (!after.empty() && o.name <= after)
        return Status(ErrorCode::kProtocolError, "ListNames: the broker's pages went backwards");
      after = o.name;
      out.push_back({std::move(o.name), o.allocation, o.size, o.read_only, o.persist, o.publisher_pid});
    }
    if (!m->truncated) return out;
    if (m->objects.empty()) return Status(ErrorCode::kProtocolError, "ListNames: an empty page that says more follow");
  }
}

Status Client::Subscribe(const std::string& prefix) { return Subscribe(prefix, false); }
Status Client::SubscribeCluster(const std::string& prefix) { return Subscribe(prefix, true); }

Status Client::Subscribe(const std::string& prefix, bool cluster) {
  if (!core_) return detail::NotConnectedClient();
  if (prefix.size() > ipc::kMaxObjectNameBytes) return Status(ErrorCode::kParamInvalid, "prefix too long");
  MB_RETURN_IF_ERROR(core_->conn().Call(ipc::SubscribeRequest{prefix, cluster}).status());
  core_->journal().RecordSubscription(prefix, cluster);
  return Status::Ok();
}

Result<NameEvents> Client::WaitEvents(int timeout_ms) {
  if (!core_) return detail::NotConnectedClient();
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::WaitEventsRequest{Millis(timeout_ms)},
                                                             std::chrono::milliseconds(Millis(timeout_ms))));
  auto* m = std::get_if<ipc::EventsReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "WaitEventsRequest got a wrong reply");
  NameEvents out;
  out.dropped = m->dropped;
  for (auto& e : m->events)
    out.events.push_back({static_cast<NameEventKind>(e.kind), std::move(e.name), e.allocation, e.pid, std::move(e.host)});
  return out;
}

Result<int> Client::WakeFd() {
  if (!core_) return detail::NotConnectedClient();
  return core_->WakeFd();
}

void Client::DrainWakeFd() {
  if (core_) core_->wake().Drain();
}

}  // namespace membroker
