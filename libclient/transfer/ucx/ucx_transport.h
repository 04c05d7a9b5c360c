// The transfer engine's path to engines on other hosts over UCX (the
// NetTransport of transfer/net_transport.h, in libmembroker-ucx.so): one UCX
// context and worker per engine, driven by one progress thread that owns every UCX
// object (the worker is single-threaded; callers hand it commands and wait
// for the answer, each until their own deadline).
//
// An engine with a listen address admits engines of other hosts on a TCP
// socket of its own (transfer/ucx/door.h; the handshake in handshake.h): a
// challenge answered with an HMAC of the shared secret, then the two UCX
// worker addresses are exchanged and each side opens an endpoint to the
// other; every active message carries its receiver's token, and one with a
// token its receiver never handed out is dropped. After the handshake the
// acceptor sends Welcome over UCX (its name, identity and every registered
// range). Transfers are driven by the connector, in
// pieces: each a data message (wire::DataHeader) that the acceptor checks
// against the ranges registered for that connection before it writes the
// bytes or sends them back, and answers; a WRITE completes when every piece
// is acknowledged. (Not UCX's RMA: over TCP it writes wherever a peer says,
// unchecked.) Ranges registered later reach connectors as RegionAdded; a range
// deregistered is announced as RegionGone, and the owner unmaps it only once
// every connector has answered that it no longer uses it (or has gone).
//
// Timeouts: a transfer still running at its deadline closes the connection
// (UCX cancels what is outstanding; a READ lands no byte after the call
// returns, a WRITE's pieces already sent may still land at the remote);
// the caller then sees TIMEOUT, and Disconnect + Connect start over, as the
// HIXL seed prescribes. A peer that dies or whose link fails is noticed by UCX
// (error handling mode PEER, keepalive) and its connection answers
// NOT_CONNECTED.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "membroker/status.h"
#include "membroker/transfer_engine.h"
#include "transfer/net_transport.h"

namespace membroker::detail {

class UcxTransport final : public NetTransport {
 public:
  static Result<std::unique_ptr<UcxTransport>> Start(NetOptions options);
  ~UcxTransport() override;  // closes every connection and unmaps every range
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // The address actually bound ("" without a listener), its port chosen
  // by the kernel where the option said 0.
  std::string listen_address() const override;

  // Makes the range reachable by connectors' pieces and announces it to
  // those connected.
  Status AddRegion(const RegionDesc& region) override;
  // Announces it gone and forgets it once no connector uses it (and no answer
  // is still sent from it); TIMEOUT at deadline (still served: a later call
  // waits again).
  Status RemoveRegion(uint64_t handle, Clock::time_point deadline) override;

  // Connects and shakes hands; the connection's id.
  Result<uint64_t> Connect(const std::string& address, Clock::time_point deadline, PeerInfo* info) override;
  // Waits for the connection's transfers (until deadline), then closes it.
  Status Close(uint64_t conn, Clock::time_point deadline) override;
  // Broken: its peer died, its link failed, or a transfer timed out.
  bool Lost(uint64_t conn) override;
  // Checks every descriptor against the remote's ranges first
  // (PARAM_INVALID naming the index), then moves the bytes.
  Status Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                  Clock::time_point deadline) override;
  Status SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                    Clock::time_point deadline) override;
  Status TakeNotifies(std::vector<ReceivedNotify>* out) override;
  Status RemoteRegions(uint64_t conn, Clock::time_point deadline, std::vector<RegionInfo>* out) override;
  NetStats stats() override;
  // Bumped whenever a connection opens, closes or is refused (cheap to poll).
  uint64_t changes() const override;

  class Worker;  // the progress thread and everything it owns (ucx_transport.cc)

 private:
  explicit UcxTransport(std::unique_ptr<Worker> worker);
  std::unique_ptr<Worker> worker_;
};

}  // namespace membroker::detail
