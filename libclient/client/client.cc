#include "membroker/client.h"

#include "client/client_core.h"
#include "client/device_vmm.h"
#include "membroker/ipc/cuda_driver.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/syscall.h"

#include <sys/mman.h>

namespace membroker {

using detail::ClientCore;

// The public API's enums and flags mirror the protocol's (which protocol.cc
// checks against the schema): the values cross the wire as they are.
static_assert(kExportNoPidCheck == ipc::kExportNoPidCheck && kExportReadOnly == ipc::kExportReadOnly);
static_assert(kPublishReadOnly == ipc::kPublishReadOnly && kPublishPersist == ipc::kPublishPersist &&
              kPublishReplace == ipc::kPublishReplace && kPublishCluster == ipc::kPublishCluster);
static_assert(static_cast<int>(PagePolicy::kNormalOnly) == static_cast<int>(ipc::PagePolicy::kNormalOnly) &&
              static_cast<int>(PagePolicy::kHugeFirst) == static_cast<int>(ipc::PagePolicy::kHugeFirst) &&
              static_cast<int>(PagePolicy::kHugeOnly) == static_cast<int>(ipc::PagePolicy::kHugeOnly) &&
              static_cast<int>(PagePolicy::kHuge1GOnly) == static_cast<int>(ipc::PagePolicy::kHuge1GOnly));
static_assert(static_cast<int>(NameEventKind::kPublished) == static_cast<int>(ipc::NameEventKind::kPublished) &&
              static_cast<int>(NameEventKind::kUnpublished) == static_cast<int>(ipc::NameEventKind::kUnpublished) &&
              static_cast<int>(NameEventKind::kHolderDied) == static_cast<int>(ipc::NameEventKind::kHolderDied));

namespace detail {
Status ClientCore::Handshake() {
  MB_ASSIGN_OR_RETURN(Reply r, conn_.Call(ipc::HelloRequest{options_.client_name, ipc::kProtocolVersion, 0}));
  auto* hello = std::get_if<ipc::HelloReply>(&r.body);
  if (hello == nullptr) return Status(ErrorCode::kProtocolError, "handshake got no HelloReply");
  client_id_ = hello->client_id;
  granularities_ = hello->granularities;
  cluster_host_ = hello->host;
  return Status::Ok();
}
}  // namespace detail

namespace {
Status Empty(const char* what) {
  return Status(ErrorCode::kInvalidHandle, std::string(what) + " is empty (moved from or released)");
}
// A handle, mapping or reservation is used through the Client that made it
// only: through another, the call would act on the first one's memory.
Status Owned(const std::shared_ptr<detail::ClientCore>& client, const std::shared_ptr<detail::ClientCore>& owner,
             const char* what) {
  if (!owner) return Empty(what);
  if (owner != client) return Status(ErrorCode::kInvalidHandle, std::string(what) + " belongs to another Client");
  return Status::Ok();
}
}  // namespace

Result<Client> Client::Connect(const ConnectOptions& options) {
  if (!options.client_name.empty())
    MB_RETURN_IF_ERROR(ipc::CheckName(options.client_name, ipc::kMaxClientNameBytes, "the client name"));
  auto sock = ipc::ConnectSeqpacket(options.socket_path);
  if (!sock.ok())
    return Status(ErrorCode::kNotConnected,
                  "cannot reach membrokerd at " + options.socket_path + ": " + sock.status().message());
  if (options.call_timeout_ms == 0)
    return Status(ErrorCode::kParamInvalid, "call_timeout_ms must be positive (every wait has a bound)");
  auto core = std::make_shared<ClientCore>(std::move(*sock), options);
  MB_RETURN_IF_ERROR(core->Handshake());
  MB_RETURN_IF_ERROR(core->StartWatcher());
  return Client(std::move(core));
}

uint64_t Client::client_id() const { return core_ ? core_->client_id() : 0; }
std::string Client::cluster_host() const { return core_ ? core_->cluster_host() : ""; }

Result<size_t> Client::GetAllocationGranularity(const AllocationProp& prop,
                                                GranularityOption option) const {
  if (!core_) return detail::NotConnectedClient();
  if (prop.location.type == MemLocation::kDevice)
    return ipc::CudaDriver::Get().Granularity(prop.location.id, option == GranularityOption::kRecommended);
  return core_->Granularity(prop.page_policy, option);
}

Result<PhysicalHandle> Client::MallocPhysical(size_t size, const AllocationProp& prop) {
  if (!core_) return detail::NotConnectedClient();
  if (size == 0) return Status(ErrorCode::kParamInvalid, "size must not be zero");
  if (prop.page_policy > PagePolicy::kHuge1GOnly)
    return Status(ErrorCode::kParamInvalid,
                  "unknown page policy " + std::to_string(static_cast<int>(prop.page_policy)));
  uint32_t flags = (prop.pinned ? ipc::kMallocPinned : 0) |
                   (prop.same_address ? ipc::kMallocSameAddress : 0) |
                   (prop.exported ? ipc::kMallocExport : 0);
  MB_ASSIGN_OR_RETURN(
      detail::Reply r,
      core_->conn().Call(ipc::MallocRequest{size, static_cast<ipc::PagePolicy>(prop.page_policy), flags,
                                            prop.exported ? prop.export_flags : 0,
                                            prop.location.type == MemLocation::kDevice ? prop.location.id : -1}));
  auto* m = std::get_if<ipc::MallocReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "MallocRequest got a wrong reply");
  PhysicalHandle h = AdoptHandle(m->handle, std::move(r.fds[0]), m->size, m->page_size,
                                 /*read_only=*/false, m->pinned, m->fixed_address, /*created=*/true, m->device);
  if (!m->token.empty()) core_->journal().RecordExport(m->token, m->handle, prop.export_flags);
  h.fell_back_ = m->fell_back;
  h.from_pool_ = m->from_pool;
  h.export_token_ = std::move(m->token);
  h.export_flags_ = prop.export_flags;
  return h;
}

PhysicalHandle Client::AdoptHandle(uint64_t id, ipc::UniqueFd fd, uint64_t size, uint64_t page_size, bool read_only,
                                   bool pinned, uint64_t fixed_address, bool created, int device) {
  core_->AddHandle(id, std::move(fd), size, page_size, read_only, fixed_address, pinned, created, device);
  PhysicalHandle h;
  h.core_ = core_;
  h.id_ = id;
  h.size_ = size;
  h.page_size_ = page_size;
  h.read_only_ = read_only;
  h.pinned_ = pinned;
  h.fixed_address_ = fixed_address;
  h.device_ = device;
  return h;
}

Status Client::FreePhysical(PhysicalHandle& handle) {
  MB_RETURN_IF_ERROR(Owned(core_, handle.core_, "PhysicalHandle"));
  auto core = std::move(handle.core_);
  return core->FreeHandle(handle.id_);
}

Result<Reservation> Client::ReserveMemAddress(size_t size, size_t alignment, void* expected_addr,
                                              uint32_t flags) {
  if (!core_) return detail::NotConnectedClient();
  MB_ASSIGN_OR_RETURN(void* base, core_->Reserve(size, alignment, expected_addr, flags));
  Reservation r;
  r.core_ = core_;
  r.base_ = base;
  r.size_ = size;
  return r;
}

Status Client::ReleaseMemAddress(Reservation& reservation) {
  MB_RETURN_IF_ERROR(Owned(core_, reservation.core_, "Reservation"));
  MB_RETURN_IF_ERROR(reservation.core_->Release(reservation.base_, /*force=*/false));
  reservation.core_.reset();
  return Status::Ok();
}

Result<Mapping> Client::MapMem(void* va, size_t size, size_t offset, const PhysicalHandle& handle,
                               uint32_t flags) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(Owned(core_, handle.core_, "PhysicalHandle"));
  MB_ASSIGN_OR_RETURN(uint64_t map_id, core_->Map(va, size, offset, handle.id_, flags));
  Mapping m;
  m.core_ = core_;
  m.va_ = va;
  m.size_ = size;
  m.map_id_ = map_id;
  return m;
}

Status Client::UnmapMem(Mapping& mapping) {
  if (!mapping.core_) return Status(ErrorCode::kNotMapped, "mapping is empty (already unmapped)");
  MB_RETURN_IF_ERROR(Owned(core_, mapping.core_, "Mapping"));
  auto core = std::move(mapping.core_);
  return core->Unmap(mapping.va_, mapping.map_id_);
}

Status Client::MemSetAccess(void* va, size_t size, Access access) {
  if (!core_) return detail::NotConnectedClient();
  return core_->SetAccess(va, size, access);
}

Result<std::string> Client::ExportToShareableHandle(const PhysicalHandle& handle, uint32_t flags) {
  if (!core_) return detail::NotConnectedClient();
  MB_RETURN_IF_ERROR(Owned(core_, handle.core_, "PhysicalHandle"));
  if (!handle.core_->HoldsUnfreed(handle.id_)) return Empty("PhysicalHandle");
  // Exported when it was made, with these flags: the broker has it already.
  if (!handle.export_token_.empty() && flags == handle.export_flags_) return handle.export_token_;
  MB_ASSIGN_OR_RETURN(detail::Reply r,
                      handle.core_->conn().Call(ipc::ExportRequest{handle.id_, flags}));
  auto* m = std::get_if<ipc::ExportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "ExportRequest got a wrong reply");
  handle.core_->journal().RecordExport(m->token, handle.id_, flags);
  return std::move(m->token);
}

Status Client::SetPidToShareableHandle(const std::string& token, std::span<const pid_t> pids) {
  if (!core_) return detail::NotConnectedClient();
  if (pids.size() > ipc::kMaxPidsPerRequest)
    return Status(ErrorCode::kParamInvalid, "at most 1024 pids per call");
  if (token.empty() || token.size() > ipc::kMaxTokenBytes)  // cannot be a token: none by that name
    return Status(ErrorCode::kNotFound, "no such token exported by this client");
  // Each pid with its process's start time, so a reattach after a broker
  // restart allows the same processes, never a later one with a recycled pid.
  std::vector<ipc::AllowedPid> allowed;
  for (pid_t p : pids) {
    auto start = ipc::ProcessStartTime(p);
    allowed.push_back({p, start.ok() ? *start : 0});
  }
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::SetPidRequest{
                                           token, std::vector<int32_t>(pids.begin(), pids.end())}));
  core_->journal().RecordPids(token, std::move(allowed));
  return Status::Ok();
}

Result<PhysicalHandle> Client::ImportFromShareableHandle(const std::string& token) {
  if (!core_) return detail::NotConnectedClient();
  if (token.empty() || token.size() > ipc::kMaxTokenBytes)  // cannot be a token (docs: NOT_FOUND)
    return Status(ErrorCode::kNotFound, "unknown token (empty or longer than 128 bytes)");
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::ImportRequest{token}));
  auto* m = std::get_if<ipc::ImportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "ImportRequest got a wrong reply");
  return AdoptHandle(m->handle, std::move(r.fds[0]), m->size, m->page_size, m->read_only, m->pinned, m->fixed_address,
                     /*created=*/false, m->device);
}

Result<void*> Client::MallocHost(size_t size) {
  AllocationProp prop;
  prop.pinned = true;
  MB_ASSIGN_OR_RETURN(PhysicalHandle h, MallocPhysical(size, prop));
  MB_ASSIGN_OR_RETURN(void* base, core_->Reserve(h.size(), 0, nullptr, 0));
  auto mapped = core_->Map(base, h.size(), 0, h.id_, kMapPopulate);
  auto cuda = mapped.ok() ? detail::device::RegisterHost(base, h.size()) : Result<bool>(mapped.status());
  if (!cuda.ok()) {
    (void)core_->Release(base, /*force=*/true);
    return cuda.status();
  }
  // The core owns it from here: FreeHost unregisters, unmaps and releases it.
  if (*cuda) core_->NoteCudaRegistered(base);
  core_->AddHostAlloc(base, h.id_);
  h.core_.reset();
  return base;
}

Status Client::FreeHost(void* ptr) {
  if (!core_) return detail::NotConnectedClient();
  Status cuda = core_->TakeCudaRegistered(ptr) ? detail::device::UnregisterHost(ptr) : Status::Ok();
  MB_RETURN_IF_ERROR(core_->FreeHostAlloc(ptr));
  return cuda;
}

Status Client::HostRegister(void* ptr, size_t size, uint32_t flags) {
  if (!core_) return detail::NotConnectedClient();
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || size == 0 || addr % 4096 != 0 || size % 4096 != 0)
    return Status(ErrorCode::kParamInvalid,
                  "HostRegister needs a non-null pointer and a non-zero size, both multiples of 4096");
  MB_ASSIGN_OR_RETURN(detail::Reply r,
                      core_->conn().Call(ipc::RegisterHostRequest{addr, size, flags}));
  if (::mlock(ptr, size) != 0) {
    int err = errno;
    (void)core_->conn().SendOneWay(ipc::UnregisterHostRequest{addr});
    return ipc::ErrnoStatus("mlock", std::to_string(size) + " bytes", err,
                            {{ENOMEM, ErrorCode::kParamInvalid,
                              "is the whole range mapped? is RLIMIT_MEMLOCK large enough?"}});
  }
  auto cuda = detail::device::RegisterHost(ptr, size);
  if (!cuda.ok()) {
    ::munlock(ptr, size);
    (void)core_->conn().SendOneWay(ipc::UnregisterHostRequest{addr});
    return cuda.status();
  }
  if (*cuda) core_->NoteCudaRegistered(ptr);
  return core_->AddHostRegistration(ptr, size);
}

Status Client::HostUnregister(void* ptr) {
  if (!core_) return detail::NotConnectedClient();
  MB_ASSIGN_OR_RETURN(size_t size, core_->TakeHostRegistration(ptr));
  Status cuda = core_->TakeCudaRegistered(ptr) ? detail::device::UnregisterHost(ptr) : Status::Ok();
  ::munlock(ptr, size);
  Status sent = core_->conn().SendOneWay(ipc::UnregisterHostRequest{reinterpret_cast<uintptr_t>(ptr)});
  MB_RETURN_IF_ERROR(cuda);
  return sent;
}

Status Client::Ping() {
  if (!core_) return detail::NotConnectedClient();
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::PingRequest{}));
  return Status::Ok();
}

uint64_t Client::reattaches() const { return core_ ? core_->reattaches() : 0; }
ReattachReport Client::last_reattach() const { return core_ ? core_->last_reattach() : ReattachReport{}; }
Status Client::WaitForReattach(uint64_t count, int timeout_ms) const {
  if (!core_) return detail::NotConnectedClient();
  return core_->WaitForReattach(count, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms));
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
    pinned_ = o.pinned_;
    fell_back_ = o.fell_back_;
    from_pool_ = o.from_pool_;
    device_ = o.device_;
    fixed_address_ = o.fixed_address_;
    export_token_ = std::move(o.export_token_);
    export_flags_ = o.export_flags_;
    metadata_ = std::move(o.metadata_);
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
