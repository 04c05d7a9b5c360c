// What the broker keeps in systemd's file descriptor store (docs/RESTART.md),
// so that a broker systemd restarts after a crash finds everything again:
//  - every allocation's memfd, named "mem-" and what adopting it needs (its
//    id, page size, policy, pinning, same-address range, owner's uid), so an
//    allocation and its description are stored and removed in one message;
//  - every KV-cache store's index and slabs, named "kv-STORE-GEN-PART" (PART
//    0 the index, N + 1 slab N: TakeOverKvStore's parts; GEN the store's
//    generation, so a broker that makes a store again stores the new set
//    before it removes the old);
//  - a sealed memfd with the exports and names ("state-N", N counting up;
//    a new one is stored before the old one is removed, so a crash between
//    leaves both and the higher N wins).
// Pure encoding: the sd_notify calls are systemd.h's, the bookkeeping the
// broker's (fd_store.cc in Broker).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

std::string StoredMemoryName(const ipc::TakeOverAllocation& a);
// nullopt unless name is exactly what StoredMemoryName makes.
std::optional<ipc::TakeOverAllocation> ParseStoredMemoryName(const std::string& name);

struct StoredKvPart {
  uint64_t store = 0, generation = 0;
  uint32_t part = 0;
};
std::string StoredKvName(const StoredKvPart& p);
// nullopt unless name is exactly what StoredKvName makes.
std::optional<StoredKvPart> ParseStoredKvName(const std::string& name);

std::string StoredStateName(uint64_t generation);
std::optional<uint64_t> ParseStoredStateName(const std::string& name);

// The records (TakeOverExport, TakeOverName, then TakeOverEnd with their
// counts) as a sealed memfd.
Result<ipc::UniqueFd> WriteStoredState(const std::vector<ipc::Message>& records);
// Reads them back, each checked (lengths, decoding, the closing counts).
Result<std::vector<ipc::Message>> ReadStoredState(int fd);

}  // namespace membroker::broker
