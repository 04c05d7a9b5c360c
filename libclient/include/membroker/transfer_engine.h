// membroker's transfer engine, in the shape of HIXL (Initialize, RegisterMem,
// Connect, TransferSync READ/WRITE, TransferAsync, SendNotify): move bytes
// between registered memory of processes on one host, and of engines on other
// hosts by "ip:port" (over UCX, loaded only then: docs/TRANSFER.md). On one
// host the broker is only where engines find each other; payload never passes
// through it:
//  - a peer's broker-backed memory is imported and mapped here once (cached
//    until the peer deregisters it or goes away) and copied with memcpy,
//    split over several threads for large batches;
//  - a peer's own registered (HostRegister'ed) memory is reached with
//    process_vm_readv / process_vm_writev, under the kernel's ptrace rules;
//  - device memory (MEM_DEVICE) is mapped with the CUDA driver and copied with
//    its copies; between hosts it goes through host staging buffers on each
//    side whose memory is on a device (docs/MEMORY.md, "Device memory").
// Unlike HIXL, memory registered after Connect becomes visible to connected
// peers too (their next transfer that needs it refreshes the region list).
//
// No function throws. Errors: PARAM_INVALID (bad or unregistered range),
// NOT_CONNECTED (no connection, or the peer finalized or died), ALREADY_CONNECTED,
// TIMEOUT, UNSUPPORTED (no CUDA driver for MEM_DEVICE), RESOURCE_EXHAUSTED (notify queue full).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "membroker/client.h"
#include "membroker/status.h"

namespace membroker {

enum MemType : uint8_t { MEM_HOST = 0, MEM_DEVICE = 1 };
enum TransferOp : uint8_t { READ = 0, WRITE = 1 };
enum class TransferStatus : uint8_t { WAITING, COMPLETED, TIMEOUT, FAILED };

struct MemDesc {
  uintptr_t addr = 0;
  size_t len = 0;
};
// How a connection reaches its peer (GetConnectionInfo): never guessed, and a
// peer on this host is never reached over the network.
struct ConnectionInfo {
  std::string engine;      // the peer engine's name
  std::string path;        // "same-host" (its broker memory mapped here), "ucx", or "ucx+staged" (the
                           // engine has device memory registered, which crosses through staging)
  std::string transports;  // "ucx": what UCX chose ("tcp/eth0", "rc_mlx5/mlx5_0:1"); same-host: "memcpy"
  std::string address;     // "ucx": the peer's ip:port; same-host: ""
};
// The engine's network side (GetNetworkStats).
struct NetworkStats {
  std::string listen_address;  // as bound; "" when the engine does not listen
  uint64_t accepted = 0;       // connections from other hosts admitted
  uint64_t refused = 0;        // refused: wrong or no secret and address not allowed, or no handshake
  uint64_t connections = 0;    // open now, both directions
  std::string last_refusal;    // why the last one was refused
};
// Addresses are in each process's own address space, as in HIXL.
struct TransferOpDesc {
  uintptr_t local_addr = 0;
  uintptr_t remote_addr = 0;
  size_t len = 0;
};
struct NotifyDesc {
  std::string name;        // at most 128 bytes
  std::string notify_msg;  // at most 1024 bytes
};
struct Notify {
  std::string remote_engine;  // the sender
  std::string name;
  std::string notify_msg;
};

// A range a remote engine registered, as GetRemoteRegions lists it.
struct RegionInfo {
  std::string name;        // as registered ("" when unnamed)
  uintptr_t address = 0;   // in the remote's process: what a TransferOpDesc's remote_addr points into
  size_t length = 0;
  bool read_only = false;  // the remote holds it read-only: READ only
};

using MemHandle = void*;        // from RegisterMem; never dereferenced
using TransferReq = uint64_t;   // from TransferAsync

class MEMBROKER_API TransferEngine {
 public:
  // The engine talks to the broker over client's connection (shared, not
  // consumed). One engine per Client.
  explicit TransferEngine(const Client& client);
  ~TransferEngine();  // Finalize()
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Registers local_engine_name with the broker (unique per broker: a live name
  // gives ALREADY_EXISTS). Options: "copy_threads" (threads that split large
  // memcpy batches, default 4), "async_threads" (threads that run
  // TransferAsync requests, default 2), "drain_timeout_ms" (how long
  // DeregisterMem and Finalize wait for connected peers' transfers into this
  // engine's memory, default 10000); an unknown option is PARAM_INVALID.
  // Engines on other hosts (docs/TRANSFER.md): "listen_address" ("ip:port",
  // port 0 lets the kernel choose; accepts connections there, never on every
  // interface unless asked with 0.0.0.0), "secret_file" (a file of mode 0600
  // or stricter holding the shared secret, sent when connecting and required
  // from connectors) and "allow_from" (addresses and prefixes admitted
  // without the secret, "10.0.0.0/24,fd00::7"). A listener needs a secret_file
  // or allow_from: nobody is admitted by default.
  Status Initialize(const std::string& local_engine_name,
                    const std::map<std::string, std::string>& options = {});
  // Disconnects every peer, waits for transfers in flight (ours, and peers'
  // into our memory), deregisters everything and gives the name back.
  void Finalize();

  // [addr, addr+len): addr and len multiples of 4096. MEM_HOST: inside one
  // mapping of host broker memory made by this process (MapMem, MallocHost)
  // or inside one HostRegister range; MEM_DEVICE: inside one mapping of device
  // memory (MapMem into a kReserveDevice reservation). The range cannot be
  // unmapped, protected below read-write or host-unregistered until
  // DeregisterMem (BUSY).
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle);
  // The same, with a name connected peers find the range by (GetRemoteRegions):
  // 1 to 32 bytes of UTF-8, unique among this engine's ranges (ALREADY_EXISTS).
  Status RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle, const std::string& name);
  // Waits for transfers that may use the memory - this engine's and those of
  // the peers the broker says are connected - then forgets it. TIMEOUT when a
  // peer is still inside a transfer after drain_timeout_ms: the range stays
  // locked (not unmappable) and a later call waits again.
  Status DeregisterMem(MemHandle handle);

  // Waits up to timeout_ms for remote_engine to appear (TIMEOUT otherwise).
  // remote_engine "ip:port" connects to an engine listening there: over UCX
  // when it is on another host, through the broker when the engine answering
  // is one of this host's (GetConnectionInfo says which). PERMISSION_DENIED
  // when it refuses us, NOT_CONNECTED when nothing answers.
  Status Connect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // Waits up to timeout_ms for this engine's transfers to remote_engine.
  Status Disconnect(const std::string& remote_engine, int32_t timeout_ms = 1000);
  // The ranges a connected remote_engine has registered now, by address
  // (NOT_CONNECTED for one not connected): how an engine learns where a
  // peer's named memory is, without carrying addresses by hand.
  Status GetRemoteRegions(const std::string& remote_engine, std::vector<RegionInfo>& regions,
                          int32_t timeout_ms = 1000);

  // READ: remote -> local; WRITE: local -> remote. Every descriptor must fall
  // inside registered memory on both sides, else PARAM_INVALID and nothing is
  // copied. TIMEOUT when timeout_ms passes (descriptors already copied stay).
  Status TransferSync(const std::string& remote_engine, TransferOp op,
                      const std::vector<TransferOpDesc>& descs, int32_t timeout_ms = 1000);
  // Queues the transfer; req identifies it for GetTransferStatus.
  Status TransferAsync(const std::string& remote_engine, TransferOp op,
                       const std::vector<TransferOpDesc>& descs, TransferReq& req,
                       int32_t timeout_ms = 1000);
  // WAITING, or a final status - reported once, after which req is forgotten
  // (PARAM_INVALID). last_error() tells why a request FAILED.
  Status GetTransferStatus(TransferReq req, TransferStatus& status);
  // Batch polling: one status per request, in order. An unknown request is
  // PARAM_INVALID, and the statuses after it are not read.
  Status GetTransferStatus(std::span<const TransferReq> reqs, std::vector<TransferStatus>& statuses);
  // The Status of the last request that ended FAILED or TIMEOUT.
  Status last_error() const;

  // Queues a small message at remote_engine (connected): RESOURCE_EXHAUSTED
  // when its queue (256) is full. One round trip to the broker, which never
  // waits on the remote: timeout_ms is accepted for HIXL's signature only.
  Status SendNotify(const std::string& remote_engine, const NotifyDesc& notify,
                    int32_t timeout_ms = 1000);
  // Takes every notify queued for this engine, oldest first.
  Status GetNotifies(std::vector<Notify>& notifies);
  // Waits up to timeout_ms (0 to 600000) for a notify, then takes every one
  // queued (none: the time ran out). It reads the Client's wake fd
  // (Client::WakeFd), so not while an event loop reads that fd too.
  Status WaitNotifies(std::vector<Notify>& notifies, int32_t timeout_ms);

  // The path of a connection (remote_engine as given to Connect).
  Status GetConnectionInfo(const std::string& remote_engine, ConnectionInfo& info) const;
  Status GetNetworkStats(NetworkStats& stats) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace membroker
