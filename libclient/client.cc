#include "membroker/client.h"

#include "client_core.h"
#include "membroker/ipc/framing.h"

namespace membroker {

using detail::ClientCore;

namespace detail {
Status ClientCore::Handshake(const std::string& client_name) {
  MB_ASSIGN_OR_RETURN(Reply r, conn_.Call(ipc::HelloRequest{client_name, ipc::kProtocolVersion, 0}));
  auto* hello = std::get_if<ipc::HelloReply>(&r.body);
  if (hello == nullptr) return Status(ErrorCode::kProtocolError, "handshake got no HelloReply");
  client_id_ = hello->client_id;
  granularities_ = hello->granularities;
  return Status::Ok();
}
}  // namespace detail

namespace {
Status Empty(const char* what) {
  return Status(ErrorCode::kInvalidHandle, std::string(what) + " is empty (moved from or released)");
}
Status NotConnectedClient() { return Status(ErrorCode::kNotConnected, "client is not connected"); }
}  // namespace

Result<Client> Client::Connect(const ConnectOptions& options) {
  if (options.client_name.size() > ipc::kMaxClientNameBytes)
    return Status(ErrorCode::kParamInvalid, "client name longer than 256 bytes");
  auto sock = ipc::ConnectSeqpacket(options.socket_path);
  if (!sock.ok())
    return Status(ErrorCode::kNotConnected,
                  "cannot reach membrokerd at " + options.socket_path + ": " + sock.status().message());
  auto core = std::make_shared<ClientCore>(std::move(*sock));
  MB_RETURN_IF_ERROR(core->Handshake(options.client_name));
  return Client(std::move(core));
}

uint64_t Client::client_id() const { return core_ ? core_->client_id() : 0; }

Result<size_t> Client::GetAllocationGranularity(const AllocationProp& prop,
                                                GranularityOption option) const {
  if (!core_) return NotConnectedClient();
  return core_->Granularity(prop.page_policy, option);
}

Result<PhysicalHandle> Client::MallocPhysical(size_t size, const AllocationProp& prop) {
  if (!core_) return NotConnectedClient();
  if (size == 0) return Status(ErrorCode::kParamInvalid, "size must not be zero");
  MB_ASSIGN_OR_RETURN(detail::Reply r,
                      core_->conn().Call(ipc::MallocRequest{
                          size, static_cast<ipc::PagePolicy>(prop.page_policy), 0}));
  auto* m = std::get_if<ipc::MallocReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "MallocRequest got a wrong reply");
  PhysicalHandle h;
  h.core_ = core_;
  h.id_ = m->handle;
  h.size_ = m->size;
  h.page_size_ = m->page_size;
  core_->AddHandle(m->handle, std::move(r.fds[0]), m->size, m->page_size, false);
  return h;
}

Status Client::FreePhysical(PhysicalHandle& handle) {
  if (!handle.core_) return Empty("PhysicalHandle");
  auto core = std::move(handle.core_);
  return core->FreeHandle(handle.id_);
}

Result<Reservation> Client::ReserveMemAddress(size_t size, size_t alignment, void* expected_addr) {
  if (!core_) return NotConnectedClient();
  MB_ASSIGN_OR_RETURN(void* base, core_->Reserve(size, alignment, expected_addr));
  Reservation r;
  r.core_ = core_;
  r.base_ = base;
  r.size_ = size;
  return r;
}

Status Client::ReleaseMemAddress(Reservation& reservation) {
  if (!reservation.core_) return Empty("Reservation");
  MB_RETURN_IF_ERROR(reservation.core_->Release(reservation.base_, /*force=*/false));
  reservation.core_.reset();
  return Status::Ok();
}

Result<Mapping> Client::MapMem(void* va, size_t size, size_t offset, const PhysicalHandle& handle) {
  if (!core_) return NotConnectedClient();
  if (!handle.core_) return Empty("PhysicalHandle");
  if (handle.core_ != core_)
    return Status(ErrorCode::kInvalidHandle, "handle belongs to another Client");
  MB_ASSIGN_OR_RETURN(uint64_t map_id, core_->Map(va, size, offset, handle.id_));
  Mapping m;
  m.core_ = core_;
  m.va_ = va;
  m.size_ = size;
  m.map_id_ = map_id;
  return m;
}

Status Client::UnmapMem(Mapping& mapping) {
  if (!mapping.core_) return Status(ErrorCode::kNotMapped, "mapping is empty (already unmapped)");
  auto core = std::move(mapping.core_);
  return core->Unmap(mapping.va_, mapping.map_id_);
}

Status Client::MemSetAccess(void* va, size_t size, Access access) {
  if (!core_) return NotConnectedClient();
  return core_->SetAccess(va, size, access);
}

Result<std::string> Client::ExportToShareableHandle(const PhysicalHandle& handle, uint32_t flags) {
  if (!core_) return NotConnectedClient();
  if (!handle.core_) return Empty("PhysicalHandle");
  if (!handle.core_->HoldsUnfreed(handle.id_)) return Empty("PhysicalHandle");
  MB_ASSIGN_OR_RETURN(detail::Reply r,
                      handle.core_->conn().Call(ipc::ExportRequest{handle.id_, flags}));
  auto* m = std::get_if<ipc::ExportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "ExportRequest got a wrong reply");
  return std::move(m->token);
}

Status Client::SetPidToShareableHandle(const std::string& token, std::span<const pid_t> pids) {
  if (!core_) return NotConnectedClient();
  if (pids.size() > ipc::kMaxPidsPerRequest)
    return Status(ErrorCode::kParamInvalid, "at most 1024 pids per call");
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::SetPidRequest{
                                           token, std::vector<int32_t>(pids.begin(), pids.end())}));
  return Status::Ok();
}

Result<PhysicalHandle> Client::ImportFromShareableHandle(const std::string& token) {
  if (!core_) return NotConnectedClient();
  if (token.empty() || token.size() > ipc::kMaxTokenBytes)
    return Status(ErrorCode::kParamInvalid, "token is empty or too long");
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::ImportRequest{token}));
  auto* m = std::get_if<ipc::ImportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "ImportRequest got a wrong reply");
  PhysicalHandle h;
  h.core_ = core_;
  h.id_ = m->handle;
  h.size_ = m->size;
  h.page_size_ = m->page_size;
  h.read_only_ = m->read_only;
  core_->AddHandle(m->handle, std::move(r.fds[0]), m->size, m->page_size, m->read_only);
  return h;
}

Status Client::Ping() {
  if (!core_) return NotConnectedClient();
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::PingRequest{}));
  return Status::Ok();
}

uint64_t Client::async_errors() const { return core_ ? core_->conn().async_errors() : 0; }
Status Client::last_async_error() const {
  return core_ ? core_->conn().last_async_error() : Status::Ok();
}

// ---- RAII types ---------------------------------------------------------------

PhysicalHandle::~PhysicalHandle() {
  if (core_) (void)core_->FreeHandle(id_);
}
PhysicalHandle::PhysicalHandle(PhysicalHandle&& o) noexcept { *this = std::move(o); }
PhysicalHandle& PhysicalHandle::operator=(PhysicalHandle&& o) noexcept {
  if (this != &o) {
    if (core_) (void)core_->FreeHandle(id_);
    core_ = std::move(o.core_);
    id_ = o.id_;
    size_ = o.size_;
    page_size_ = o.page_size_;
    read_only_ = o.read_only_;
  }
  return *this;
}

Reservation::~Reservation() {
  if (core_) (void)core_->Release(base_, /*force=*/true);
}
Reservation::Reservation(Reservation&& o) noexcept { *this = std::move(o); }
Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    if (core_) (void)core_->Release(base_, /*force=*/true);
    core_ = std::move(o.core_);
    base_ = o.base_;
    size_ = o.size_;
  }
  return *this;
}

Mapping::~Mapping() {
  if (core_) (void)core_->Unmap(va_, map_id_);
}
Mapping::Mapping(Mapping&& o) noexcept { *this = std::move(o); }
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (core_) (void)core_->Unmap(va_, map_id_);
    core_ = std::move(o.core_);
    va_ = o.va_;
    size_ = o.size_;
    map_id_ = o.map_id_;
  }
  return *this;
}

}  // namespace membroker
