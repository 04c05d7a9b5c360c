// TransferEngine: registration and connections go through the broker; bytes
// move here, with memcpy through mappings of peers' broker memory or with
// cross-memory attach into peers' own memory.
//
// Keeping a peer from touching memory after it is deregistered: every engine
// owns a 4 KiB control block (a broker allocation its peers map) with a
// generation counter and one "busy" counter per connected peer. A peer bumps
// its busy counter, then reads the generation; if the generation is the one
// its cached region list came from, it copies and drops the counter.
// DeregisterMem tells the broker first, then bumps the generation, then waits
// until the counter of every peer the broker says is connected is zero. Both
// sides use sequentially consistent atomics, so either the peer sees the new
// generation (and refreshes its regions from the broker) or DeregisterMem
// sees it busy. The block's layout is membroker/ipc/engine_control.h; who the
// peers are (slot, pid) comes from the broker, never from the block, and the
// wait is bounded ("drain_timeout_ms").
//
// After the broker restarts, the client's reattach registers the engine and
// its ranges again (reattach.cc); each connection is made again by its next
// use (a transfer or a notify), which waits for the peer's engine to be back
// until that call's deadline.
#include "membroker/transfer_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <latch>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "client/client_core.h"
#include "shm/futex.h"
#include "transfer/net_address.h"
#include "transfer/net_transport.h"
#include "membroker/ipc/engine_control.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/private_file.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/ranges.h"
#include "membroker/ipc/syscall.h"

namespace membroker {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kRegionAlign = 4096;
constexpr size_t kCopyChunk = 1 << 20;             // deadline checks between chunks
constexpr size_t kParallelCopyBytes = 8 << 20;     // below this one thread copies
constexpr size_t kMaxIov = 1024;                   // IOV_MAX

using ControlBlock = ipc::EngineControlBlock;
using ControlSlot = ipc::EngineControlSlot;

bool PidAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

Status NotInitialized() {
  return Status(ErrorCode::kParamInvalid, "the engine is not initialized (call Initialize)");
}
Status NotConnected(const std::string& remote) {
  return Status(ErrorCode::kNotConnected, "not connected to engine \"" + remote + "\"");
}

Clock::time_point DeadlineAfter(int32_t timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(std::max<int32_t>(timeout_ms, 0));
}

// A fixed set of threads running queued jobs.
class ThreadPool {
 public:
  void Start(size_t n) {
    stop_ = false;  // an engine may be initialized again after Finalize
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ThreadPool() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }
  size_t size() const { return threads_.size(); }
  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left to run
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

struct LocalRegion {
  uintptr_t addr = 0;
  size_t len = 0;
  uint64_t handle = 0;  // the MemHandle (the broker's region id changes at a reattach)
  bool read_only = false;
  // Deregistered at the broker, but a peer was still inside a transfer when
  // the drain timed out: the range stays locked here until a later
  // DeregisterMem sees it drained.
  bool draining = false;
};

// A peer the broker says is connected to this engine.
struct ConnectedPeer {
  uint32_t slot = 0;
  pid_t pid = 0;
  ipc::UniqueFd pidfd;  // opened while the broker vouched for the pid
};

struct RemoteMap {
  void* base = nullptr;
  size_t size = 0;
};

// One connection to a remote engine.
struct Peer {
  std::string name;
  pid_t pid = 0;
  ipc::UniqueFd pidfd;
  uint32_t slot = 0;
  uint64_t control_allocation = 0;
  ControlBlock* control = nullptr;  // the remote's, mapped here
  // Shared by transfers; exclusive to refresh the region list or disconnect.
  std::shared_timed_mutex mu;
  uint32_t generation = 0;  // of the control block when `regions` was fetched
  bool fresh = false;       // regions fetched at least once
  std::map<uint64_t, ipc::EngineRegion> regions;  // by remote address
  std::unordered_map<uint64_t, RemoteMap> maps;   // allocation -> mapping here
  std::atomic<bool> lost{false};
  uint64_t epoch = 0;  // the client's reattach count when this connection was made (under mu)
  // Reached over the network (another host): the transport's connection, and what it said.
  uint64_t net_conn = 0;
  std::string address, transports;
};

// One check: the pidfd where there is one (a pid can be reused), the pid otherwise.
bool PeerAlive(const Peer& p) { return p.pidfd.valid() ? ipc::PidfdAlive(p.pidfd.get()) : PidAlive(p.pid); }

struct CopySegment {
  char* dst;
  const char* src;
  size_t len;
};

struct AsyncRequest {
  std::atomic<TransferStatus> status{TransferStatus::WAITING};
};

}  // namespace

class __attribute__((visibility("hidden"))) TransferEngine::Impl {
 public:
  Impl(const Client& client, std::shared_ptr<detail::ClientCore> core)
      : client_(client), core_(std::move(core)) {}

  Status Initialize(const std::string& name, const std::map<std::string, std::string>& options);
  void Finalize();
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle);
  Status DeregisterMem(MemHandle handle);
  Status Connect(const std::string& remote, int32_t timeout_ms);
  Status Disconnect(const std::string& remote, int32_t timeout_ms);
  Status Transfer(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                  Clock::time_point deadline);
  Status TransferAsync(const std::string& remote, TransferOp op,
                       const std::vector<TransferOpDesc>& descs, TransferReq& req, int32_t timeout_ms);
  Status GetTransferStatus(TransferReq req, TransferStatus& status);
  Status SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms);
  Status GetNotifies(std::vector<Notify>& notifies);
  Status last_error() const {
    std::lock_guard<std::mutex> lk(req_mu_);
    return last_error_;
  }
  Status GetConnectionInfo(const std::string& remote, ConnectionInfo& info);
  Status GetNetworkStats(NetworkStats& stats);

 private:
  // Connect to "ip:port": over UCX, or through the broker when the engine
  // answering there is this host's.
  Status ConnectByAddress(const std::string& address, int32_t timeout_ms);
  // Every descriptor's local range is registered (and writable for READ).
  Status CheckLocal(TransferOp op, const std::vector<TransferOpDesc>& descs);
  // The network options of Initialize, parsed; starts the transport when asked to listen.
  Status ConfigureNetwork(const std::string& name, const uint8_t (&identity)[16],
                          const std::map<std::string, std::string>& options);
  // Starts the listener that ConfigureNetwork asked for (after the broker took the name).
  Status StartListening();
  // The network transport (transfer/net_transport.h): loaded and started on
  // first use, so a process that never asks for the network never maps UCX.
  Result<detail::NetTransport*> Transport();
  detail::NetTransport* CurrentTransport() {  // nullptr before the first use
    std::lock_guard<std::mutex> lk(transport_mu_);
    return transport_.get();
  }
  std::mutex transport_mu_;
  detail::NetOptions net_options_;
  std::unique_ptr<detail::NetTransport> transport_;
  // What the broker was last told of the network side (admin list engines).
  uint64_t reported_changes_ = ~0ull;
  // Tells the broker the network side (one-way): always after this engine's own
  // connects and disconnects by ip:port (force), else when the transport says
  // connections opened, closed or were refused since the last report.
  void ReportNetwork(bool force = false);
  std::shared_ptr<Peer> FindPeer(const std::string& remote);
  // Whether the broker that made this connection is gone (a reattach since).
  bool Stale(Peer& peer);
  // Connects to the peer's engine again at the new broker, waiting for it
  // until deadline; the old mappings go (the new broker never gave them).
  Status Reconnect(Peer& peer, Clock::time_point deadline);
  // Takes the broker's answer to EngineConnectRequest into peer (peer.mu
  // exclusive, or peer not shared yet): its pid, slot and control block.
  Status Adopt(Peer& peer, const ipc::EngineInfoReply& info);
  // Re-reads the peer's regions from the broker and maps new broker-backed ones.
  Status Refresh(Peer& peer);
  // Unmaps and releases everything the peer mapping holds (peer.mu exclusive);
  // tell_broker false: only unmaps (the broker that gave them is gone).
  void DropPeerMappings(Peer& peer, bool tell_broker = true);
  Status ResolveAndCopy(Peer& peer, TransferOp op, const std::vector<TransferOpDesc>& descs,
                        Clock::time_point deadline, bool* retry);
  Status CopyAll(std::vector<CopySegment>& segs, Clock::time_point deadline);
  Status CrossMemory(Peer& peer, TransferOp op, std::vector<iovec>& local, std::vector<iovec>& remote,
                     Clock::time_point deadline);
  // The peers the broker says are connected to this engine now.
  Result<std::vector<ConnectedPeer>> ConnectedPeers();
  // Bumps our generation and waits until none of `peers` is inside a
  // transfer (or has exited), until deadline at most: TIMEOUT naming the
  // peer that is still busy.
  Status WaitForPeers(const std::vector<ConnectedPeer>& peers, Clock::time_point deadline);
  Result<void*> MapImported(const std::string& remote, uint64_t allocation, size_t* size);
  void ReleaseImported(void* base, size_t size, uint64_t allocation);

  Client client_;
  std::shared_ptr<detail::ClientCore> core_;
  std::string name_;
  bool initialized_ = false;
  PhysicalHandle control_handle_;
  Reservation control_range_;
  Mapping control_map_;
  ControlBlock* control_ = nullptr;  // ours, mapped read-write
  uint64_t next_handle_ = 1;         // MemHandles (under local_mu_)
  std::chrono::milliseconds drain_timeout_{10'000};

  std::shared_mutex local_mu_;  // shared: transfers; exclusive: deregistration
  std::map<uintptr_t, LocalRegion> local_;  // by address

  std::mutex peers_mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_;

  ThreadPool copy_pool_;
  ThreadPool async_pool_;
  mutable std::mutex req_mu_;
  uint64_t next_req_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<AsyncRequest>> requests_;
  Status last_error_;
};

Status TransferEngine::Impl::Initialize(const std::string& name,
                                        const std::map<std::string, std::string>& options) {
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
  drain_timeout_ = std::chrono::milliseconds(drain_timeout_ms);
  if (detail::LooksLikeHostPort(name))
    return Status(ErrorCode::kParamInvalid, "an engine name cannot have the shape ip:port (that is how remote "
                                            "engines are named); give the address as option listen_address");
  uint8_t identity[16];
  if (::getrandom(identity, sizeof(identity), 0) != sizeof(identity))
    return Status(ErrorCode::kInternal, "getrandom failed for the engine's identity");
  MB_RETURN_IF_ERROR(ConfigureNetwork(name, identity, options));
  // The control block: a 4 KiB allocation mapped here; peers map it too.
  MB_ASSIGN_OR_RETURN(PhysicalHandle h, client_.MallocPhysical(sizeof(ControlBlock)));
  MB_ASSIGN_OR_RETURN(Reservation range, client_.ReserveMemAddress(h.size()));
  MB_ASSIGN_OR_RETURN(Mapping map, client_.MapMem(range.base(), h.size(), 0, h));
  MB_RETURN_IF_ERROR(core_->conn().Call(ipc::EngineInitRequest{name, h.id()}).status());
  core_->RecordEngine(name, h.id());
  if (Status st = StartListening(); !st.ok()) {
    core_->ForgetEngine();
    (void)core_->conn().Call(ipc::EngineFinalizeRequest{});
    return st;
  }
  control_ = map.as<ControlBlock>();
  std::memcpy(control_->identity, identity, sizeof(identity));
  control_->magic.store(ipc::kEngineControlMagic);
  control_handle_ = std::move(h);
  control_range_ = std::move(range);
  control_map_ = std::move(map);
  name_ = name;
  copy_pool_.Start(copy_threads - 1);  // the calling thread copies too
  async_pool_.Start(async_threads);
  initialized_ = true;
  return Status::Ok();
}

void TransferEngine::Impl::Finalize() {
  if (!initialized_) return;
  async_pool_.Stop();  // runs what is queued (bounded by each request's timeout)
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    for (const auto& [n, p] : peers_) names.push_back(n);
  }
  for (const auto& n : names) (void)Disconnect(n, 60'000);
  {
    // Connectors on other hosts lose us now: the transport closes their
    // connections and unmaps our ranges before they are deregistered below.
    std::lock_guard<std::mutex> tlk(transport_mu_);
    transport_.reset();
    net_options_ = {};
  }
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  // Who may still be inside our memory: asked before the broker forgets them.
  auto peers = ConnectedPeers();
  core_->ForgetEngine();
  (void)core_->conn().Call(ipc::EngineFinalizeRequest{});
  if (peers.ok()) (void)WaitForPeers(*peers, Clock::now() + drain_timeout_);  // bounded either way
  for (const auto& [addr, r] : local_) core_->ForgetEngineRange(addr);
  local_.clear();
  copy_pool_.Stop();
  control_ = nullptr;
  control_map_ = Mapping();
  control_range_ = Reservation();
  control_handle_ = PhysicalHandle();
  initialized_ = false;
}

Result<std::vector<ConnectedPeer>> TransferEngine::Impl::ConnectedPeers() {
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::EnginePeersRequest{}));
  auto* m = std::get_if<ipc::EnginePeersReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EnginePeersRequest got a wrong reply");
  std::vector<ConnectedPeer> out;
  for (const ipc::EnginePeer& p : m->peers) {
    if (p.slot >= ipc::kEngineSlots) return Status(ErrorCode::kProtocolError, "the broker named a slot out of range");
    ConnectedPeer c{p.slot, p.pid, {}};
    if (auto fd = ipc::PidfdOpenIfSupported(p.pid); fd.ok()) c.pidfd = std::move(*fd);
    else continue;  // exited already: nothing to wait for
    out.push_back(std::move(c));
  }
  return out;
}

Status TransferEngine::Impl::WaitForPeers(const std::vector<ConnectedPeer>& peers,
                                          Clock::time_point deadline) {
  control_->generation.fetch_add(1);
  control_->draining.fetch_add(1);
  Status st;
  for (const ConnectedPeer& p : peers) {
    ControlSlot& slot = control_->slots[p.slot];
    for (;;) {
      uint32_t busy = slot.busy.load();
      const bool alive = p.pidfd.valid() ? ipc::PidfdAlive(p.pidfd.get()) : PidAlive(p.pid);
      if (busy == 0 || !alive) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        st = Status(ErrorCode::kTimeout,
                    "a peer engine (pid " + std::to_string(p.pid) + ") is still inside a transfer into this "
                    "engine's memory after " + std::to_string(drain_timeout_.count()) +
                    " ms (engine option drain_timeout_ms)");
        break;
      }
      // Woken when the peer's last transfer ends; re-checks its pidfd every 10 ms.
      detail::FutexWait(&slot.busy, busy, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(10)));
    }
    if (!st.ok()) break;
  }
  control_->draining.fetch_sub(1);
  return st;
}

Status TransferEngine::Impl::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) {
  if (!initialized_) return NotInitialized();
  if (type == MEM_DEVICE)
    return Status(ErrorCode::kUnsupported, "MEM_DEVICE needs a device backend, which this build lacks");
  if (type != MEM_HOST) return Status(ErrorCode::kParamInvalid, "unknown memory type");
  if (mem.len == 0 || mem.addr == 0 || mem.addr % kRegionAlign || mem.len % kRegionAlign)
    return Status(ErrorCode::kParamInvalid,
                  "addr and len must be non-zero multiples of 4096");
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  if (ipc::Overlaps(local_, mem.addr, mem.len, [](const LocalRegion& r) { return r.len; }))
    return Status(ErrorCode::kParamInvalid, "range overlaps memory this engine already registered");
  MB_ASSIGN_OR_RETURN(detail::EngineRange where, core_->PinForEngine(mem.addr, mem.len));
  auto reply = core_->conn().Call(ipc::EngineRegisterRequest{mem.addr, mem.len, where.handle, where.offset});
  auto* r = reply.ok() ? std::get_if<ipc::EngineRegisterReply>(&reply->body) : nullptr;
  if (r == nullptr) {
    core_->ForgetEngineRange(mem.addr);
    return reply.ok() ? Status(ErrorCode::kProtocolError, "EngineRegisterRequest got a wrong reply")
                      : reply.status();
  }
  core_->SetEngineRegion(mem.addr, r->region);
  const uint64_t h = next_handle_++;
  // Known to the network transport too where the engine has one: a listener
  // announces it to its connectors and serves their pieces in it.
  if (detail::NetTransport* t = CurrentTransport()) {
    if (Status st = t->AddRegion(h, mem.addr, mem.len, where.read_only); !st.ok()) {
      (void)core_->conn().Call(ipc::EngineDeregisterRequest{r->region});
      core_->ForgetEngineRange(mem.addr);
      return st;
    }
  }
  local_[mem.addr] = LocalRegion{mem.addr, mem.len, h, where.read_only};
  handle = reinterpret_cast<MemHandle>(static_cast<uintptr_t>(h));
  return Status::Ok();
}

Status TransferEngine::Impl::DeregisterMem(MemHandle handle) {
  if (!initialized_) return NotInitialized();
  const uint64_t h = reinterpret_cast<uintptr_t>(handle);
  // Exclusive: our own transfers that may use it finish first.
  std::unique_lock<std::shared_mutex> lk(local_mu_);
  auto it = std::find_if(local_.begin(), local_.end(), [&](const auto& kv) { return kv.second.handle == h; });
  if (it == local_.end())
    return Status(ErrorCode::kParamInvalid, "unknown MemHandle (never registered, or deregistered)");
  if (!it->second.draining) {
    // (0: a reattach could not register it again; the broker has nothing to forget.)
    if (const uint64_t region = core_->EngineRegion(it->first); region != 0)
      MB_RETURN_IF_ERROR(core_->conn().Call(ipc::EngineDeregisterRequest{region}).status());
    core_->SetEngineRegion(it->first, 0);
    it->second.draining = true;  // gone at the broker; ours until the peers drain
  }
  // Connectors on other hosts stop using it (or are gone) before it is unmapped.
  if (detail::NetTransport* t = CurrentTransport()) MB_RETURN_IF_ERROR(t->RemoveRegion(h, Clock::now() + drain_timeout_));
  // Peers' transfers into it finish; later ones refresh and miss it.
  MB_ASSIGN_OR_RETURN(std::vector<ConnectedPeer> peers, ConnectedPeers());
  MB_RETURN_IF_ERROR(WaitForPeers(peers, Clock::now() + drain_timeout_));
  core_->ForgetEngineRange(it->first);
  local_.erase(it);
  return Status::Ok();
}

std::shared_ptr<Peer> TransferEngine::Impl::FindPeer(const std::string& remote) {
  std::lock_guard<std::mutex> lk(peers_mu_);
  auto it = peers_.find(remote);
  return it == peers_.end() ? nullptr : it->second;
}

Result<void*> TransferEngine::Impl::MapImported(const std::string& remote, uint64_t allocation,
                                                size_t* size) {
  MB_ASSIGN_OR_RETURN(detail::Reply r, core_->conn().Call(ipc::EngineImportRequest{remote, allocation}));
  auto* m = std::get_if<ipc::ImportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineImportRequest got a wrong reply");
  int prot = PROT_READ | (m->read_only ? 0 : PROT_WRITE);
  void* base = ::mmap(nullptr, m->size, prot, MAP_SHARED, r.fds[0].get(), 0);
  if (base == MAP_FAILED) {
    int err = errno;
    (void)core_->conn().SendOneWay(ipc::EngineReleaseRequest{allocation});
    return ipc::ErrnoStatus("mmap", "engine \"" + remote + "\" memory, " + std::to_string(m->size) + " bytes",
                            err, {{0, ErrorCode::kResourceExhausted, ""}});
  }
  *size = m->size;
  return base;
}

void TransferEngine::Impl::ReleaseImported(void* base, size_t size, uint64_t allocation) {
  ::munmap(base, size);
  (void)core_->conn().SendOneWay(ipc::EngineReleaseRequest{allocation});
}

void TransferEngine::Impl::DropPeerMappings(Peer& peer, bool tell_broker) {
  auto drop = [&](void* base, size_t size, uint64_t allocation) {
    if (tell_broker) ReleaseImported(base, size, allocation);
    else ::munmap(base, size);
  };
  for (auto& [alloc, m] : peer.maps) drop(m.base, m.size, alloc);
  peer.maps.clear();
  peer.regions.clear();
  peer.fresh = false;
  if (peer.control != nullptr) {
    drop(peer.control, sizeof(ControlBlock), peer.control_allocation);
    peer.control = nullptr;
  }
}

bool TransferEngine::Impl::Stale(Peer& peer) {
  std::shared_lock<std::shared_timed_mutex> lk(peer.mu);
  return peer.epoch != core_->reattaches();
}

Status TransferEngine::Impl::Adopt(Peer& peer, const ipc::EngineInfoReply& info) {
  peer.pid = info.pid;
  peer.slot = info.slot;
  peer.control_allocation = info.control_allocation;
  auto pidfd = ipc::PidfdOpenIfSupported(info.pid);
  if (pidfd.ok()) peer.pidfd = std::move(*pidfd);
  if (!pidfd.ok() || !PeerAlive(peer))
    return Status(ErrorCode::kNotConnected, "engine \"" + peer.name + "\" exited while connecting");
  size_t size = 0;
  MB_ASSIGN_OR_RETURN(void* control, MapImported(peer.name, info.control_allocation, &size));
  peer.control = static_cast<ControlBlock*>(control);
  ControlSlot& slot = peer.control->slots[peer.slot % ipc::kEngineSlots];
  slot.busy.store(0);  // a previous holder of this slot may have died mid-transfer
  return Status::Ok();
}

Status TransferEngine::Impl::Reconnect(Peer& peer, Clock::time_point deadline) {
  std::unique_lock<std::shared_timed_mutex> lk(peer.mu);
  const uint64_t epoch = core_->reattaches();
  if (peer.epoch == epoch) return Status::Ok();  // another thread did it
  if (peer.lost.load()) return NotConnected(peer.name);
  if (!core_->conn().attached())
    return Status(ErrorCode::kNotConnected, "the broker went away; engine \"" + peer.name +
                                                "\" is connected again once this client has reattached");
  DropPeerMappings(peer, /*tell_broker=*/false);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const uint32_t wait_ms = static_cast<uint32_t>(std::max<int64_t>(left.count(), 0));
  auto reply = core_->conn().Call(ipc::EngineConnectRequest{peer.name, wait_ms}, std::chrono::milliseconds(wait_ms));
  auto* info = reply.ok() ? std::get_if<ipc::EngineInfoReply>(&reply->body) : nullptr;
  Status st = info != nullptr ? Adopt(peer, *info)
              : reply.ok()    ? Status(ErrorCode::kProtocolError, "EngineConnectRequest got a wrong reply")
                              : reply.status();
  if (st.ok()) {
    peer.epoch = epoch;
    return st;
  }
  if (info != nullptr) (void)core_->conn().Call(ipc::EngineDisconnectRequest{peer.name});
  // Its engine did not come back to the new broker in time: lost, as if it
  // had exited (Connect starts over). A broker gone again is tried next time.
  if (st.code() == ErrorCode::kNotFound || st.code() == ErrorCode::kTimeout || info != nullptr) {
    peer.lost.store(true);
    peer.epoch = epoch;
    return Status(ErrorCode::kNotConnected, "engine \"" + peer.name +
                                                "\" is not back after the broker restarted: " + st.message());
  }
  return st;
}

Status TransferEngine::Impl::Connect(const std::string& remote, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  if (detail::LooksLikeHostPort(remote)) return ConnectByAddress(remote, timeout_ms);
  MB_RETURN_IF_ERROR(ipc::CheckName(remote, ipc::kMaxEngineNameBytes, "a remote engine name"));
  if (auto old = FindPeer(remote)) {
    if (!old->lost.load()) return Status(ErrorCode::kAlreadyConnected, "already connected to engine \"" + remote + "\"");
    (void)Disconnect(remote, timeout_ms);  // the old peer went away: start over
  }
  // The broker answers only with an engine whose process it knows is alive,
  // waiting up to timeout_ms for one to appear.
  const uint64_t epoch = core_->reattaches();
  auto reply = core_->conn().Call(ipc::EngineConnectRequest{remote, static_cast<uint32_t>(std::max(timeout_ms, 0))},
                                   std::chrono::milliseconds(std::max(timeout_ms, 0)));
  if (!reply.ok()) return reply.status();
  auto* info = std::get_if<ipc::EngineInfoReply>(&reply->body);
  if (info == nullptr) return Status(ErrorCode::kProtocolError, "EngineConnectRequest got a wrong reply");
  auto peer = std::make_shared<Peer>();
  peer->name = remote;
  peer->epoch = epoch;
  if (Status st = Adopt(*peer, *info); !st.ok()) {
    (void)core_->conn().Call(ipc::EngineDisconnectRequest{remote});
    return st;
  }
  std::lock_guard<std::mutex> lk(peers_mu_);
  peers_[remote] = std::move(peer);
  return Status::Ok();
}

Status TransferEngine::Impl::Disconnect(const std::string& remote, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    auto it = peers_.find(remote);
    if (it == peers_.end()) return NotConnected(remote);
    peer = it->second;
    peers_.erase(it);
  }
  if (peer->net_conn != 0) {
    Status st = transport_->Close(peer->net_conn, DeadlineAfter(timeout_ms));
    if (st.code() == ErrorCode::kTimeout) {
      std::lock_guard<std::mutex> plk(peers_mu_);
      peers_.emplace(remote, peer);
    }
    ReportNetwork(/*force=*/true);
    return st;
  }
  if (!peer->address.empty()) ReportNetwork(/*force=*/true);  // a same-host engine connected by ip:port
  // Our transfers to it finish first (new ones no longer find it).
  std::unique_lock<std::shared_timed_mutex> lk(peer->mu, std::defer_lock);
  if (!lk.try_lock_for(std::chrono::milliseconds(std::max<int32_t>(timeout_ms, 0)))) {
    std::lock_guard<std::mutex> plk(peers_mu_);
    peers_.emplace(remote, peer);
    return Status(ErrorCode::kTimeout, "transfers to \"" + remote + "\" still running after the timeout");
  }
  // A connection made at a broker that is gone: the new one never knew it.
  const bool stale = peer->epoch != core_->reattaches();
  DropPeerMappings(*peer, !stale);
  if (stale) return Status::Ok();
  Status st = core_->conn().Call(ipc::EngineDisconnectRequest{peer->name}).status();
  if (peer->lost.load() && st.code() == ErrorCode::kNotConnected) return Status::Ok();
  return st;
}

Status TransferEngine::Impl::Refresh(Peer& peer) {
  std::unique_lock<std::shared_timed_mutex> lk(peer.mu);
  if (peer.lost.load() || peer.control == nullptr) return NotConnected(peer.name);
  const uint32_t generation = peer.control->generation.load();
  auto reply = core_->conn().Call(ipc::EngineRegionsRequest{peer.name});
  if (!reply.ok()) {
    // NOT_CONNECTED from the broker itself (not a broker gone, or a new one
    // that has not seen this connection yet): the peer's engine is gone.
    const bool peer_gone = reply.code() == ErrorCode::kNotConnected && core_->conn().attached() &&
                           peer.epoch == core_->reattaches();
    if (!peer_gone) return reply.status();
    peer.lost.store(true);
    return Status(ErrorCode::kNotConnected, "engine \"" + peer.name + "\" finalized or went away");
  }
  auto* info = std::get_if<ipc::EngineInfoReply>(&reply->body);
  if (info == nullptr) return Status(ErrorCode::kProtocolError, "EngineRegionsRequest got a wrong reply");
  peer.regions.clear();
  std::unordered_map<uint64_t, RemoteMap> keep;
  for (const auto& r : info->regions) {
    peer.regions[r.address] = r;
    if (r.allocation == 0 || keep.count(r.allocation)) continue;
    if (auto m = peer.maps.find(r.allocation); m != peer.maps.end()) {
      keep.emplace(r.allocation, m->second);
      peer.maps.erase(m);
      continue;
    }
    size_t size = 0;
    auto base = MapImported(peer.name, r.allocation, &size);
    if (base.ok()) keep.emplace(r.allocation, RemoteMap{*base, size});
    // else: the region stays unresolvable; descriptors into it are PARAM_INVALID
  }
  for (auto& [alloc, m] : peer.maps) ReleaseImported(m.base, m.size, alloc);
  peer.maps = std::move(keep);
  peer.generation = generation;
  peer.fresh = true;
  return Status::Ok();
}

Status TransferEngine::Impl::Transfer(const std::string& remote, TransferOp op,
                                      const std::vector<TransferOpDesc>& descs,
                                      Clock::time_point deadline) {
  if (!initialized_) return NotInitialized();
  if (op != READ && op != WRITE) return Status(ErrorCode::kParamInvalid, "op must be READ or WRITE");
  std::shared_ptr<Peer> peer = FindPeer(remote);
  if (peer == nullptr) return NotConnected(remote);
  if (peer->net_conn != 0) {
    // Local ranges stay registered (and mapped) until the transfer is over.
    std::shared_lock<std::shared_mutex> local_lk(local_mu_);
    MB_RETURN_IF_ERROR(CheckLocal(op, descs));
    return transport_->Transfer(peer->net_conn, op, descs, deadline);
  }
  if (Stale(*peer)) MB_RETURN_IF_ERROR(Reconnect(*peer, deadline));
  {
    std::shared_lock<std::shared_timed_mutex> lk(peer->mu);  // (a reconnect replaces pid and pidfd)
    if (peer->lost.load() || !PeerAlive(*peer)) {
      peer->lost.store(true);
      return Status(ErrorCode::kNotConnected, "engine \"" + remote + "\" (pid " +
                                                  std::to_string(peer->pid) + ") has exited");
    }
  }
  std::shared_lock<std::shared_mutex> local_lk(local_mu_);
  MB_RETURN_IF_ERROR(CheckLocal(op, descs));
  for (int attempt = 0;; ++attempt) {
    bool retry = false;
    Status st;
    {
      // Shared: the control block and mappings stay while we copy (a
      // reconnect after a reattach replaces them under the exclusive lock).
      std::shared_lock<std::shared_timed_mutex> lk(peer->mu);
      if (peer->control == nullptr) return NotConnected(remote);
      ControlSlot& slot = peer->control->slots[peer->slot % ipc::kEngineSlots];
      slot.busy.fetch_add(1);
      if (peer->fresh && peer->control->generation.load() == peer->generation)
        st = ResolveAndCopy(*peer, op, descs, deadline, &retry);
      else
        retry = true;
      if (slot.busy.fetch_sub(1) == 1 && peer->control->draining.load() != 0) detail::FutexWakeAll(&slot.busy);
    }
    if (!retry) return st;
    // A range still missing after two refreshes is not registered; a
    // generation that keeps moving (the peer registering and deregistering)
    // is retried until the deadline, never reported as done.
    if (!st.ok() && attempt >= 2) return st;
    if (Clock::now() > deadline)
      return Status(ErrorCode::kTimeout, "engine \"" + remote + "\" kept changing its registered memory until the "
                                         "transfer's timeout; nothing was copied");
    MB_RETURN_IF_ERROR(Refresh(*peer));
  }
}

Status TransferEngine::Impl::CheckLocal(TransferOp op, const std::vector<TransferOpDesc>& descs) {
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto it = ipc::Containing(local_, d.local_addr, d.len, [](const LocalRegion& r) { return r.len; });
    if (d.len == 0 || it == local_.end() || it->second.draining)
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": local range is empty or not inside memory this engine registered");
    if (op == READ && it->second.read_only)
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) + ": local range is read-only");
  }
  return Status::Ok();
}

Status TransferEngine::Impl::ResolveAndCopy(Peer& peer, TransferOp op,
                                            const std::vector<TransferOpDesc>& descs,
                                            Clock::time_point deadline, bool* retry) {
  std::vector<CopySegment> segs;
  std::vector<iovec> local_iov, remote_iov;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto it = ipc::Containing(peer.regions, d.remote_addr, d.len, [](const ipc::EngineRegion& r) { return r.length; });
    const ipc::EngineRegion* r = it == peer.regions.end() ? nullptr : &it->second;
    if (r == nullptr) {
      *retry = true;  // maybe registered since our last refresh
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": remote range is not inside memory engine \"" +
                                                  peer.name + "\" registered");
    }
    if (op == WRITE && r->read_only)
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": remote range is read-only for its owner");
    char* local = reinterpret_cast<char*>(d.local_addr);
    if (r->allocation == 0) {
      local_iov.push_back({local, d.len});
      remote_iov.push_back({reinterpret_cast<void*>(d.remote_addr), d.len});
      continue;
    }
    auto m = peer.maps.find(r->allocation);
    if (m == peer.maps.end())
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": the remote memory could not be mapped here");
    char* there = static_cast<char*>(m->second.base) + r->offset + (d.remote_addr - r->address);
    segs.push_back(op == READ ? CopySegment{local, there, d.len} : CopySegment{there, local, d.len});
  }
  MB_RETURN_IF_ERROR(CopyAll(segs, deadline));
  if (!local_iov.empty()) MB_RETURN_IF_ERROR(CrossMemory(peer, op, local_iov, remote_iov, deadline));
  return Status::Ok();
}

Status TransferEngine::Impl::CopyAll(std::vector<CopySegment>& segs, Clock::time_point deadline) {
  size_t total = 0;
  for (const auto& s : segs) total += s.len;
  auto timed_out = [&] { return Clock::now() > deadline; };
  auto copy_range = [&](std::span<const CopySegment> part) -> bool {
    size_t since_check = 0;
    for (const auto& s : part) {
      for (size_t done = 0; done < s.len;) {
        size_t n = std::min(kCopyChunk, s.len - done);
        std::memcpy(s.dst + done, s.src + done, n);
        done += n;
        since_check += n;
        if (since_check >= kCopyChunk) {
          since_check = 0;
          if (timed_out()) return false;
        }
      }
    }
    return true;
  };
  if (total < kParallelCopyBytes || copy_pool_.size() == 0) {
    if (!copy_range(segs)) return Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
    return Status::Ok();
  }
  // Split the bytes into equal shares; segments are cut where a share ends.
  const size_t workers = copy_pool_.size() + 1;
  const size_t share = (total + workers - 1) / workers;
  std::vector<std::vector<CopySegment>> parts(workers);
  size_t w = 0, filled = 0;
  for (const auto& s : segs) {
    for (size_t off = 0; off < s.len;) {
      size_t n = std::min(s.len - off, share - filled);
      parts[w].push_back({s.dst + off, s.src + off, n});
      off += n;
      filled += n;
      if (filled == share && w + 1 < workers) {
        ++w;
        filled = 0;
      }
    }
  }
  std::atomic<bool> ok{true};
  std::latch done(static_cast<ptrdiff_t>(workers - 1));
  for (size_t i = 1; i < workers; ++i)
    copy_pool_.Post([&, i] {
      if (!copy_range(parts[i])) ok.store(false);
      done.count_down();
    });
  if (!copy_range(parts[0])) ok.store(false);
  done.wait();
  return ok.load() ? Status::Ok() : Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
}

Status TransferEngine::Impl::CrossMemory(Peer& peer, TransferOp op, std::vector<iovec>& local,
                                         std::vector<iovec>& remote, Clock::time_point deadline) {
  for (size_t first = 0; first < local.size();) {
    if (Clock::now() > deadline) return Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
    size_t count = std::min(kMaxIov, local.size() - first);
    size_t want = 0;
    for (size_t i = first; i < first + count; ++i) want += local[i].iov_len;
    ssize_t n = op == READ
                    ? ::process_vm_readv(peer.pid, &local[first], count, &remote[first], count, 0)
                    : ::process_vm_writev(peer.pid, &local[first], count, &remote[first], count, 0);
    if (n < 0 || static_cast<size_t>(n) < want) {
      int err = n < 0 ? errno : EFAULT;
      if (err == ESRCH) peer.lost.store(true);
      return ipc::ErrnoStatus(
          op == READ ? "process_vm_readv" : "process_vm_writev", "engine \"" + peer.name + "\"", err,
          {{ESRCH, ErrorCode::kNotConnected, "the engine's process exited during the transfer"},
           {EPERM, ErrorCode::kPermissionDenied,
            "the kernel refused cross-memory attach: ptrace rules, same user, and Yama's ptrace_scope"},
           {0, ErrorCode::kNotMapped, "the engine's memory could not be reached"}});
    }
    first += count;
  }
  return Status::Ok();
}

Status TransferEngine::Impl::TransferAsync(const std::string& remote, TransferOp op,
                                           const std::vector<TransferOpDesc>& descs, TransferReq& req,
                                           int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  if (FindPeer(remote) == nullptr) return NotConnected(remote);
  auto r = std::make_shared<AsyncRequest>();
  {
    std::lock_guard<std::mutex> lk(req_mu_);
    req = next_req_++;
    requests_[req] = r;
  }
  const auto deadline = DeadlineAfter(timeout_ms);
  async_pool_.Post([this, r, remote, op, descs, deadline] {
    Status st = Clock::now() > deadline ? Status(ErrorCode::kTimeout, "transfer waited past its timeout")
                                        : Transfer(remote, op, descs, deadline);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(req_mu_);
      last_error_ = st;
    }
    r->status.store(st.ok() ? TransferStatus::COMPLETED
                    : st.code() == ErrorCode::kTimeout ? TransferStatus::TIMEOUT
                                                       : TransferStatus::FAILED);
  });
  return Status::Ok();
}

Status TransferEngine::Impl::GetTransferStatus(TransferReq req, TransferStatus& status) {
  std::lock_guard<std::mutex> lk(req_mu_);
  auto it = requests_.find(req);
  if (it == requests_.end())
    return Status(ErrorCode::kParamInvalid, "unknown transfer request " + std::to_string(req) +
                                                " (never made, or its final status was read)");
  status = it->second->status.load();
  if (status != TransferStatus::WAITING) requests_.erase(it);
  return Status::Ok();
}

Status TransferEngine::Impl::SendNotify(const std::string& remote, const NotifyDesc& notify,
                                        int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  auto peer = FindPeer(remote);
  if (peer == nullptr || peer->lost.load()) return NotConnected(remote);
  if (notify.name.size() > ipc::kMaxNotifyNameBytes || notify.notify_msg.size() > ipc::kMaxNotifyMessageBytes)
    return Status(ErrorCode::kParamInvalid, "notify name is at most 128 bytes, its message at most 1024");
  if (!ipc::IsValidUtf8(notify.name)) return Status(ErrorCode::kParamInvalid, "a notify name must be valid UTF-8");
  if (peer->net_conn != 0)
    return transport_->SendNotify(peer->net_conn, notify.name, notify.notify_msg, DeadlineAfter(timeout_ms));
  if (Stale(*peer)) MB_RETURN_IF_ERROR(Reconnect(*peer, DeadlineAfter(timeout_ms)));
  return core_->conn().Call(ipc::EngineNotifyRequest{peer->name, notify.name, notify.notify_msg}).status();
}

Status TransferEngine::Impl::GetNotifies(std::vector<Notify>& notifies) {
  if (!initialized_) return NotInitialized();
  notifies.clear();
  {
    std::lock_guard<std::mutex> lk(transport_mu_);
    if (transport_)
      for (auto& n : transport_->TakeNotifies())
        notifies.push_back(Notify{std::move(n.from), std::move(n.name), std::move(n.message)});
  }
  ReportNetwork();
  // Notifies from other hosts were taken above: they are returned even when
  // the broker (which queues this host's) cannot be asked, never dropped.
  const size_t from_other_hosts = notifies.size();
  for (;;) {
    auto reply = core_->conn().Call(ipc::EngineGetNotifiesRequest{});
    if (!reply.ok()) return from_other_hosts > 0 ? Status::Ok() : reply.status();
    detail::Reply& r = *reply;
    auto* m = std::get_if<ipc::EngineNotifiesReply>(&r.body);
    if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineGetNotifiesRequest got a wrong reply");
    for (auto& n : m->notifies)
      notifies.push_back(Notify{std::move(n.from), std::move(n.name), std::move(n.message)});
    if (m->notifies.size() < ipc::kMaxNotifiesPerReply) return Status::Ok();
  }
}

Status TransferEngine::Impl::ConfigureNetwork(const std::string& name, const uint8_t (&identity)[16],
                                              const std::map<std::string, std::string>& options) {
  auto get = [&](const char* key) {
    auto it = options.find(key);
    return it == options.end() ? std::string() : it->second;
  };
  const std::string listen = get("listen_address"), secret_file = get("secret_file"), allow = get("allow_from");
  if (listen.empty() && secret_file.empty() && allow.empty()) return Status::Ok();
  detail::NetOptions o;
  o.engine_name = name;
  std::memcpy(o.identity.data(), identity, sizeof(identity));
  if (!listen.empty()) {
    MB_RETURN_IF_ERROR(detail::ParseHostPort(listen, /*allow_any_port=*/true).status());
    if (secret_file.empty() && allow.empty())
      return Status(ErrorCode::kParamInvalid, "listen_address needs secret_file or allow_from: an engine that "
                                              "listens admits nobody by default");
    o.listen = listen;
  }
  if (!allow.empty()) {
    MB_ASSIGN_OR_RETURN(o.allow_from, detail::ParseAllowList(allow));
  }
  if (!secret_file.empty()) {
    ipc::UniqueFd fd(::open(secret_file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid())
      return Status(ErrorCode::kParamInvalid, "secret_file \"" + ipc::EscapeText(secret_file) + "\": " + std::strerror(errno));
    if (std::string problem = ipc::PrivateFileProblem(fd.get()); !problem.empty())
      return Status(ErrorCode::kPermissionDenied, "secret_file \"" + ipc::EscapeText(secret_file) + "\" " + problem);
    char buf[detail::kMaxNetSecretBytes + 2];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) return Status(ErrorCode::kParamInvalid, "secret_file: " + std::string(std::strerror(errno)));
    std::string secret(buf, static_cast<size_t>(n));
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty() || secret.size() > detail::kMaxNetSecretBytes)
      return Status(ErrorCode::kParamInvalid, "secret_file must hold 1 to 4096 bytes of secret");
    o.secret = std::move(secret);
  }
  net_options_ = std::move(o);
  return Status::Ok();
}

Status TransferEngine::Impl::StartListening() {
  if (net_options_.listen.empty()) return Status::Ok();
  MB_RETURN_IF_ERROR(Transport().status());
  ReportNetwork();
  return Status::Ok();
}

Result<detail::NetTransport*> TransferEngine::Impl::Transport() {
  // Ranges registered before the transport existed are mapped for it now
  // (RegisterMem, exclusive on local_mu_, maps the later ones).
  std::shared_lock<std::shared_mutex> local_lk(local_mu_);
  std::lock_guard<std::mutex> lk(transport_mu_);
  if (!transport_) {
    if (net_options_.engine_name.empty()) {
      net_options_.engine_name = name_;
      std::memcpy(net_options_.identity.data(), control_->identity, sizeof(control_->identity));
    }
    MB_ASSIGN_OR_RETURN(std::unique_ptr<detail::NetTransport> t, detail::StartNetTransport(net_options_));
    for (const auto& [addr, r] : local_)
      if (!r.draining) MB_RETURN_IF_ERROR(t->AddRegion(r.handle, r.addr, r.len, r.read_only));
    transport_ = std::move(t);
  }
  return transport_.get();
}

Status TransferEngine::Impl::ConnectByAddress(const std::string& address, int32_t timeout_ms) {
  if (auto old = FindPeer(address)) {
    if (!old->lost.load()) return Status(ErrorCode::kAlreadyConnected, "already connected to " + address);
    (void)Disconnect(address, timeout_ms);
  }
  const auto deadline = DeadlineAfter(timeout_ms);
  MB_ASSIGN_OR_RETURN(detail::NetTransport * t, Transport());
  detail::NetPeerInfo info;
  MB_ASSIGN_OR_RETURN(uint64_t conn, t->Connect(address, deadline, &info));
  auto peer = std::make_shared<Peer>();
  peer->name = info.engine;
  peer->address = info.address;
  // Is it this host's? The broker knows an engine of that name whose control
  // block holds the identity the Welcome carried: then the bytes go through
  // the mapped broker memory, never through the network stack.
  auto reply = core_->conn().Call(ipc::EngineConnectRequest{info.engine, 0}, std::chrono::milliseconds(1000));
  if (reply.code() == ErrorCode::kAlreadyConnected) {
    // Connected by name already: the same engine if its control block says so.
    bool same = false;
    if (std::shared_ptr<Peer> by_name = FindPeer(info.engine)) {
      std::shared_lock<std::shared_timed_mutex> plk(by_name->mu);
      same = by_name->control != nullptr &&
             std::memcmp(by_name->control->identity, info.identity.data(), info.identity.size()) == 0;
    }
    if (same) {
      (void)t->Close(conn, deadline);
      return Status(ErrorCode::kAlreadyConnected, "already connected to the engine at " + address + " by its name \"" +
                                                      ipc::EscapeText(info.engine) + "\" (it is on this host)");
    }
  }
  auto* local = reply.ok() ? std::get_if<ipc::EngineInfoReply>(&reply->body) : nullptr;
  if (local != nullptr) {
    peer->epoch = core_->reattaches();
    Status st = Adopt(*peer, *local);
    if (st.ok() && std::memcmp(peer->control->identity, info.identity.data(), info.identity.size()) == 0) {
      (void)t->Close(conn, deadline);
      {
        std::lock_guard<std::mutex> lk(peers_mu_);
        peers_[address] = std::move(peer);
      }
      ReportNetwork(/*force=*/true);
      return Status::Ok();
    }
    // A namesake at our broker, not the engine that answered: this one is remote.
    DropPeerMappings(*peer);
    (void)core_->conn().Call(ipc::EngineDisconnectRequest{info.engine});
    peer = std::make_shared<Peer>();
    peer->name = info.engine;
    peer->address = info.address;
  }
  peer->net_conn = conn;
  peer->transports = info.transports;
  {
    std::lock_guard<std::mutex> lk(peers_mu_);
    peers_[address] = std::move(peer);
  }
  ReportNetwork(/*force=*/true);
  return Status::Ok();
}

void TransferEngine::Impl::ReportNetwork(bool force) {
  ipc::EngineNetworkRequest r;
  {
    std::lock_guard<std::mutex> lk(transport_mu_);
    if (!transport_) return;
    const uint64_t changes = transport_->changes();
    if (changes == reported_changes_ && !force) return;
    reported_changes_ = changes;
    const detail::NetStats u = transport_->stats();
    r.listen_address = transport_->listen_address();
    r.accepted = u.accepted;
    r.refused = u.refused;
    uint64_t outbound = 0;
    std::lock_guard<std::mutex> plk(peers_mu_);
    for (const auto& [key, p] : peers_) {
      if (p->address.empty() || r.connections.size() >= ipc::kMaxNetConnections) continue;  // connected by name
      outbound += p->net_conn != 0;
      r.connections.push_back({key, p->name, p->net_conn != 0 ? "ucx" : "same-host",
                               (p->net_conn != 0 ? p->transports : "memcpy").substr(0, ipc::kMaxNetTransportsBytes)});
    }
    r.inbound = u.connections > outbound ? u.connections - outbound : 0;
  }
  // Sent with no lock held; the broker only records it, and a failure loses nothing.
  (void)core_->conn().SendOneWay(std::move(r));
}

Status TransferEngine::Impl::GetConnectionInfo(const std::string& remote, ConnectionInfo& info) {
  if (!initialized_) return NotInitialized();
  auto peer = FindPeer(remote);
  if (peer == nullptr) return NotConnected(remote);
  info.engine = peer->name;
  info.address = peer->net_conn != 0 ? peer->address : "";
  info.path = peer->net_conn != 0 ? "ucx" : "same-host";
  info.transports = peer->net_conn != 0 ? peer->transports : "memcpy";
  return Status::Ok();
}

Status TransferEngine::Impl::GetNetworkStats(NetworkStats& stats) {
  if (!initialized_) return NotInitialized();
  stats = NetworkStats{};
  ReportNetwork();
  std::lock_guard<std::mutex> lk(transport_mu_);
  if (transport_) {
    const detail::NetStats u = transport_->stats();
    stats.listen_address = transport_->listen_address();
    stats.accepted = u.accepted;
    stats.refused = u.refused;
    stats.connections = u.connections;
    stats.last_refusal = u.last_refusal;
  }
  return Status::Ok();
}

// The public class forwards to Impl.
TransferEngine::TransferEngine(const Client& client)
    : impl_(std::make_unique<Impl>(client, client.core_)) {}
TransferEngine::~TransferEngine() { impl_->Finalize(); }
Status TransferEngine::Initialize(const std::string& name, const std::map<std::string, std::string>& options) {
  return impl_->Initialize(name, options);
}
void TransferEngine::Finalize() { impl_->Finalize(); }
Status TransferEngine::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) {
  return impl_->RegisterMem(mem, type, handle);
}
Status TransferEngine::DeregisterMem(MemHandle handle) { return impl_->DeregisterMem(handle); }
Status TransferEngine::Connect(const std::string& remote, int32_t timeout_ms) {
  return impl_->Connect(remote, timeout_ms);
}
Status TransferEngine::Disconnect(const std::string& remote, int32_t timeout_ms) {
  return impl_->Disconnect(remote, timeout_ms);
}
Status TransferEngine::TransferSync(const std::string& remote, TransferOp op,
                                    const std::vector<TransferOpDesc>& descs, int32_t timeout_ms) {
  return impl_->Transfer(remote, op, descs, DeadlineAfter(timeout_ms));
}
Status TransferEngine::TransferAsync(const std::string& remote, TransferOp op,
                                     const std::vector<TransferOpDesc>& descs, TransferReq& req,
                                     int32_t timeout_ms) {
  return impl_->TransferAsync(remote, op, descs, req, timeout_ms);
}
Status TransferEngine::GetTransferStatus(TransferReq req, TransferStatus& status) {
  return impl_->GetTransferStatus(req, status);
}
Status TransferEngine::GetTransferStatus(std::span<const TransferReq> reqs,
                                         std::vector<TransferStatus>& statuses) {
  statuses.assign(reqs.size(), TransferStatus::FAILED);
  for (size_t i = 0; i < reqs.size(); ++i) MB_RETURN_IF_ERROR(impl_->GetTransferStatus(reqs[i], statuses[i]));
  return Status::Ok();
}
Status TransferEngine::last_error() const { return impl_->last_error(); }
Status TransferEngine::SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms) {
  return impl_->SendNotify(remote, notify, timeout_ms);
}
Status TransferEngine::GetNotifies(std::vector<Notify>& notifies) { return impl_->GetNotifies(notifies); }
Status TransferEngine::GetConnectionInfo(const std::string& remote, ConnectionInfo& info) const {
  return impl_->GetConnectionInfo(remote, info);
}
Status TransferEngine::GetNetworkStats(NetworkStats& stats) const { return impl_->GetNetworkStats(stats); }

}  // namespace membroker
