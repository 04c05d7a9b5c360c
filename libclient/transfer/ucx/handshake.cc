#include "transfer/ucx/handshake.h"

#include <sodium.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "membroker/ipc/escape.h"
#include "transfer/ucx/byte_codec.h"

namespace membroker::detail::handshake {

namespace {

enum class Type : uint8_t { kChallenge = 1, kProof = 2, kAccept = 3, kRefuse = 4 };

using Writer = wire::ByteWriter;
using Reader = wire::ByteReader;

bool ValidEngine(const std::string& s) { return !s.empty() && s.size() <= kMaxEngineBytes && ipc::IsValidUtf8(s); }

// HMAC-SHA-256 over a label and length-prefixed fields.
class MacOf {
 public:
  MacOf(std::string_view secret, std::string_view label) {
    crypto_auth_hmacsha256_init(&state_, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
    Add(label);
  }
  void Add(std::string_view bytes) {
    uint8_t n[4];
    for (int i = 0; i < 4; ++i) n[i] = static_cast<uint8_t>(bytes.size() >> (8 * i));
    crypto_auth_hmacsha256_update(&state_, n, sizeof(n));
    crypto_auth_hmacsha256_update(&state_, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  }
  template <size_t N>
  void Add(const std::array<uint8_t, N>& a) {
    Add(std::string_view(reinterpret_cast<const char*>(a.data()), N));
  }
  Mac Final() {
    Mac m{};
    crypto_auth_hmacsha256_final(&state_, m.data());
    return m;
  }

 private:
  crypto_auth_hmacsha256_state state_;
};

}  // namespace

std::string Encode(const Frame& f) {
  Writer w;
  w.U8(static_cast<uint8_t>(f.index() + 1));
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Challenge>) {
          w.U32(v.version);
          w.Fixed(v.nonce);
        } else if constexpr (std::is_same_v<T, Proof>) {
          w.U32(v.version);
          w.Fixed(v.nonce);
          w.Fixed(v.token);
          w.Bytes(v.engine);
          w.Bytes(v.worker_address);
          w.U8(v.has_secret ? 1 : 0);
          w.Fixed(v.mac);
        } else if constexpr (std::is_same_v<T, Accept>) {
          w.Fixed(v.token);
          w.Bytes(v.engine);
          w.Bytes(v.worker_address);
          w.U8(v.by_address ? 1 : 0);
          w.Fixed(v.mac);
        } else if constexpr (std::is_same_v<T, Refuse>) {
          w.U32(static_cast<uint32_t>(v.code));
          w.Bytes(v.reason);
        }
      },
      f);
  std::string body = w.take();
  Writer prefix;
  prefix.U32(static_cast<uint32_t>(body.size()));
  return prefix.take() + body;
}

Result<size_t> FrameLength(std::span<const uint8_t, kLengthBytes> prefix) {
  uint32_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<uint32_t>(prefix[i]) << (8 * i);
  if (n == 0 || n > kMaxFrameBytes)
    return Status(ErrorCode::kProtocolError, "a handshake frame of " + std::to_string(n) + " bytes (at most " +
                                                 std::to_string(kMaxFrameBytes) + ")");
  return static_cast<size_t>(n);
}

Result<size_t> FrameReader::Wanted() const {
  if (bytes_.size() < kLengthBytes) return kLengthBytes - bytes_.size();
  MB_ASSIGN_OR_RETURN(size_t length, FrameLength(std::span<const uint8_t, kLengthBytes>(
                                         reinterpret_cast<const uint8_t*>(bytes_.data()), kLengthBytes)));
  return kLengthBytes + length - bytes_.size();
}

Result<Frame> Decode(std::span<const uint8_t> body) {
  Reader r(body);
  uint8_t type = 0;
  auto bad = [](const char* what) { return Status(ErrorCode::kProtocolError, std::string("a malformed ") + what); };
  if (body.size() > kMaxFrameBytes || !r.U8(&type)) return bad("handshake frame");
  switch (static_cast<Type>(type)) {
    case Type::kChallenge: {
      Challenge c;
      if (!r.U32(&c.version) || !r.Fixed(&c.nonce) || !r.done()) return bad("challenge");
      return Frame(c);
    }
    case Type::kProof: {
      Proof p;
      if (!r.U32(&p.version) || !r.Fixed(&p.nonce) || !r.Fixed(&p.token) || !r.Bytes(&p.engine, kMaxEngineBytes) ||
          !r.Bytes(&p.worker_address, kMaxWorkerAddressBytes) || !r.Flag(&p.has_secret) || !r.Fixed(&p.mac) ||
          !r.done() || !ValidEngine(p.engine) || p.worker_address.empty())
        return bad("proof");
      return Frame(std::move(p));
    }
    case Type::kAccept: {
      Accept a;
      if (!r.Fixed(&a.token) || !r.Bytes(&a.engine, kMaxEngineBytes) ||
          !r.Bytes(&a.worker_address, kMaxWorkerAddressBytes) || !r.Flag(&a.by_address) || !r.Fixed(&a.mac) ||
          !r.done() || !ValidEngine(a.engine) || a.worker_address.empty())
        return bad("acceptance");
      return Frame(std::move(a));
    }
    case Type::kRefuse: {
      Refuse f;
      uint32_t code = 0;
      if (!r.U32(&code) || !r.Bytes(&f.reason, kMaxReasonBytes) || !r.done()) return bad("refusal");
      f.code = static_cast<int32_t>(code);
      return Frame(std::move(f));
    }
  }
  return Status(ErrorCode::kProtocolError, "a handshake frame of unknown type " + std::to_string(type));
}

Mac ConnectorMac(std::string_view secret, const Nonce& listener_nonce, const Proof& p) {
  MacOf m(secret, "membroker connector");
  m.Add(listener_nonce);
  m.Add(p.nonce);
  m.Add(p.token);
  m.Add(p.engine);
  m.Add(p.worker_address);
  return m.Final();
}

Mac ListenerMac(std::string_view secret, const Nonce& connector_nonce, const Nonce& listener_nonce,
                const Token& connector_token, const Accept& a) {
  MacOf m(secret, "membroker listener");
  m.Add(connector_nonce);
  m.Add(listener_nonce);
  m.Add(connector_token);
  m.Add(a.token);
  m.Add(a.engine);
  m.Add(a.worker_address);
  m.Add(a.by_address ? std::string_view("1") : std::string_view("0"));
  return m.Final();
}

bool SameMac(const Mac& a, const Mac& b) { return sodium_memcmp(a.data(), b.data(), a.size()) == 0; }

void Random(uint8_t* out, size_t n) {
  static const bool ready = sodium_init() >= 0;  // thread-safe, idempotent; seeds the generator
  if (!ready) std::abort();                      // no source of randomness: nothing here is safe
  randombytes_buf(out, n);
}

}  // namespace membroker::detail::handshake
