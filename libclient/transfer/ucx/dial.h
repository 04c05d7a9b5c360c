// The connector's side of the handshake (handshake.h), on the caller's
// thread: a TCP connection to the listener, its challenge answered, its
// answer checked, all by one deadline. The UCX endpoint is made afterwards,
// to the worker address the listener sent.
#pragma once

#include <chrono>
#include <string>

#include "membroker/status.h"
#include "transfer/net_address.h"
#include "transfer/ucx/handshake.h"

namespace membroker::detail {

struct DialRequest {
  std::string secret;  // empty: none (then only the listener's allow_from may admit us)
  std::string engine;
  std::string worker_address;
  handshake::Token token{};  // what the listener puts on everything it sends us
};

struct Dialed {
  std::string engine;
  std::string worker_address;
  handshake::Token token{};  // what we put on everything we send it
};

// PERMISSION_DENIED or VERSION_MISMATCH when refused (with the listener's
// reason), PERMISSION_DENIED when the listener did not prove the secret,
// TIMEOUT at the deadline, NOT_CONNECTED when the connection failed or closed,
// PROTOCOL_ERROR for a malformed answer.
Result<Dialed> Dial(const SocketAddress& to, const std::string& text, std::chrono::steady_clock::time_point deadline,
                    const DialRequest& request);

}  // namespace membroker::detail
