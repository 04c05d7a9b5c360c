// The transfer engine's path to engines on other hosts, as the engine sees
// it: a Transport (transport.h) with a listener, and a loader. The implementation (UCX: transfer/ucx/)
// lives in a module of its own, membroker/libmembroker-ucx.so beside libmembroker.so,
// loaded with dlopen the first time an engine asks for the network (a
// listen_address, or Connect("ip:port")): a process that never talks to
// another host never maps UCX, whose signal handlers would replace the
// program's own (Python's faulthandler among them). Where the module is not
// built or not installed, starting it answers UNSUPPORTED with the reason.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "membroker/status.h"
#include "membroker/transfer_engine.h"
#include "transfer/net_address.h"
#include "transfer/transport.h"

namespace membroker::detail {

inline constexpr size_t kMaxNetSecretBytes = 4096;

struct NetOptions {
  std::string engine_name;
  std::array<uint8_t, 16> identity{};
  std::string listen;  // "ip:port"; empty: accepts no connections
  std::string secret;  // empty: none (then only allow_from admits anyone)
  std::vector<AddressPrefix> allow_from;
  std::chrono::milliseconds handshake_timeout{5000};
  // Called on the transport's thread when a notify is queued (Client::WakeFd's byte).
  std::function<void()> on_notify;
  // The driver's copy for ranges of CUDA device memory (RegionDesc::device),
  // which peers reach through the transport's messages: the module does not
  // load the driver itself. Signature of detail::device::Copy.
  std::function<Status(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t size, int device)>
      device_copy;
};

struct NetStats {
  uint64_t accepted = 0;     // connections that passed the handshake
  uint64_t refused = 0;      // connections refused (wrong secret, address not allowed, no hello)
  uint64_t connections = 0;  // open now, both directions
  std::string last_refusal;
};

// A Transport (transport.h) whose remotes are "ip:port", with a listener of
// its own.
class NetTransport : public Transport {
 public:
  const char* path() const override { return "ucx"; }
  // The address actually bound ("" without a listener), its port chosen by
  // the kernel where the option said 0.
  virtual std::string listen_address() const = 0;
  virtual NetStats stats() = 0;
  // Bumped whenever a connection opens, closes or is refused (cheap to poll).
  virtual uint64_t changes() const = 0;
};

// The engine options listen_address, secret_file and allow_from, checked, the
// secret read from its file (which only its owner may read or write). With
// none of them, engine_name stays empty: the network is started later only if
// a Connect("ip:port") asks for it.
Result<NetOptions> ParseNetOptions(const std::string& engine_name, const std::array<uint8_t, 16>& identity,
                                   const std::map<std::string, std::string>& options);

// Loads the network module (once per process) and starts a transport.
Result<std::unique_ptr<NetTransport>> StartNetTransport(NetOptions options);

// What the module exports, under kNetTransportEntry: the same compiler and
// build made both sides, so C++ types cross.
using StartNetTransportFn = void (*)(NetOptions options, Result<std::unique_ptr<NetTransport>>* out);
inline constexpr const char kNetTransportEntry[] = "membroker_net_transport_start_v1";
inline constexpr const char kNetTransportModule[] = "membroker/libmembroker-ucx.so";

}  // namespace membroker::detail
