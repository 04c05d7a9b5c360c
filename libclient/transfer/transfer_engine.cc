// TransferEngine: the engine's name and options, its registered ranges,
// its connections and transfers over two transports (transfer/transport.h):
// same_host/ for engines at this host's broker, and the network module
// (transfer/net_transport.h, UCX) for engines of other hosts, started on first
// use so that a process that never asks for the network never maps UCX. The
// state is TransferEngine::Impl's (transfer/engine_impl.h).
#include "membroker/transfer_engine.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "transfer/engine_impl.h"
#include "transfer/net_address.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/ranges.h"
#include "membroker/ipc/syscall.h"

namespace membroker {

using namespace engine_detail;  // the helpers the Impl files share

Status TransferEngine::Impl::Initialize(const std::string& name, const std::map<std::string, std::string>& options) {
  if (!core_) return Status(ErrorCode::kNotConnected, "the client is not connected");
  if (initialized_) return Status(ErrorCode::kAlreadyExists, "engine already initialized as \"" + name_ + "\"");
  MB_RETURN_IF_ERROR(ipc::CheckName(name, ipc::kMaxEngineNameBytes, "an engine name"));
  size_t copy_threads = 4, async_threads = 2, drain_timeout_ms = 10'000;
  for (const auto& [key, value] : options) {
    if (key == "listen_address" || key == "secret_file" || key == "allow_from") continue;  // ConfigureNetwork
    size_t* target = key == "copy_threads"       ? &copy_threads
                     : key == "async_threads"    ? &async_threads
                     : key == "drain_timeout_ms" ? &drain_timeout_ms
                                                 : nullptr;
    if (target == nullptr) return Status(ErrorCode::kParamInvalid, "unknown engine option \"" + key + "\"");
    const unsigned long max = target == &drain_timeout_ms ? 600'000 : 64;
    char* end = nullptr;
    unsigned long v = std::strtoul(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < 1 || v > max)
      return Status(ErrorCode::kParamInvalid, "option " + key + " must be 1 to " + std::to_string(max));
    *target = v;
  }
  if (detail::LooksLikeHostPort(name))
    return Status(ErrorCode::kParamInvalid,
                  "an engine name cannot have the shape ip:port (that is how remote "
                  "engines are named); give the address as option listen_address");
  std::array<uint8_t, 16> identity;
  if (::getrandom(identity.data(), identity.size(), 0) != static_cast<ssize_t>(identity.size()))
    return Status(ErrorCode::kInternal, "getrandom failed for the engine's identity");
  MB_ASSIGN_OR_RETURN(net_options_, detail::ParseNetOptions(name, identity, options));
  drain_timeout_ = std::chrono::milliseconds(drain_timeout_ms);
  // The broker takes the name here: the same-host transport registers it.
  MB_ASSIGN_OR_RETURN(same_host_,
                      detail::SameHostTransport::Start(client_, core_, name, identity, {copy_threads, drain_timeout_}));
  name_ = name;
  if (!net_options_.listen.empty()) {
    if (auto net = Net(); !net.ok()) {
      same_host_.reset();  // gives the name back
      net_options_ = {};
      return net.status();
    }
    ReportNetwork();
  }
  async_pool_.Start(async_threads);
  initialized_ = true;
  return Status::Ok();
}

void TransferEngine::Impl::Finalize() {
  if (!initialized_) return;
  async_pool_.Stop();  // runs what is queued (bounded by each request's timeout)
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (const auto& [key, c] : conns_) keys.push_back(key);
  }
  for (const auto& key : keys) (void)Disconnect(key, 60'000);
  {
    // Connectors on other hosts lose us now: the transport closes their
    // connections and unmaps our ranges before they are deregistered below.
    std::lock_guard<std::mutex> lk(net_mu_);
    net_.reset();
    net_options_ = {};
  }
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  same_host_.reset();  // gives the name back; waits (bounded) for peers inside our memory
  for (const auto& [addr, r] : local_) core_->ForgetEngineRange(addr);
  local_.clear();
  initialized_ = false;
}

Status TransferEngine::Impl::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle,
                                         const std::string& name) {
  if (!initialized_) return NotInitialized();
  if (!name.empty()) MB_RETURN_IF_ERROR(ipc::CheckName(name, ipc::kMaxRegionNameBytes, "a region name"));
  if (type != MEM_HOST && type != MEM_DEVICE) return Status(ErrorCode::kParamInvalid, "unknown memory type");
  if (mem.len == 0 || mem.addr == 0 || mem.addr % kRegionAlign || mem.len % kRegionAlign)
    return Status(ErrorCode::kParamInvalid, "addr and len must be non-zero multiples of 4096");
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  if (ipc::Overlaps(local_, mem.addr, mem.len, [](const LocalRegion& r) { return r.desc.length; }))
    return Status(ErrorCode::kParamInvalid, "range overlaps memory this engine already registered");
  if (!name.empty())
    for (const auto& [addr, r] : local_)
      if (r.desc.name == name)
        return Status(ErrorCode::kAlreadyExists, "this engine has a range named \"" + name + "\" already");
  // Pinned: not unmappable, protectable or host-unregistered until DeregisterMem.
  MB_ASSIGN_OR_RETURN(detail::EngineRange where, core_->PinForEngine(mem.addr, mem.len, name, type == MEM_DEVICE));
  const RegionDesc desc{.handle = next_handle_++,
                        .address = mem.addr,
                        .length = mem.len,
                        .read_only = where.read_only,
                        .allocation = where.handle,
                        .offset = where.offset,
                        .name = name,
                        .device = where.device};
  Status st = same_host_->AddRegion(desc);
  // Known to the network transport too where the engine has one (device
  // memory as well: the transport copies it with the driver on its side).
  detail::NetTransport* net = st.ok() ? CurrentNet() : nullptr;
  if (net != nullptr) st = net->AddRegion(desc);
  if (!st.ok()) {
    (void)same_host_->RemoveRegion(desc.handle, Clock::now() + drain_timeout_);
    core_->ForgetEngineRange(mem.addr);
    return st;
  }
  local_[mem.addr] = LocalRegion{desc};
  handle = reinterpret_cast<MemHandle>(static_cast<uintptr_t>(desc.handle));
  return Status::Ok();
}

Status TransferEngine::Impl::DeregisterMem(MemHandle handle) {
  if (!initialized_) return NotInitialized();
  const uint64_t h = reinterpret_cast<uintptr_t>(handle);
  // Exclusive: our own transfers that may use it finish first.
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  auto it = std::find_if(local_.begin(), local_.end(), [&](const auto& kv) { return kv.second.desc.handle == h; });
  if (it == local_.end())
    return Status(ErrorCode::kParamInvalid, "unknown MemHandle (never registered, or deregistered)");
  it->second.draining = true;
  // Each transport takes it from its peers and waits for those inside it
  // (TIMEOUT: it stays locked here; a later call waits again).
  MB_RETURN_IF_ERROR(same_host_->RemoveRegion(h, Clock::now() + drain_timeout_));
  detail::NetTransport* net = CurrentNet();
  if (net != nullptr) MB_RETURN_IF_ERROR(net->RemoveRegion(h, Clock::now() + drain_timeout_));
  core_->ForgetEngineRange(it->first);
  local_.erase(it);
  return Status::Ok();
}

std::shared_ptr<Connection> TransferEngine::Impl::Find(const std::string& remote) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  auto it = conns_.find(remote);
  return it == conns_.end() ? nullptr : it->second;
}

Status TransferEngine::Impl::Connect(const std::string& remote, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  const bool by_address = detail::LooksLikeHostPort(remote);
  if (!by_address) MB_RETURN_IF_ERROR(ipc::CheckName(remote, ipc::kMaxEngineNameBytes, "a remote engine name"));
  if (auto old = Find(remote)) {
    if (!old->transport->Lost(old->id))
      return Status(ErrorCode::kAlreadyConnected,
                    "already connected to " + (by_address ? remote : "engine \"" + remote + "\""));
    (void)Disconnect(remote, timeout_ms);  // the old peer went away: start over
  }
  if (by_address) return ConnectByAddress(remote, timeout_ms);
  // Which host has it (docs/CLUSTER.md): this one's broker, or another host of
  // the cluster, over the network. Without a cluster it is always this one.
  const auto deadline = DeadlineAfter(timeout_ms);
  const auto wait_ms = [&] {
    return static_cast<int32_t>(
        std::max<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(), 0));
  };
  auto reply = core_->conn().Call(ipc::EngineResolveRequest{remote, static_cast<uint32_t>(wait_ms())},
                                  std::chrono::milliseconds(wait_ms()));
  if (!reply.ok()) return reply.status();
  const auto* where = std::get_if<ipc::EngineResolveReply>(&reply->body);
  if (where == nullptr) return Status(ErrorCode::kProtocolError, "EngineResolveRequest got a wrong reply");
  if (!where->host.empty()) {
    if (!detail::LooksLikeHostPort(where->address))
      return Status(ErrorCode::kProtocolError, "the broker resolved engine \"" + remote + "\" to a malformed address");
    return ConnectByAddress(where->address, wait_ms(), remote);
  }
  auto c = std::make_shared<Connection>();
  c->transport = same_host_.get();
  MB_ASSIGN_OR_RETURN(c->id, same_host_->Connect(remote, deadline, &c->peer));
  Keep(remote, std::move(c));
  return Status::Ok();
}

Status TransferEngine::Impl::ConnectByAddress(const std::string& address, int32_t timeout_ms, const std::string& as) {
  const auto deadline = DeadlineAfter(timeout_ms);
  MB_ASSIGN_OR_RETURN(detail::NetTransport * net, Net());
  auto c = std::make_shared<Connection>();
  c->address = address;
  MB_ASSIGN_OR_RETURN(uint64_t net_conn, net->Connect(address, deadline, &c->peer));
  if (!as.empty() && c->peer.engine != as) {  // the record was stale: another engine listens there now
    (void)net->Close(net_conn, deadline);
    return Status(ErrorCode::kNotFound, "the cluster lists engine \"" + as + "\" at " + address + ", but engine \"" +
                                            ipc::EscapeText(c->peer.engine) + "\" answers there");
  }
  // Is it this host's? An engine of that name at our broker whose control
  // block holds the identity the network handshake carried: then the bytes
  // go through mapped broker memory, never through the network stack. (Not
  // waited for: the broker knows it now or it is not this host's.)
  PeerInfo here;
  auto local = same_host_->Connect(c->peer.engine, Clock::now(), &here);
  const bool same = local.ok() && here.identity == c->peer.identity;
  if (local.ok() && !same) (void)same_host_->Close(*local, deadline);  // a namesake; the one that answered is remote
  if (local.code() == ErrorCode::kAlreadyConnected) {
    // Connected by name already: the same engine if it carries that identity.
    std::shared_ptr<Connection> by_name = Find(c->peer.engine);
    if (by_name != nullptr && by_name->transport == same_host_.get() && by_name->peer.identity == c->peer.identity) {
      (void)net->Close(net_conn, deadline);
      return Status(ErrorCode::kAlreadyConnected, "already connected to the engine at " + address + " by its name \"" +
                                                      ipc::EscapeText(c->peer.engine) + "\" (it is on this host)");
    }
  }
  if (same) {
    (void)net->Close(net_conn, deadline);
    c->transport = same_host_.get();
    c->id = *local;
    c->peer.transports = here.transports;
  } else {
    c->transport = net;
    c->id = net_conn;
  }
  Keep(as.empty() ? address : as, std::move(c));
  ReportNetwork(/*force=*/true);
  return Status::Ok();
}

Status TransferEngine::Impl::Disconnect(const std::string& remote, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  std::shared_ptr<Connection> c;
  {
    // New transfers no longer find it; those running end first (Close waits).
    std::lock_guard<std::mutex> lk(conns_mu_);
    auto it = conns_.find(remote);
    if (it == conns_.end()) return NotConnected(remote);
    c = it->second;
    conns_.erase(it);
  }
  Status st = c->transport->Close(c->id, DeadlineAfter(timeout_ms));
  if (st.code() == ErrorCode::kTimeout) Keep(remote, c);
  if (!c->address.empty()) ReportNetwork(/*force=*/true);
  return st;
}

Status TransferEngine::Impl::Transfer(const std::string& remote, TransferOp op,
                                      const std::vector<TransferOpDesc>& descs, Clock::time_point deadline) {
  if (!initialized_) return NotInitialized();
  if (op != READ && op != WRITE) return Status(ErrorCode::kParamInvalid, "op must be READ or WRITE");
  std::shared_ptr<Connection> c = Find(remote);
  if (c == nullptr) return NotConnected(remote);
  // Local ranges stay registered (and mapped) until the transfer is over.
  std::shared_lock<std::shared_mutex> local_lk(local_mu_);
  MB_RETURN_IF_ERROR(CheckLocal(op, descs));
  // Past its deadline before it starts (timeout 0, or a queued async request):
  // nothing moves, whichever transport it would take.
  if (Clock::now() >= deadline)
    return Status(ErrorCode::kTimeout, "the transfer's timeout passed before it started; nothing was moved");
  if (c->transport == same_host_.get()) return c->transport->Transfer(c->id, op, descs, deadline);
  return TransferOverNetwork(*c, op, descs, deadline);
}

Status TransferEngine::Impl::TransferOverNetwork(const Connection& c, TransferOp op,
                                                 const std::vector<TransferOpDesc>& descs, Clock::time_point deadline) {
  std::vector<TransferOpDesc> host;
  std::vector<detail::DeviceDesc> device;
  for (const TransferOpDesc& d : descs) {
    const RegionDesc& r =
        ipc::Containing(local_, d.local_addr, d.len, [](const LocalRegion& l) { return l.desc.length; })->second.desc;
    if (r.device < 0)
      host.push_back(d);
    else
      device.push_back(detail::DeviceDesc{d.local_addr, d.remote_addr, d.len, r.device});
  }
  if (device.empty()) return c.transport->Transfer(c.id, op, descs, deadline);
  // Staged batches move one after another: every remote side is checked
  // before the first, so that a bad descriptor moves nothing, as elsewhere.
  std::vector<RegionInfo> remote;
  MB_RETURN_IF_ERROR(c.transport->RemoteRegions(c.id, deadline, &remote));
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto r = std::find_if(remote.begin(), remote.end(), [&](const RegionInfo& x) {
      return d.remote_addr >= x.address && d.remote_addr + d.len >= d.remote_addr &&
             d.remote_addr + d.len <= x.address + x.length;
    });
    if (r == remote.end())
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": remote range is not inside memory engine \"" +
                                                  ipc::EscapeText(c.peer.engine) + "\" registered");
    if (op == WRITE && r->read_only)
      return Status(ErrorCode::kParamInvalid,
                    "descriptor " + std::to_string(i) + ": remote range is read-only for its owner");
  }
  if (!host.empty()) MB_RETURN_IF_ERROR(c.transport->Transfer(c.id, op, host, deadline));
  return staged_.Run(*c.transport, c.id, op, device, deadline);
}

Status TransferEngine::Impl::CheckLocal(TransferOp op, const std::vector<TransferOpDesc>& descs) {
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto it = ipc::Containing(local_, d.local_addr, d.len, [](const LocalRegion& r) { return r.desc.length; });
    if (d.len == 0 || it == local_.end() || it->second.draining)
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": local range is empty or not inside memory this engine registered");
    if (op == READ && it->second.desc.read_only)
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) + ": local range is read-only");
  }
  return Status::Ok();
}

Status TransferEngine::Impl::TransferAsync(const std::string& remote, TransferOp op,
                                           const std::vector<TransferOpDesc>& descs, TransferReq& req,
                                           int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  if (Find(remote) == nullptr) return NotConnected(remote);
  auto r = std::make_shared<AsyncRequest>();
  {
    std::lock_guard<std::mutex> lk(req_mu_);
    req = next_req_++;
    requests_[req] = r;
  }
  const auto deadline = DeadlineAfter(timeout_ms);
  async_pool_.Post([this, r, remote, op, descs, deadline] {
    Status st = Transfer(remote, op, descs, deadline);  // TIMEOUT when it waited past its deadline
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(req_mu_);
      last_error_ = st;
    }
    r->status.store(st.ok()                            ? TransferStatus::COMPLETED
                    : st.code() == ErrorCode::kTimeout ? TransferStatus::TIMEOUT
                                                       : TransferStatus::FAILED);
  });
  return Status::Ok();
}

Status TransferEngine::Impl::GetTransferStatus(TransferReq req, TransferStatus& status) {
  std::lock_guard<std::mutex> lk(req_mu_);
  auto it = requests_.find(req);
  if (it == requests_.end())
    return Status(ErrorCode::kParamInvalid,
                  "unknown transfer request " + std::to_string(req) + " (never made, or its final status was read)");
  status = it->second->status.load();
  if (status != TransferStatus::WAITING) requests_.erase(it);
  return Status::Ok();
}

Status TransferEngine::Impl::GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>& regions,
                                               int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  std::shared_ptr<Connection> c = Find(remote);
  if (c == nullptr) return NotConnected(remote);
  return c->transport->RemoteRegions(c->id, DeadlineAfter(timeout_ms), &regions);
}

// The public class forwards to Impl.
TransferEngine::TransferEngine(const Client& client) : impl_(std::make_unique<Impl>(client, client.core_)) {}
TransferEngine::~TransferEngine() { impl_->Finalize(); }
Status TransferEngine::Initialize(const std::string& name, const std::map<std::string, std::string>& options) {
  return impl_->Initialize(name, options);
}
void TransferEngine::Finalize() { impl_->Finalize(); }
Status TransferEngine::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) {
  return impl_->RegisterMem(mem, type, handle, "");
}
Status TransferEngine::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, const std::string& name) {
  return impl_->RegisterMem(mem, type, handle, name);
}
Status TransferEngine::GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>& regions,
                                        int32_t timeout_ms) {
  return impl_->GetRemoteRegions(remote, regions, timeout_ms);
}
Status TransferEngine::DeregisterMem(MemHandle handle) { return impl_->DeregisterMem(handle); }
Status TransferEngine::Connect(const std::string& remote, int32_t timeout_ms) {
  return impl_->Connect(remote, timeout_ms);
}
Status TransferEngine::Disconnect(const std::string& remote, int32_t timeout_ms) {
  return impl_->Disconnect(remote, timeout_ms);
}
Status TransferEngine::TransferSync(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                                    int32_t timeout_ms) {
  return impl_->Transfer(remote, op, descs, DeadlineAfter(timeout_ms));
}
Status TransferEngine::TransferAsync(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                                     TransferReq& req, int32_t timeout_ms) {
  return impl_->TransferAsync(remote, op, descs, req, timeout_ms);
}
Status TransferEngine::GetTransferStatus(TransferReq req, TransferStatus& status) {
  return impl_->GetTransferStatus(req, status);
}
Status TransferEngine::GetTransferStatus(std::span<const TransferReq> reqs, std::vector<TransferStatus>& statuses) {
  statuses.assign(reqs.size(), TransferStatus::FAILED);
  for (size_t i = 0; i < reqs.size(); ++i) MB_RETURN_IF_ERROR(impl_->GetTransferStatus(reqs[i], statuses[i]));
  return Status::Ok();
}
Status TransferEngine::last_error() const { return impl_->last_error(); }
Status TransferEngine::SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms) {
  return impl_->SendNotify(remote, notify, timeout_ms);
}
Status TransferEngine::GetNotifies(std::vector<Notify>& notifies) { return impl_->GetNotifies(notifies); }
Status TransferEngine::WaitNotifies(std::vector<Notify>& notifies, int32_t timeout_ms) {
  return impl_->WaitNotifies(notifies, timeout_ms);
}
Status TransferEngine::GetConnectionInfo(const std::string& remote, ConnectionInfo& info) const {
  return impl_->GetConnectionInfo(remote, info);
}
Status TransferEngine::GetNetworkStats(NetworkStats& stats) const { return impl_->GetNetworkStats(stats); }

}  // namespace membroker
