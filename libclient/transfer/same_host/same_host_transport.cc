// The same-host transport (same_host_transport.h).
#include "transfer/same_host/same_host_transport.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <latch>
#include <shared_mutex>
#include <span>
#include <unordered_map>

#include "client/device_vmm.h"
#include "shm/futex.h"
#include "membroker/ipc/engine_control.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/ranges.h"
#include "membroker/ipc/syscall.h"

namespace membroker::detail {

namespace {

using ControlBlock = ipc::EngineControlBlock;
using ControlSlot = ipc::EngineControlSlot;
constexpr size_t kCopyChunk = 1 << 20;          // deadline checks between chunks
constexpr size_t kParallelCopyBytes = 8 << 20;  // below this one thread copies
constexpr size_t kMaxIov = 1024;                // IOV_MAX

bool PidAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

Status NotConnected(const std::string& remote) {
  return Status(ErrorCode::kNotConnected, "not connected to engine \"" + remote + "\"");
}

// A peer the broker says is connected to this engine.
struct ConnectedPeer {
  uint32_t slot = 0;
  pid_t pid = 0;
  ipc::UniqueFd pidfd;  // opened while the broker vouched for the pid
};

struct CopySegment {
  char* dst;
  const char* src;
  size_t len;
};

// A copy with device memory on one side or both: the driver's.
struct DeviceSegment {
  uintptr_t dst;
  bool dst_device;
  uintptr_t src;
  bool src_device;
  size_t len;
  int device;
};

}  // namespace

// One connection to an engine at this host's broker.
struct SameHostTransport::Peer {
  std::string name;
  pid_t pid = 0;
  ipc::UniqueFd pidfd;
  uint32_t slot = 0;
  uint64_t control_allocation = 0;
  ControlBlock* control = nullptr;  // the remote's, mapped here
  // Shared by transfers; exclusive to refresh the region list or close.
  std::shared_timed_mutex mu;
  uint32_t generation = 0;                        // of the control block when `regions` was fetched
  bool fresh = false;                             // regions fetched at least once
  std::map<uint64_t, ipc::EngineRegion> regions;  // by remote address
  std::unordered_map<uint64_t, ImportedMemory> maps;  // allocation -> mapping here
  std::atomic<bool> lost{false};
  uint64_t epoch = 0;  // the client's reattach count when this connection was made (under mu)
};

namespace {

// One check: the pidfd where there is one (a pid can be reused), the pid otherwise.
bool PeerAlive(const SameHostTransport::Peer& p) {
  return p.pidfd.valid() ? ipc::PidfdAlive(p.pidfd.get()) : PidAlive(p.pid);
}

// Copies every segment, split over pool's threads and this one for large batches.
Status CopyAll(ThreadPool& pool, std::vector<CopySegment>& segs, Transport::Clock::time_point deadline) {
  size_t total = 0;
  for (const auto& s : segs) total += s.len;
  auto timed_out = [&] { return Transport::Clock::now() > deadline; };
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
  if (total < kParallelCopyBytes || pool.size() == 0) {
    if (!copy_range(segs)) return Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
    return Status::Ok();
  }
  // Split the bytes into equal shares; segments are cut where a share ends.
  const size_t workers = pool.size() + 1;
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
    pool.Post([&, i] {
      if (!copy_range(parts[i])) ok.store(false);
      done.count_down();
    });
  if (!copy_range(parts[0])) ok.store(false);
  done.wait();
  return ok.load() ? Status::Ok() : Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
}

// process_vm_readv / process_vm_writev into the peer's own memory.
Status CrossMemory(SameHostTransport::Peer& peer, TransferOp op, std::vector<iovec>& local, std::vector<iovec>& remote,
                   Transport::Clock::time_point deadline) {
  for (size_t first = 0; first < local.size();) {
    if (Transport::Clock::now() > deadline) return Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
    size_t count = std::min(kMaxIov, local.size() - first);
    size_t want = 0;
    for (size_t i = first; i < first + count; ++i) want += local[i].iov_len;
    ssize_t n = op == READ ? ::process_vm_readv(peer.pid, &local[first], count, &remote[first], count, 0)
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

// The peers the broker says are connected to this engine now.
Result<std::vector<ConnectedPeer>> ConnectedPeers(ClientCore& core) {
  MB_ASSIGN_OR_RETURN(Reply r, core.conn().Call(ipc::EnginePeersRequest{}));
  auto* m = std::get_if<ipc::EnginePeersReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EnginePeersRequest got a wrong reply");
  std::vector<ConnectedPeer> out;
  for (const ipc::EnginePeer& p : m->peers) {
    if (p.slot >= ipc::kEngineSlots) return Status(ErrorCode::kProtocolError, "the broker named a slot out of range");
    ConnectedPeer c{p.slot, p.pid, {}};
    if (auto fd = ipc::PidfdOpenIfSupported(p.pid); fd.ok())
      c.pidfd = std::move(*fd);
    else
      continue;  // exited already: nothing to wait for
    out.push_back(std::move(c));
  }
  return out;
}

// Bumps the generation of our control block and waits until none of peers is
// inside a transfer (or alive), until deadline at most: TIMEOUT naming the
// peer still busy.
Status WaitForPeers(ControlBlock* control, const std::vector<ConnectedPeer>& peers,
                    Transport::Clock::time_point deadline, std::chrono::milliseconds drain_timeout) {
  using Clock = Transport::Clock;
  control->generation.fetch_add(1);
  control->draining.fetch_add(1);
  Status st;
  for (const ConnectedPeer& p : peers) {
    ControlSlot& slot = control->slots[p.slot];
    for (;;) {
      uint32_t busy = slot.busy.load();
      const bool alive = p.pidfd.valid() ? ipc::PidfdAlive(p.pidfd.get()) : PidAlive(p.pid);
      if (busy == 0 || !alive) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        st = Status(ErrorCode::kTimeout, "a peer engine (pid " + std::to_string(p.pid) +
                                             ") is still inside a transfer into this "
                                             "engine's memory after " +
                                             std::to_string(drain_timeout.count()) +
                                             " ms (engine option drain_timeout_ms)");
        break;
      }
      // Woken when the peer's last transfer ends; re-checks its pidfd every 10 ms.
      FutexWait(&slot.busy, busy, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(10)));
    }
    if (!st.ok()) break;
  }
  control->draining.fetch_sub(1);
  return st;
}

}  // namespace

Result<std::unique_ptr<SameHostTransport>> SameHostTransport::Start(const Client& client,
                                                                    std::shared_ptr<ClientCore> core,
                                                                    const std::string& name,
                                                                    const std::array<uint8_t, 16>& identity,
                                                                    Options options) {
  std::unique_ptr<SameHostTransport> t(new SameHostTransport(client, std::move(core), options));
  // The control block: a 4 KiB allocation mapped here; peers map it too.
  MB_ASSIGN_OR_RETURN(PhysicalHandle h, t->client_.MallocPhysical(sizeof(ControlBlock)));
  MB_ASSIGN_OR_RETURN(Reservation range, t->client_.ReserveMemAddress(h.size()));
  MB_ASSIGN_OR_RETURN(Mapping map, t->client_.MapMem(range.base(), h.size(), 0, h));
  auto* control = map.as<ControlBlock>();
  std::memcpy(control->identity, identity.data(), identity.size());
  control->magic.store(ipc::kEngineControlMagic);
  MB_RETURN_IF_ERROR(t->core_->conn().Call(ipc::EngineInitRequest{name, h.id()}).status());
  t->core_->journal().RecordEngine(name, h.id());
  t->control_ = control;
  t->control_handle_ = std::move(h);
  t->control_range_ = std::move(range);
  t->control_map_ = std::move(map);
  t->copy_pool_.Start(options.copy_threads - 1);  // the calling thread copies too
  return t;
}

SameHostTransport::SameHostTransport(const Client& client, std::shared_ptr<ClientCore> core, Options options)
    : client_(client), core_(std::move(core)), options_(options) {}

SameHostTransport::~SameHostTransport() {
  {
    // Connections the engine could not close (their transfers outlived its
    // Disconnect): unmapped, and their imports given back while the engine
    // is still registered.
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto& [id, peer] : conns_) {
      std::unique_lock<std::shared_timed_mutex> plk(peer->mu);
      DropPeerMappings(*peer, peer->epoch == core_->reattaches());
    }
    conns_.clear();
  }
  if (control_ != nullptr) {
    // Who may still be inside our memory: asked before the broker forgets them.
    auto peers = ConnectedPeers(*core_);
    core_->journal().ForgetEngine();
    (void)core_->conn().Call(ipc::EngineFinalizeRequest{});
    if (peers.ok())  // bounded either way
      (void)WaitForPeers(control_, *peers, Clock::now() + options_.drain_timeout, options_.drain_timeout);
  }
  copy_pool_.Stop();
}

std::array<uint8_t, 16> SameHostTransport::identity() const {
  std::array<uint8_t, 16> out;
  std::memcpy(out.data(), control_->identity, out.size());
  return out;
}

Status SameHostTransport::AddRegion(const RegionDesc& r) {
  auto reply = core_->conn().Call(ipc::EngineRegisterRequest{r.address, r.length, r.allocation, r.offset, r.name});
  if (!reply.ok()) return reply.status();
  auto* m = std::get_if<ipc::EngineRegisterReply>(&reply->body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineRegisterRequest got a wrong reply");
  core_->SetEngineRegion(r.address, m->region);
  std::lock_guard<std::mutex> lk(regions_mu_);
  regions_[r.handle] = r.address;
  if (r.device >= 0) device_ranges_[r.address] = DeviceRange{r.length, r.device};
  return Status::Ok();
}

int SameHostTransport::LocalDevice(uintptr_t address, size_t length) {
  std::lock_guard<std::mutex> lk(regions_mu_);
  auto it = ipc::Containing(device_ranges_, address, length, [](const DeviceRange& r) { return r.length; });
  return it == device_ranges_.end() ? -1 : it->second.device;
}

Status SameHostTransport::RemoveRegion(uint64_t handle, Clock::time_point deadline) {
  uintptr_t address = 0;
  {
    std::lock_guard<std::mutex> lk(regions_mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end()) return Status::Ok();  // never added (a rollback), or removed
    address = it->second;
  }
  // Gone at the broker first (0: a reattach could not register it again, or
  // an earlier call that timed out already told it), so that peers that
  // refresh miss it; then the peers inside a transfer finish.
  if (const uint64_t region = core_->EngineRegion(address); region != 0) {
    MB_RETURN_IF_ERROR(core_->conn().Call(ipc::EngineDeregisterRequest{region}).status());
    core_->SetEngineRegion(address, 0);
  }
  MB_ASSIGN_OR_RETURN(std::vector<ConnectedPeer> peers, ConnectedPeers(*core_));
  MB_RETURN_IF_ERROR(WaitForPeers(control_, peers, deadline, options_.drain_timeout));
  std::lock_guard<std::mutex> lk(regions_mu_);
  regions_.erase(handle);
  device_ranges_.erase(address);
  return Status::Ok();
}

std::shared_ptr<SameHostTransport::Peer> SameHostTransport::Find(uint64_t conn) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  auto it = conns_.find(conn);
  return it == conns_.end() ? nullptr : it->second;
}

Result<uint64_t> SameHostTransport::Connect(const std::string& remote, Clock::time_point deadline, PeerInfo* info) {
  // The broker answers only with an engine whose process it knows is alive,
  // waiting until the deadline for one to appear.
  const uint64_t epoch = core_->reattaches();
  const auto wait =
      std::max<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(), 0);
  auto reply = core_->conn().Call(ipc::EngineConnectRequest{remote, static_cast<uint32_t>(wait)},
                                  std::chrono::milliseconds(wait));
  if (!reply.ok()) return reply.status();
  auto* m = std::get_if<ipc::EngineInfoReply>(&reply->body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineConnectRequest got a wrong reply");
  auto peer = std::make_shared<Peer>();
  peer->name = remote;
  peer->epoch = epoch;
  if (Status st = Adopt(*peer, *m); !st.ok()) {
    DropPeerMappings(*peer);
    (void)core_->conn().Call(ipc::EngineDisconnectRequest{remote});
    return st;
  }
  info->engine = remote;
  std::memcpy(info->identity.data(), peer->control->identity, info->identity.size());
  info->address.clear();
  info->transports = "memcpy";
  std::lock_guard<std::mutex> lk(conns_mu_);
  const uint64_t id = next_conn_++;
  conns_[id] = std::move(peer);
  return id;
}

Status SameHostTransport::Close(uint64_t conn, Clock::time_point deadline) {
  std::shared_ptr<Peer> peer = Find(conn);
  if (peer == nullptr) return Status(ErrorCode::kNotConnected, "no such connection");
  // Our transfers to it finish first.
  std::unique_lock<std::shared_timed_mutex> lk(peer->mu, std::defer_lock);
  if (!lk.try_lock_until(deadline))
    return Status(ErrorCode::kTimeout, "transfers to \"" + peer->name + "\" still running after the timeout");
  {
    std::lock_guard<std::mutex> clk(conns_mu_);
    conns_.erase(conn);
  }
  // A connection made at a broker that is gone: the new one never knew it.
  const bool stale = peer->epoch != core_->reattaches();
  DropPeerMappings(*peer, !stale);
  if (stale) return Status::Ok();
  Status st = core_->conn().Call(ipc::EngineDisconnectRequest{peer->name}).status();
  if (peer->lost.load() && st.code() == ErrorCode::kNotConnected) return Status::Ok();
  return st;
}

bool SameHostTransport::Lost(uint64_t conn) {
  std::shared_ptr<Peer> peer = Find(conn);
  return peer == nullptr || peer->lost.load();
}

Status SameHostTransport::SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                                     Clock::time_point deadline) {
  std::shared_ptr<Peer> peer = Find(conn);
  if (peer == nullptr) return Status(ErrorCode::kNotConnected, "no such connection");
  if (peer->lost.load()) return NotConnected(peer->name);
  if (Stale(*peer)) MB_RETURN_IF_ERROR(Reconnect(*peer, deadline));
  return core_->conn().Call(ipc::EngineNotifyRequest{peer->name, name, message}).status();
}

Status SameHostTransport::TakeNotifies(std::vector<ReceivedNotify>* out) {
  for (;;) {
    MB_ASSIGN_OR_RETURN(Reply r, core_->conn().Call(ipc::EngineGetNotifiesRequest{}));
    auto* m = std::get_if<ipc::EngineNotifiesReply>(&r.body);
    if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineGetNotifiesRequest got a wrong reply");
    for (auto& n : m->notifies)
      out->push_back(ReceivedNotify{std::move(n.from), std::move(n.name), std::move(n.message)});
    if (m->notifies.size() < ipc::kMaxNotifiesPerReply) return Status::Ok();
  }
}

Result<ImportedMemory> SameHostTransport::MapImported(const std::string& remote, uint64_t allocation) {
  MB_ASSIGN_OR_RETURN(Reply r, core_->conn().Call(ipc::EngineImportRequest{remote, allocation}));
  auto* m = std::get_if<ipc::ImportReply>(&r.body);
  if (m == nullptr) return Status(ErrorCode::kProtocolError, "EngineImportRequest got a wrong reply");
  auto give_back = [&] { (void)core_->conn().SendOneWay(ipc::EngineReleaseRequest{allocation}); };
  if (m->device >= 0) {  // device memory, mapped with the access its owner has
    auto va = device::MapWhole(r.fds[0].get(), m->size, m->device, m->read_only ? Access::kRead : Access::kReadWrite);
    if (!va.ok()) {
      give_back();
      return Status(va.code(), "engine \"" + remote + "\" device memory: " + va.status().message());
    }
    return ImportedMemory{reinterpret_cast<void*>(*va), m->size, m->device};
  }
  int prot = PROT_READ | (m->read_only ? 0 : PROT_WRITE);
  void* base = ::mmap(nullptr, m->size, prot, MAP_SHARED, r.fds[0].get(), 0);
  if (base == MAP_FAILED) {
    int err = errno;
    give_back();
    return ipc::ErrnoStatus("mmap", "engine \"" + remote + "\" memory, " + std::to_string(m->size) + " bytes", err,
                            {{0, ErrorCode::kResourceExhausted, ""}});
  }
  return ImportedMemory{base, m->size, -1};
}

void SameHostTransport::ReleaseImported(const ImportedMemory& m, uint64_t allocation, bool tell_broker) {
  if (m.device >= 0)
    (void)device::UnmapWhole(reinterpret_cast<uintptr_t>(m.base), m.size);
  else
    ::munmap(m.base, m.size);
  if (tell_broker) (void)core_->conn().SendOneWay(ipc::EngineReleaseRequest{allocation});
}

void SameHostTransport::DropPeerMappings(Peer& peer, bool tell_broker) {
  for (auto& [alloc, m] : peer.maps) ReleaseImported(m, alloc, tell_broker);
  peer.maps.clear();
  peer.regions.clear();
  peer.fresh = false;
  if (peer.control != nullptr) {
    ReleaseImported(ImportedMemory{peer.control, sizeof(ControlBlock), -1}, peer.control_allocation, tell_broker);
    peer.control = nullptr;
  }
}

bool SameHostTransport::Stale(Peer& peer) {
  std::shared_lock<std::shared_timed_mutex> lk(peer.mu);
  return peer.epoch != core_->reattaches();
}

Status SameHostTransport::Adopt(Peer& peer, const ipc::EngineInfoReply& info) {
  peer.pid = info.pid;
  peer.slot = info.slot;
  peer.control_allocation = info.control_allocation;
  auto pidfd = ipc::PidfdOpenIfSupported(info.pid);
  if (pidfd.ok()) peer.pidfd = std::move(*pidfd);
  if (!pidfd.ok() || !PeerAlive(peer))
    return Status(ErrorCode::kNotConnected, "engine \"" + peer.name + "\" exited while connecting");
  MB_ASSIGN_OR_RETURN(ImportedMemory control, MapImported(peer.name, info.control_allocation));
  if (control.device >= 0 || control.size < sizeof(ControlBlock)) {
    ReleaseImported(control, info.control_allocation);
    return Status(ErrorCode::kProtocolError, "engine \"" + peer.name + "\"'s control block is not one");
  }
  peer.control = static_cast<ControlBlock*>(control.base);
  ControlSlot& slot = peer.control->slots[peer.slot % ipc::kEngineSlots];
  slot.busy.store(0);  // a previous holder of this slot may have died mid-transfer
  return Status::Ok();
}

Status SameHostTransport::Reconnect(Peer& peer, Clock::time_point deadline) {
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
    return Status(ErrorCode::kNotConnected,
                  "engine \"" + peer.name + "\" is not back after the broker restarted: " + st.message());
  }
  return st;
}

Status SameHostTransport::Refresh(Peer& peer) {
  std::unique_lock<std::shared_timed_mutex> lk(peer.mu);
  if (peer.lost.load() || peer.control == nullptr) return NotConnected(peer.name);
  const uint32_t generation = peer.control->generation.load();
  auto reply = core_->conn().Call(ipc::EngineRegionsRequest{peer.name});
  if (!reply.ok()) {
    // NOT_CONNECTED from the broker itself (not a broker gone, or a new one
    // that has not seen this connection yet): the peer's engine is gone.
    const bool peer_gone =
        reply.code() == ErrorCode::kNotConnected && core_->conn().attached() && peer.epoch == core_->reattaches();
    if (!peer_gone) return reply.status();
    peer.lost.store(true);
    return Status(ErrorCode::kNotConnected, "engine \"" + peer.name + "\" finalized or went away");
  }
  auto* info = std::get_if<ipc::EngineInfoReply>(&reply->body);
  if (info == nullptr) return Status(ErrorCode::kProtocolError, "EngineRegionsRequest got a wrong reply");
  peer.regions.clear();
  std::unordered_map<uint64_t, ImportedMemory> keep;
  for (const auto& r : info->regions) {
    peer.regions[r.address] = r;
    if (r.allocation == 0 || keep.count(r.allocation)) continue;
    if (auto m = peer.maps.find(r.allocation); m != peer.maps.end()) {
      keep.emplace(r.allocation, m->second);
      peer.maps.erase(m);
      continue;
    }
    auto mapped = MapImported(peer.name, r.allocation);
    if (mapped.ok()) keep.emplace(r.allocation, *mapped);
    // else: the region stays unresolvable; descriptors into it are PARAM_INVALID
  }
  for (auto& [alloc, m] : peer.maps) ReleaseImported(m, alloc);
  peer.maps = std::move(keep);
  peer.generation = generation;
  peer.fresh = true;
  return Status::Ok();
}

Status SameHostTransport::RemoteRegions(uint64_t conn, Clock::time_point deadline, std::vector<RegionInfo>* out) {
  std::shared_ptr<Peer> peer = Find(conn);
  if (peer == nullptr) return Status(ErrorCode::kNotConnected, "no such connection");
  if (Stale(*peer)) MB_RETURN_IF_ERROR(Reconnect(*peer, deadline));
  MB_RETURN_IF_ERROR(Refresh(*peer));  // what the broker has now
  std::shared_lock<std::shared_timed_mutex> lk(peer->mu);
  out->clear();
  for (const auto& [address, r] : peer->regions) out->push_back(RegionInfo{r.name, address, r.length, r.read_only});
  return Status::Ok();
}

Status SameHostTransport::Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                                   Clock::time_point deadline) {
  std::shared_ptr<Peer> peer = Find(conn);
  if (peer == nullptr) return Status(ErrorCode::kNotConnected, "no such connection");
  const std::string& remote = peer->name;
  if (Stale(*peer)) MB_RETURN_IF_ERROR(Reconnect(*peer, deadline));
  {
    std::shared_lock<std::shared_timed_mutex> lk(peer->mu);  // (a reconnect replaces pid and pidfd)
    if (peer->lost.load() || !PeerAlive(*peer)) {
      peer->lost.store(true);
      return Status(ErrorCode::kNotConnected,
                    "engine \"" + remote + "\" (pid " + std::to_string(peer->pid) + ") has exited");
    }
  }
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
        st = CopyOnce(*peer, op, descs, deadline, &retry);
      else
        retry = true;
      if (slot.busy.fetch_sub(1) == 1 && peer->control->draining.load() != 0) FutexWakeAll(&slot.busy);
    }
    if (!retry) return st;
    // A range still missing after two refreshes is not registered; a
    // generation that keeps moving (the peer registering and deregistering)
    // is retried until the deadline, never reported as done.
    if (!st.ok() && attempt >= 2) return st;
    if (Clock::now() > deadline)
      return Status(ErrorCode::kTimeout, "engine \"" + remote +
                                             "\" kept changing its registered memory until the "
                                             "transfer's timeout; nothing was copied");
    MB_RETURN_IF_ERROR(Refresh(*peer));
  }
}

// Resolves every descriptor in the peer's regions (retry: one is missing,
// and a refresh may find it), then copies.
Status SameHostTransport::CopyOnce(Peer& peer, TransferOp op, const std::vector<TransferOpDesc>& descs,
                                   Clock::time_point deadline, bool* retry) {
  std::vector<CopySegment> segs;
  std::vector<DeviceSegment> device_segs;
  std::vector<iovec> local_iov, remote_iov;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferOpDesc& d = descs[i];
    auto it = ipc::Containing(peer.regions, d.remote_addr, d.len, [](const ipc::EngineRegion& r) { return r.length; });
    const ipc::EngineRegion* r = it == peer.regions.end() ? nullptr : &it->second;
    if (r == nullptr) {
      *retry = true;  // maybe registered since our last refresh
      return Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                  ": remote range is not inside memory engine \"" + peer.name +
                                                  "\" registered");
    }
    if (op == WRITE && r->read_only)
      return Status(ErrorCode::kParamInvalid,
                    "descriptor " + std::to_string(i) + ": remote range is read-only for its owner");
    char* local = reinterpret_cast<char*>(d.local_addr);
    const int local_device = LocalDevice(d.local_addr, d.len);
    if (r->allocation == 0 && local_device >= 0)
      return Status(ErrorCode::kParamInvalid,
                    "descriptor " + std::to_string(i) +
                        ": device memory moves only to and from broker memory, and engine \"" + peer.name +
                        "\" registered this range as its own (HostRegister)");
    if (r->allocation == 0) {
      local_iov.push_back({local, d.len});
      remote_iov.push_back({reinterpret_cast<void*>(d.remote_addr), d.len});
      continue;
    }
    auto m = peer.maps.find(r->allocation);
    if (m == peer.maps.end())
      return Status(ErrorCode::kParamInvalid,
                    "descriptor " + std::to_string(i) + ": the remote memory could not be mapped here");
    char* there = static_cast<char*>(m->second.base) + r->offset + (d.remote_addr - r->address);
    const int remote_device = m->second.device;
    if (local_device < 0 && remote_device < 0) {
      segs.push_back(op == READ ? CopySegment{local, there, d.len} : CopySegment{there, local, d.len});
      continue;
    }
    // The copy runs on the device of the device side (the remote's when both are).
    const int device = remote_device >= 0 ? remote_device : local_device;
    const auto l = reinterpret_cast<uintptr_t>(local), t = reinterpret_cast<uintptr_t>(there);
    device_segs.push_back(op == READ ? DeviceSegment{l, local_device >= 0, t, remote_device >= 0, d.len, device}
                                     : DeviceSegment{t, remote_device >= 0, l, local_device >= 0, d.len, device});
  }
  MB_RETURN_IF_ERROR(CopyAll(copy_pool_, segs, deadline));
  // Device copies on this thread, one call each (the driver's copy engines
  // split them), the deadline looked at between them.
  for (const DeviceSegment& s : device_segs) {
    if (Clock::now() > deadline) return Status(ErrorCode::kTimeout, "transfer exceeded its timeout");
    MB_RETURN_IF_ERROR(device::Copy(s.dst, s.dst_device, s.src, s.src_device, s.len, s.device));
  }
  if (!local_iov.empty()) MB_RETURN_IF_ERROR(CrossMemory(peer, op, local_iov, remote_iov, deadline));
  return Status::Ok();
}

}  // namespace membroker::detail
