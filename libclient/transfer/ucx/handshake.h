// How two transfer engines on different hosts admit each other, on a TCP
// connection of our own before any UCX byte: the listener's UCX worker is
// never reachable by anyone who has not proved the shared secret (or come
// from an address in allow_from). UCX's own sockaddr listener, whose
// connection manager aborted the process on 17 bytes of garbage, is not used.
//
//   listener  -> connector   Challenge {version, nonce_l}
//   connector -> listener    Proof     {version, nonce_c, token_c, engine_c, worker_c, mac_c}
//   listener  -> connector   Accept    {token_l, engine_l, worker_l, by_address, mac_l}
//                         or Refuse    {code, reason}
//
// mac_c = HMAC-SHA-256(secret, "membroker connector" nonce_l nonce_c token_c engine_c worker_c)
// mac_l = HMAC-SHA-256(secret, "membroker listener" nonce_c nonce_l token_c token_l engine_l worker_l by_address)
// (each field length-prefixed). The secret never crosses the wire; a proof
// answers one challenge only, so a recorded one replayed fails, and the
// connector checks the listener holds the secret too. Then each side opens a
// UCX endpoint to the other's worker address, and every active message
// carries the receiver's token (token_l to the listener, token_c to the
// connector): a message with a token its receiver did not hand out is dropped.
//
// Frames: a 4-byte little-endian length, then a type byte and the fields.
// Decoding trusts nothing: every length is checked against what is left and
// against the limits below; what does not parse is PROTOCOL_ERROR.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "membroker/status.h"

namespace membroker::detail::handshake {

// 4: regions carry their names in the engine wire (3: the handshake moved out
// of UCX onto a socket of our own; 2: Hello in UCX).
inline constexpr uint32_t kVersion = 4;
inline constexpr size_t kMaxFrameBytes = 16 << 10;
inline constexpr size_t kMaxEngineBytes = 256;
inline constexpr size_t kMaxWorkerAddressBytes = 12 << 10;
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kLengthBytes = 4;

using Nonce = std::array<uint8_t, 32>;
using Token = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

struct Challenge {
  uint32_t version = kVersion;
  Nonce nonce{};
};
struct Proof {
  uint32_t version = kVersion;
  Nonce nonce{};
  Token token{};
  std::string engine;
  std::string worker_address;
  bool has_secret = false;  // false: mac is zero (the connector has none)
  Mac mac{};
};
struct Accept {
  Token token{};
  std::string engine;
  std::string worker_address;
  bool by_address = false;  // admitted by allow_from, not by the secret
  Mac mac{};
};
struct Refuse {
  int32_t code = 0;  // an ErrorCode
  std::string reason;
};
using Frame = std::variant<Challenge, Proof, Accept, Refuse>;

// The frame with its length prefix.
std::string Encode(const Frame& f);
// The bytes after the length prefix.
Result<Frame> Decode(std::span<const uint8_t> body);
// The length a prefix announces; PROTOCOL_ERROR past kMaxFrameBytes or empty.
Result<size_t> FrameLength(std::span<const uint8_t, kLengthBytes> prefix);

Mac ConnectorMac(std::string_view secret, const Nonce& listener_nonce, const Proof& p);
Mac ListenerMac(std::string_view secret, const Nonce& connector_nonce, const Nonce& listener_nonce,
                const Token& connector_token, const Accept& a);
// Constant time in the bytes: a wrong guess tells nothing of the right one.
bool SameMac(const Mac& a, const Mac& b);

// Collects one frame from a stream of reads.
class FrameReader {
 public:
  // How many more bytes the frame needs (0: it is whole); PROTOCOL_ERROR as
  // soon as its length prefix is out of bounds.
  Result<size_t> Wanted() const;
  void Append(const uint8_t* bytes, size_t n) { bytes_.append(reinterpret_cast<const char*>(bytes), n); }
  // The frame after its prefix, once Wanted() is 0.
  std::span<const uint8_t> body() const {
    return {reinterpret_cast<const uint8_t*>(bytes_.data()) + kLengthBytes, bytes_.size() - kLengthBytes};
  }

 private:
  std::string bytes_;
};

// Fresh random bytes (libsodium's generator: the kernel's getrandom).
void Random(uint8_t* out, size_t n);
template <size_t N>
std::array<uint8_t, N> Random() {
  std::array<uint8_t, N> a{};
  Random(a.data(), N);
  return a;
}

}  // namespace membroker::detail::handshake
