// What the broker keeps in systemd's file descriptor store (docs/RESTART.md),
// so that a broker systemd restarts after a crash finds everything again:
//  - every allocation's memfd, named "mem-" and what adopting it needs (its
//    id, page size, policy, pinning, same-address range, owner's uid), so an
//    allocation and its description are stored and removed in one message;
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

std::string StoredStateName(uint64_t generation);
std::optional<uint64_t> ParseStoredStateName(const std::string& name);

// The records (TakeOverExport, TakeOverName, then TakeOverEnd with their
// counts) as a sealed memfd.
Result<ipc::UniqueFd> WriteStoredState(const std::vector<ipc::Message>& records);
// Reads them back, each checked (lengths, decoding, the closing counts).
Result<std::vector<ipc::Message>> ReadStoredState(int fd);

}  // namespace membroker::broker
