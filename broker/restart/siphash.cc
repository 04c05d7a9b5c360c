#include "restart/siphash.h"

#include <cstring>

namespace membroker::broker {

namespace {
inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little endian, whatever the host
  return v;
}

struct State {
  uint64_t v0, v1, v2, v3;
  void Round() {
    v0 += v1; v1 = Rotl(v1, 13); v1 ^= v0; v0 = Rotl(v0, 32);
    v2 += v3; v3 = Rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = Rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = Rotl(v1, 17); v1 ^= v2; v2 = Rotl(v2, 32);
  }
  void Compress(uint64_t m) {
    v3 ^= m;
    Round();
    Round();
    v0 ^= m;
  }
};
}  // namespace

uint64_t SipHash24(const SipKey& key, const void* data, size_t size) {
  const uint64_t k0 = Load64(key.data()), k1 = Load64(key.data() + 8);
  State s{0x736f6d6570736575ULL ^ k0, 0x646f72616e646f6dULL ^ k1, 0x6c7967656e657261ULL ^ k0,
          0x7465646279746573ULL ^ k1};
  const auto* in = static_cast<const uint8_t*>(data);
  const size_t whole = size - size % 8;
  for (size_t i = 0; i < whole; i += 8) s.Compress(Load64(in + i));
  uint64_t last = static_cast<uint64_t>(size) << 56;
  for (size_t i = 0; i < size % 8; ++i) last |= static_cast<uint64_t>(in[whole + i]) << (8 * i);
  s.Compress(last);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace membroker::broker
