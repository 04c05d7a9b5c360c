// The transfer engine's path to engines at this host's broker (a Transport:
// transfer/transport.h). The broker is only where engines find each other;
// payload never passes through it:
//  - a peer's broker-backed memory is imported and mapped here once (cached
//    until the peer deregisters it or goes away) and copied with memcpy,
//    split over several threads for large batches;
//  - device memory (MEM_DEVICE, on either side) is imported with the CUDA
//    driver and mapped into a device reservation here, and copied with the
//    driver's copies (client/device_vmm.h);
//  - a peer's own registered (HostRegister'ed) memory is reached with
//    process_vm_readv / process_vm_writev, under the kernel's ptrace rules.
//
// Keeping a peer from touching memory after it is deregistered: every engine
// owns a 4 KiB control block (a broker allocation its peers map) with a
// generation counter and one "busy" counter per connected peer. A peer bumps
// its busy counter, then reads the generation; if the generation is the one
// its cached region list came from, it copies and drops the counter.
// RemoveRegion tells the broker first, then bumps the generation, then waits
// until the counter of every peer the broker says is connected is zero. Both
// sides use sequentially consistent atomics, so either the peer sees the new
// generation (and refreshes its regions from the broker) or RemoveRegion sees
// it busy. The block's layout is membroker/ipc/engine_control.h; who the
// peers are (slot, pid) comes from the broker, never from the block, and the
// wait is bounded (the engine's "drain_timeout_ms").
//
// After the broker restarts, the client's reattach registers the engine and
// its ranges again (client/reattach.cc); each connection is made again by its
// next use (a transfer or a notify), which waits for the peer's engine to be
// back until that call's deadline.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "client/client_core.h"
#include "membroker/client.h"
#include "transfer/thread_pool.h"
#include "transfer/transport.h"

namespace membroker::ipc {
struct EngineControlBlock;
struct EngineInfoReply;
}  // namespace membroker::ipc

namespace membroker::detail {

// A peer's memory as mapped here: host memory by mmap, device memory into a
// device reservation (device >= 0).
struct ImportedMemory {
  void* base = nullptr;
  size_t size = 0;
  int device = -1;
};

class SameHostTransport final : public Transport {
 public:
  struct Options {
    size_t copy_threads = 4;  // the calling thread among them
    std::chrono::milliseconds drain_timeout{10'000};
  };
  // Registers engine `name` at the broker, with a control block of its own
  // that carries identity.
  static Result<std::unique_ptr<SameHostTransport>> Start(const Client& client, std::shared_ptr<ClientCore> core,
                                                          const std::string& name,
                                                          const std::array<uint8_t, 16>& identity, Options options);
  // Gives the name back at the broker, then waits (drain_timeout at most) for
  // peers still inside this engine's memory.
  ~SameHostTransport() override;
  SameHostTransport(const SameHostTransport&) = delete;
  SameHostTransport& operator=(const SameHostTransport&) = delete;

  const char* path() const override { return "same-host"; }
  // What Start wrote into the control block.
  std::array<uint8_t, 16> identity() const;
  Status AddRegion(const RegionDesc& region) override;
  Status RemoveRegion(uint64_t handle, Clock::time_point deadline) override;
  // remote: an engine name; the broker answers once an engine of that name
  // whose process it knows is alive is there, or TIMEOUT at deadline.
  Result<uint64_t> Connect(const std::string& remote, Clock::time_point deadline, PeerInfo* info) override;
  Status Close(uint64_t conn, Clock::time_point deadline) override;
  bool Lost(uint64_t conn) override;
  Status Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                  Clock::time_point deadline) override;
  Status SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                    Clock::time_point deadline) override;
  // The peer's ranges as the broker lists them now (a refresh).
  Status RemoteRegions(uint64_t conn, Clock::time_point deadline, std::vector<RegionInfo>* out) override;
  // The notifies the broker queued for this engine.
  Status TakeNotifies(std::vector<ReceivedNotify>* out) override;

  struct Peer;  // one connection (same_host_transport.cc)

 private:
  SameHostTransport(const Client& client, std::shared_ptr<ClientCore> core, Options options);
  std::shared_ptr<Peer> Find(uint64_t conn);
  // The broker's answer to EngineConnectRequest, taken into peer (peer.mu
  // exclusive, or peer not shared yet): its pid, slot and control block.
  Status Adopt(Peer& peer, const ipc::EngineInfoReply& info);
  // Whether the broker that made this connection is gone (a reattach since).
  bool Stale(Peer& peer);
  // Connects to the peer's engine again at the new broker, waiting for it
  // until deadline; the old mappings go (the new broker never gave them).
  Status Reconnect(Peer& peer, Clock::time_point deadline);
  // Re-reads the peer's regions from the broker and maps new broker-backed ones.
  Status Refresh(Peer& peer);
  // Unmaps everything mapped for the peer (peer.mu exclusive); tell_broker
  // false: only unmaps (the broker that gave them is gone).
  void DropPeerMappings(Peer& peer, bool tell_broker = true);
  Status CopyOnce(Peer& peer, TransferOp op, const std::vector<TransferOpDesc>& descs, Clock::time_point deadline,
                  bool* retry);
  Result<ImportedMemory> MapImported(const std::string& remote, uint64_t allocation);
  // Unmaps it; tell_broker: and gives the broker's holding back.
  void ReleaseImported(const ImportedMemory& m, uint64_t allocation, bool tell_broker = true);
  // The device of the local range [address, address+length) when it lies in
  // device memory this engine registered, else -1.
  int LocalDevice(uintptr_t address, size_t length);

  Client client_;
  std::shared_ptr<ClientCore> core_;
  Options options_;
  PhysicalHandle control_handle_;
  Reservation control_range_;
  Mapping control_map_;
  ipc::EngineControlBlock* control_ = nullptr;  // ours, mapped read-write
  ThreadPool copy_pool_;

  std::mutex regions_mu_;
  std::map<uint64_t, uintptr_t> regions_;  // MemHandle -> address (ClientCore knows the rest)
  struct DeviceRange {
    size_t length = 0;
    int device = -1;
  };
  std::map<uintptr_t, DeviceRange> device_ranges_;  // by address: this engine's MEM_DEVICE ranges

  std::mutex conns_mu_;
  uint64_t next_conn_ = 1;
  std::map<uint64_t, std::shared_ptr<Peer>> conns_;
};

}  // namespace membroker::detail
