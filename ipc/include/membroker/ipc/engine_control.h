// A transfer engine's control block: a 4 KiB broker allocation that the
// engine maps, and each connected peer maps too. One header for both sides
// (the engine and its peers in libclient, the broker that hands out slots).
//
// Trust: a peer can write anything here. The engine reads only `busy` of the
// slots the broker says are connected (EnginePeersRequest), waits on each at
// most until its deadline, and takes the peers' identity from the broker
// (SO_PEERCRED at their connect), never from this block.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace membroker::ipc {

inline constexpr uint32_t kEngineControlMagic = 0x4d42454e;  // "MBEN"
// Peers per engine: one slot each.
inline constexpr uint32_t kEngineSlots = 63;

struct alignas(64) EngineControlSlot {
  std::atomic<uint32_t> busy;  // transfers of this slot's peer in flight
  uint32_t unused;
};

struct EngineControlBlock {
  std::atomic<uint32_t> magic;
  std::atomic<uint32_t> generation;  // bumped when regions go away
  std::atomic<uint32_t> draining;    // the owner is waiting for busy slots
  // Random, written once at Initialize: an engine reached by ip:port whose
  // Welcome carries the identity found here is on this host (same broker).
  uint8_t identity[16];
  uint8_t pad[36];
  EngineControlSlot slots[kEngineSlots];
};

static_assert(sizeof(EngineControlBlock) == 4096, "the control block is one 4 KiB page");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

}  // namespace membroker::ipc
