// What membroker-share (NameShare) tells other hosts about a name it serves:
// one page of its memory per name, written once before it is registered and
// never again (a change is a new card), so a reader never sees it half
// written. Its region's name, "<16 hex of the name's hash>.<serial>", lets a
// fetcher pick the card of its name without reading the others; the card
// itself carries the whole name, the object's address and size in the share's
// process and the checksum of its bytes. Read from another host, so every
// field is checked before use (DecodeCard; fuzz_name_card).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "membroker/status.h"

namespace membroker::share {

inline constexpr size_t kCardBytes = 4096;
inline constexpr size_t kCardNameMax = 256;  // ipc::kMaxObjectNameBytes

struct NameCard {
  std::string name;
  uint64_t serial = 0;          // unique per card in one share's life
  uint64_t allocation = 0;      // the object's id at the broker (ClusterNameInfo::allocation)
  uint64_t object_address = 0;  // where the share mapped the object (a registered region)
  uint64_t size = 0;            // the object's bytes
  uint64_t checksum = 0;        // Checksum of those bytes, taken when the share mapped it
  bool operator==(const NameCard&) const = default;
};

// The card's page; PARAM_INVALID for a name too long or a page too small.
Status EncodeCard(const NameCard& card, std::span<uint8_t> page);
// PROTOCOL_ERROR saying which field is wrong (magic, version, name, sizes).
Result<NameCard> DecodeCard(std::span<const uint8_t> page);

// "0123456789abcdef." + serial: the card's region name.
std::string CardRegionName(const std::string& name, uint64_t serial);
// "0123456789abcdef.": what the region names of name's cards start with.
std::string CardRegionPrefix(const std::string& name);

// Four interleaved FNV-1a lanes over 8-byte words: finds bytes damaged or
// changed on the way (not an adversary: the share's peers are authenticated
// by the engine's handshake), at memory speed.
uint64_t Checksum(const void* data, size_t size);

}  // namespace membroker::share
