// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash meant as a
// MAC for short inputs. The broker tags the memory it creates with it, so a
// broker that restarts can tell its own memory from memory a client made.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace membroker::broker {

using SipKey = std::array<uint8_t, 16>;

uint64_t SipHash24(const SipKey& key, const void* data, size_t size);

}  // namespace membroker::broker
