// What `membrokerctl list channels` shows of a channel (membroker/channel.h):
// read from its control block, the memory the broker gave its publisher,
// mapped read-only for the moment of reading. The block is written by
// clients, so nothing in it is trusted: the geometry is checked against the
// layout and the memory's size before any position is computed, every count
// is clamped to what the geometry allows, and a block that is not a channel
// of this layout is an error, never a crash.
#pragma once

#include <cstdint>
#include <vector>

#include "admin/admin_format.h"
#include "memory/holdings.h"
#include "name_registry.h"
#include "membroker/status.h"

namespace membroker::broker {

struct ChannelCensus {
  uint32_t chunks = 0;
  uint64_t chunk_bytes = 0;
  uint32_t queue_depth = 0;
  bool work_sharing = false;
  bool drop_oldest = false;
  int32_t publisher_pid = 0;
  bool closed = false;         // the publisher has gone
  uint32_t subscribers = 0;    // active now
  uint64_t queued = 0;         // chunks waiting in all subscribers' queues
  uint32_t fullest_queue = 0;  // the longest of them
  uint32_t chunks_in_use = 0;  // loaned, queued or held
  uint64_t published = 0, dropped = 0, unreceived = 0, reaped = 0, redelivered = 0;
};

// The control block in `fd` (a memfd of `size` bytes, mapped whole).
Result<ChannelCensus> ReadChannel(int fd, uint64_t size);
// The same, from memory already mapped (the tests' entry).
Result<ChannelCensus> ReadChannel(const char* block, uint64_t size);

// `list channels`: a row for each name published with NAME/chunks beside it
// (a channel publishes both); one that does not read as a channel is shown
// with why, so an operator sees a channel of another layout too.
std::vector<Record> ChannelRecords(const NameRegistry& names, const Holdings& holdings);

}  // namespace membroker::broker
