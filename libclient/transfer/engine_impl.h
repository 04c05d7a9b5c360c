// TransferEngine::Impl: what is the same for every path to a peer - the
// engine's name and options, its registered ranges and their checks, the
// connections by the name or address they were made with, asynchronous
// requests - over two transports (transfer/transport.h). Its functions are in
// transfer_engine.cc (ranges, connections, transfers), engine_notifies.cc and
// engine_network.cc (the network transport and what the broker is told of it).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "client/client_core.h"
#include "transfer/net_transport.h"
#include "transfer/same_host/same_host_transport.h"
#include "transfer/staged_transfer.h"
#include "transfer/thread_pool.h"
#include "membroker/transfer_engine.h"

namespace membroker::engine_detail {

using Clock = std::chrono::steady_clock;
using detail::PeerInfo;
using detail::RegionDesc;
using detail::Transport;
constexpr size_t kRegionAlign = 4096;

inline Status NotInitialized() { return Status(ErrorCode::kParamInvalid, "the engine is not initialized (call Initialize)"); }
inline Status NotConnected(const std::string& remote) {
  return Status(ErrorCode::kNotConnected, "not connected to engine \"" + remote + "\"");
}

inline Clock::time_point DeadlineAfter(int32_t timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(std::max<int32_t>(timeout_ms, 0));
}

struct LocalRegion {
  RegionDesc desc;
  // Being deregistered: refused to new transfers; a transport whose peers
  // had not drained by the timeout keeps it until a later DeregisterMem.
  bool draining = false;
};

// One connection, by the name or address the caller gave Connect.
struct Connection {
  Transport* transport = nullptr;  // owned by the engine; outlives the connection
  uint64_t id = 0;                 // the transport's
  PeerInfo peer;
  std::string address;  // "ip:port" when connected by address (either path), else ""
};

struct AsyncRequest {
  std::atomic<TransferStatus> status{TransferStatus::WAITING};
};

}  // namespace membroker::engine_detail

namespace membroker {

class __attribute__((visibility("hidden"))) TransferEngine::Impl {
 public:
  using Clock = engine_detail::Clock;
  using Connection = engine_detail::Connection;
  using LocalRegion = engine_detail::LocalRegion;
  using AsyncRequest = engine_detail::AsyncRequest;

  Impl(const Client& client, std::shared_ptr<detail::ClientCore> core) : client_(client), core_(std::move(core)) {}

  Status Initialize(const std::string& name, const std::map<std::string, std::string>& options);
  void Finalize();
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, const std::string& name);
  Status GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>& regions, int32_t timeout_ms);
  Status DeregisterMem(MemHandle handle);
  Status Connect(const std::string& remote, int32_t timeout_ms);
  Status Disconnect(const std::string& remote, int32_t timeout_ms);
  Status Transfer(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                  Clock::time_point deadline);
  Status TransferAsync(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                       TransferReq& req, int32_t timeout_ms);
  Status GetTransferStatus(TransferReq req, TransferStatus& status);
  Status SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms);
  Status GetNotifies(std::vector<Notify>& notifies);
  Status WaitNotifies(std::vector<Notify>& notifies, int32_t timeout_ms);
  Status last_error() const {
    std::lock_guard<std::mutex> lk(req_mu_);
    return last_error_;
  }
  Status GetConnectionInfo(const std::string& remote, ConnectionInfo& info);
  Status GetNetworkStats(NetworkStats& stats);

 private:
  // Connect to "ip:port": over the network, or through the broker when the
  // engine answering there is this host's. With `as` (an engine name the
  // cluster resolved to that address), the connection is known by that name
  // and the engine answering must carry it.
  Status ConnectByAddress(const std::string& address, int32_t timeout_ms, const std::string& as = "");
  // Every descriptor's local range is registered (and writable for READ).
  Status CheckLocal(TransferOp op, const std::vector<TransferOpDesc>& descs);
  // Over the network: host ranges as they are, device ranges through host
  // staging buffers (staged_transfer.h), after every remote side is checked.
  Status TransferOverNetwork(const Connection& c, TransferOp op, const std::vector<TransferOpDesc>& descs,
                             Clock::time_point deadline);
  // The network transport: loaded and started on first use.
  Result<detail::NetTransport*> Net();
  detail::NetTransport* CurrentNet() {  // nullptr before the first use
    std::lock_guard<std::mutex> lk(net_mu_);
    return net_.get();
  }
  // Tells the broker the network side (one-way): always after this engine's own
  // connects and disconnects by ip:port (force), else when the transport says
  // connections opened, closed or were refused since the last report.
  void ReportNetwork(bool force = false);
  std::shared_ptr<Connection> Find(const std::string& remote);
  void Keep(const std::string& key, std::shared_ptr<Connection> c) {
    std::lock_guard<std::mutex> lk(conns_mu_);
    conns_[key] = std::move(c);
  }

  Client client_;
  std::shared_ptr<detail::ClientCore> core_;
  std::string name_;
  bool initialized_ = false;
  std::chrono::milliseconds drain_timeout_{10'000};
  std::unique_ptr<detail::SameHostTransport> same_host_;

  std::mutex net_mu_;
  detail::NetOptions net_options_;
  std::unique_ptr<detail::NetTransport> net_;
  uint64_t reported_changes_ = ~0ull;  // what the broker was last told (admin list engines)

  std::shared_mutex local_mu_;              // shared: transfers; exclusive: registration
  uint64_t next_handle_ = 1;                // MemHandles
  std::map<uintptr_t, LocalRegion> local_;  // by address
  detail::StagedTransfer staged_;           // device ranges to and from other hosts

  std::mutex conns_mu_;
  std::map<std::string, std::shared_ptr<Connection>> conns_;

  detail::ThreadPool async_pool_;
  mutable std::mutex req_mu_;
  uint64_t next_req_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<AsyncRequest>> requests_;
  Status last_error_;
};

}  // namespace membroker
