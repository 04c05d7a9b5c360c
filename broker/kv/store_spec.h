// KvStoreSpec: what a KV-cache store is made of, as its creator asked
// (checked by BlockStore::Create, kept in its index across restarts).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "kv/eviction.h"
#include "membroker/ipc/protocol.h"

namespace membroker::broker {

struct KvStoreSpec {
  std::string name;
  uint64_t block_size = 0;  // a multiple of 64 bytes
  uint64_t blocks = 0;
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  EvictionKind eviction = EvictionKind::kS3Fifo;
  uid_t uid = 0;  // its creator's: the slabs are charged to it
};

}  // namespace membroker::broker
