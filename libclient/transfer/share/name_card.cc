#include "name_card.h"

#include <cstring>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"

namespace membroker::share {
namespace {

constexpr uint64_t kMagic = 0x3144524143424d4dull;  // "MMBCARD1", little-endian
constexpr uint32_t kVersion = 1;

// The page's layout; fixed-width fields, little-endian (both ends are x86-64
// or aarch64 Linux; the version says when that changes).
struct Layout {
  uint64_t magic;
  uint32_t version;
  uint32_t name_len;
  uint64_t serial;
  uint64_t allocation;
  uint64_t object_address;
  uint64_t size;
  uint64_t checksum;
  char name[kCardNameMax];
};
static_assert(sizeof(Layout) <= kCardBytes);
static_assert(kCardNameMax == ipc::kMaxObjectNameBytes);

Status Bad(const std::string& what) { return Status(ErrorCode::kProtocolError, "a name card with " + what); }

uint64_t Fnv(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

Status EncodeCard(const NameCard& card, std::span<uint8_t> page) {
  if (page.size() < sizeof(Layout)) return Status(ErrorCode::kParamInvalid, "a card needs a page");
  if (card.name.empty() || card.name.size() > kCardNameMax)
    return Status(ErrorCode::kParamInvalid, "a card's name is 1 to 256 bytes");
  Layout l{};
  l.magic = kMagic;
  l.version = kVersion;
  l.name_len = static_cast<uint32_t>(card.name.size());
  l.serial = card.serial;
  l.allocation = card.allocation;
  l.object_address = card.object_address;
  l.size = card.size;
  l.checksum = card.checksum;
  std::memcpy(l.name, card.name.data(), card.name.size());
  std::memset(page.data(), 0, page.size());
  std::memcpy(page.data(), &l, sizeof(l));
  return Status::Ok();
}

Result<NameCard> DecodeCard(std::span<const uint8_t> page) {
  if (page.size() < sizeof(Layout)) return Bad("too few bytes");
  Layout l;
  std::memcpy(&l, page.data(), sizeof(l));
  if (l.magic != kMagic) return Bad("a wrong magic number");
  if (l.version != kVersion) return Bad("version " + std::to_string(l.version) + " (this build reads 1)");
  if (l.name_len == 0 || l.name_len > kCardNameMax) return Bad("a name length out of range");
  NameCard c;
  c.name.assign(l.name, l.name_len);
  if (!ipc::CheckName(c.name, kCardNameMax, "a card's name").ok()) return Bad("a name that is not a valid name");
  if (l.size == 0 || l.size > (uint64_t{1} << 48)) return Bad("a size out of range");
  if (l.object_address == 0 || l.object_address % 4096 != 0 || l.object_address + l.size < l.object_address)
    return Bad("an object address out of range");
  c.serial = l.serial;
  c.allocation = l.allocation;
  c.object_address = l.object_address;
  c.size = l.size;
  c.checksum = l.checksum;
  return c;
}

std::string CardRegionPrefix(const std::string& name) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  const uint64_t h = Fnv(name);
  for (int shift = 60; shift >= 0; shift -= 4) out.push_back(kDigits[(h >> shift) & 15]);
  out.push_back('.');
  return out;
}

std::string CardRegionName(const std::string& name, uint64_t serial) {
  return CardRegionPrefix(name) + std::to_string(serial);
}

uint64_t Checksum(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9ce484222325cbf2ull, 0x2325cbf29ce48422ull};
  size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * 0x100000001b3ull;
    }
  uint64_t h = lane[0] ^ (lane[1] * 3) ^ (lane[2] * 5) ^ (lane[3] * 7);
  for (; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return (h ^ size) * 0x100000001b3ull;
}

}  // namespace membroker::share
