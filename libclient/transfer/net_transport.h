// The transfer engine's path to engines on other hosts, as the engine sees
// it: one interface, and a loader. The implementation (UCX: transfer/ucx/)
// lives in a module of its own, libmembroker-ucx.so beside libmembroker.so,
// loaded with dlopen the first time an engine asks for the network (a
// listen_address, or Connect("ip:port")): a process that never talks to
// another host never maps UCX, whose signal handlers would replace the
// program's own (Python's faulthandler among them). Where the module is not
// built or not installed, starting it answers UNSUPPORTED with the reason.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "membroker/status.h"
#include "membroker/transfer_engine.h"
#include "transfer/net_address.h"

namespace membroker::detail {

inline constexpr size_t kMaxNetSecretBytes = 4096;

struct NetOptions {
  std::string engine_name;
  std::array<uint8_t, 16> identity{};
  std::string listen;  // "ip:port"; empty: accepts no connections
  std::string secret;  // empty: none (then only allow_from admits anyone)
  std::vector<AddressPrefix> allow_from;
  std::chrono::milliseconds handshake_timeout{5000};
};

struct NetPeerInfo {
  std::string engine;  // the name the acceptor registered
  std::array<uint8_t, 16> identity{};
  std::string address;     // "ip:port" connected to
  std::string transports;  // what the transport chose, e.g. "tcp/veth-b"
};

struct NetStats {
  uint64_t accepted = 0;     // connections that passed the handshake
  uint64_t refused = 0;      // connections refused (wrong secret, address not allowed, no hello)
  uint64_t connections = 0;  // open now, both directions
  std::string last_refusal;
};

struct NetNotify {
  std::string from;  // the sender's engine name, as it said in Hello
  std::string name;
  std::string message;
};

class NetTransport {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~NetTransport() = default;  // closes every connection and unmaps every range

  // The address actually bound ("" without a listener), its port chosen by
  // the kernel where the option said 0.
  virtual std::string listen_address() const = 0;
  // Makes [address, address+length) reachable by connectors and announces it
  // to those connected.
  virtual Status AddRegion(uint64_t handle, uintptr_t address, size_t length, bool read_only) = 0;
  // Announces it gone and forgets it once no connector uses it; TIMEOUT at
  // deadline (still served: a later call waits again).
  virtual Status RemoveRegion(uint64_t handle, Clock::time_point deadline) = 0;
  // Connects and shakes hands; the connection's id.
  virtual Result<uint64_t> Connect(const std::string& address, Clock::time_point deadline, NetPeerInfo* info) = 0;
  // Waits for the connection's transfers (until deadline), then closes it.
  virtual Status Close(uint64_t conn, Clock::time_point deadline) = 0;
  // Checks every descriptor against the remote's ranges first (PARAM_INVALID
  // naming the index), then moves the bytes.
  virtual Status Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                          Clock::time_point deadline) = 0;
  virtual Status SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                            Clock::time_point deadline) = 0;
  virtual std::vector<NetNotify> TakeNotifies() = 0;
  virtual NetStats stats() = 0;
  // Bumped whenever a connection opens, closes or is refused (cheap to poll).
  virtual uint64_t changes() const = 0;
};

// Loads the network module (once per process) and starts a transport.
Result<std::unique_ptr<NetTransport>> StartNetTransport(NetOptions options);

// What the module exports, under kNetTransportEntry: the same compiler and
// build made both sides, so C++ types cross.
using StartNetTransportFn = void (*)(NetOptions options, Result<std::unique_ptr<NetTransport>>* out);
inline constexpr const char kNetTransportEntry[] = "membroker_net_transport_start_v1";
inline constexpr const char kNetTransportModule[] = "libmembroker-ucx.so";

}  // namespace membroker::detail
