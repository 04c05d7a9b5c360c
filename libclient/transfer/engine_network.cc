// The network side of an engine: the transport started on first use, what
// the broker is told of it (admin list engines), and what the caller can ask.

#include "client/device_vmm.h"
#include "transfer/engine_impl.h"
#include "membroker/ipc/protocol.h"

namespace membroker {

using namespace engine_detail;  // the helpers the Impl files share

Result<detail::NetTransport*> TransferEngine::Impl::Net() {
  // Ranges registered before the transport existed are told to it now
  // (RegisterMem, exclusive on local_mu_, tells it of later ones).
  std::shared_lock<std::shared_mutex> local_lk(local_mu_);
  std::lock_guard<std::mutex> lk(net_mu_);
  if (!net_) {
    if (net_options_.engine_name.empty()) {  // asked by a Connect("ip:port"), not by a listen address
      net_options_.engine_name = name_;
      net_options_.identity = same_host_->identity();
    }
    net_options_.on_notify = [core = core_.get()] { core->wake().Poke(); };  // the engine outlives its transport
    net_options_.device_copy = &detail::device::Copy;
    MB_ASSIGN_OR_RETURN(std::unique_ptr<detail::NetTransport> t, detail::StartNetTransport(net_options_));
    for (const auto& [addr, r] : local_)
      if (!r.draining) MB_RETURN_IF_ERROR(t->AddRegion(r.desc));
    net_ = std::move(t);
  }
  return net_.get();
}

void TransferEngine::Impl::ReportNetwork(bool force) {
  ipc::EngineNetworkRequest r;
  {
    std::lock_guard<std::mutex> lk(net_mu_);
    if (!net_) return;
    const uint64_t changes = net_->changes();
    if (changes == reported_changes_ && !force) return;
    reported_changes_ = changes;
    const detail::NetStats u = net_->stats();
    r.listen_address = net_->listen_address();
    r.accepted = u.accepted;
    r.refused = u.refused;
    uint64_t outbound = 0;
    std::lock_guard<std::mutex> clk(conns_mu_);
    for (const auto& [key, c] : conns_) {
      if (c->address.empty() || r.connections.size() >= ipc::kMaxNetConnections) continue;  // connected by name
      outbound += c->transport == net_.get();
      r.connections.push_back(
          {key, c->peer.engine, c->transport->path(), c->peer.transports.substr(0, ipc::kMaxNetTransportsBytes)});
    }
    r.inbound = u.connections > outbound ? u.connections - outbound : 0;
  }
  // Sent with no lock held; the broker only records it, and a failure loses nothing.
  (void)core_->conn().SendOneWay(std::move(r));
}

Status TransferEngine::Impl::GetConnectionInfo(const std::string& remote, ConnectionInfo& info) {
  if (!initialized_) return NotInitialized();
  std::shared_ptr<Connection> c = Find(remote);
  if (c == nullptr) return NotConnected(remote);
  info.engine = c->peer.engine;
  info.path = c->transport->path();
  if (c->transport != same_host_.get()) {
    // This engine's device memory crosses on it through staging buffers.
    std::shared_lock<std::shared_mutex> local_lk(local_mu_);
    if (std::any_of(local_.begin(), local_.end(), [](const auto& kv) { return kv.second.desc.device >= 0; }))
      info.path += "+staged";
  }
  info.transports = c->peer.transports;
  info.address = c->transport == same_host_.get() ? "" : c->address;
  return Status::Ok();
}

Status TransferEngine::Impl::GetNetworkStats(NetworkStats& stats) {
  if (!initialized_) return NotInitialized();
  stats = NetworkStats{};
  ReportNetwork();
  std::lock_guard<std::mutex> lk(net_mu_);
  if (net_) {
    const detail::NetStats u = net_->stats();
    stats.listen_address = net_->listen_address();
    stats.accepted = u.accepted;
    stats.refused = u.refused;
    stats.connections = u.connections;
    stats.last_refusal = u.last_refusal;
  }
  return Status::Ok();
}

}  // namespace membroker
