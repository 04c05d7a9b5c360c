// The seam between the transfer engine and the ways it reaches peer engines
// (as nixl's backend_engine.h is for its backends). Two implement it:
//  - same_host/ : an engine at this host's broker; its memory is mapped here
//    (or reached by cross-memory attach) and copied with memcpy;
//  - ucx/       : an engine of another host, by ip:port, in the network
//    module libmembroker-ucx.so (net_transport.h loads it).
// The engine (transfer_engine.cc) owns what is the same for both: the names
// and addresses of its connections, its registered ranges and their checks,
// asynchronous requests. A transport owns its connections' state and the
// bytes' way; one conformance suite (tests/integration/
// transport_conformance_test.cc) holds both to the same answers.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "membroker/status.h"
#include "membroker/transfer_engine.h"

namespace membroker::detail {

// A range this engine registered (RegisterMem), as a transport is told of it.
struct RegionDesc {
  uint64_t handle = 0;  // the engine's MemHandle
  uintptr_t address = 0;
  size_t length = 0;
  bool read_only = false;   // for its owner: peers may only READ it
  uint64_t allocation = 0;  // the broker allocation behind it; 0: this process's own memory (HostRegister)
  uint64_t offset = 0;      // into that allocation
  std::string name;         // "" when unnamed: how peers find it (RegionInfo)
  int device = -1;          // MEM_DEVICE: the CUDA device of the memory; -1: host memory
};

// Who answered a Connect.
struct PeerInfo {
  std::string engine;                  // the name it registered
  std::array<uint8_t, 16> identity{};  // drawn at its Initialize: tells one engine from a namesake
  std::string address;                 // "ip:port" connected to; "" on this host
  std::string transports;              // what carries the bytes: "memcpy", or what UCX chose ("tcp/eth0")
};

struct ReceivedNotify {
  std::string from;  // the sender's engine name
  std::string name;
  std::string message;
};

class Transport {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Transport() = default;  // closes every connection; peers lose the ranges

  // "same-host" or "ucx" (ConnectionInfo::path).
  virtual const char* path() const = 0;
  // Makes the range reachable by peers and tells those connected.
  virtual Status AddRegion(const RegionDesc& region) = 0;
  // Takes the range from peers and returns once none can touch it any more;
  // TIMEOUT at deadline (a later call waits again).
  virtual Status RemoveRegion(uint64_t handle, Clock::time_point deadline) = 0;
  // Connects to remote (an engine name on this host, "ip:port" over the
  // network), waiting for it until deadline; the connection's id.
  virtual Result<uint64_t> Connect(const std::string& remote, Clock::time_point deadline, PeerInfo* info) = 0;
  // Waits for the connection's transfers (until deadline: TIMEOUT, and it
  // stays open), then closes it.
  virtual Status Close(uint64_t conn, Clock::time_point deadline) = 0;
  // Whether the peer is known to be gone, so that Connect may start over
  // without a Disconnect first.
  virtual bool Lost(uint64_t conn) = 0;
  // The engine has checked the local side of every descriptor. Checks each
  // remote side first (PARAM_INVALID naming the index; nothing moves), then
  // moves the bytes.
  virtual Status Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                          Clock::time_point deadline) = 0;
  virtual Status SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                            Clock::time_point deadline) = 0;
  // Appends the notifies sent to this engine, oldest first.
  virtual Status TakeNotifies(std::vector<ReceivedNotify>* out) = 0;
  // The ranges the remote of conn has registered now.
  virtual Status RemoteRegions(uint64_t conn, Clock::time_point deadline, std::vector<RegionInfo>* out) = 0;
};

}  // namespace membroker::detail
