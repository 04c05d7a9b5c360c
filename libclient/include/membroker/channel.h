// Channels: zero-copy publish/subscribe between processes over a pool of
// chunks in broker memory that every side maps once (docs/PIPELINE.md).
//
// One publisher creates a channel under a name; up to 63 subscribers join it
// by that name. The publisher loans a chunk, writes it and publishes it:
//  - broadcast (the default): every subscriber receives it;
//  - work sharing: exactly one subscriber receives it (the one with the
//    fewest chunks waiting).
// A chunk goes back to the pool when every subscriber it was given to has
// released it. Each subscriber has a bounded queue; when it is full the
// publisher either waits (with a timeout) or drops that subscriber's oldest
// chunk and counts it (ChannelOptions::when_full).
//
// Crash safety: every chunk carries one bit per subscriber it still waits
// for, set by the publisher and cleared by that subscriber's Release, so a
// subscriber that dies (SIGKILL included) gives back exactly what it held: the
// publisher finds it dead through its pidfd whenever it needs a chunk or
// queue space, and at once in Reap(); under work sharing, what it had queued
// but not taken goes to the others. A publisher that dies mid-write has
// published nothing (Publish is one step); its subscribers see
// NOT_CONNECTED. A subscriber that restarts joins again. Every index, size
// and count read from the shared control block is checked first.
//
// Threads: a ChannelPublisher, and each ChannelSubscriber, is used by one
// thread at a time (any number of them may run in one process).
//
// Memory: the control block (header, chunk bits, subscriber slots and queues)
// is published as NAME and mapped writable by every side; the chunks are
// published as NAME + "/chunks", read-only for subscribers by default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "membroker/client.h"
#include "membroker/status.h"

namespace membroker {

enum class ChannelMode : uint8_t { kBroadcast = 0, kWorkSharing = 1 };
enum class WhenFull : uint8_t { kWait = 0, kDropOldest = 1 };
enum class WakeMode : uint8_t { kFutex = 0, kPoll = 1 };

inline constexpr uint32_t kMaxChannelSubscribers = 63;

struct ChannelOptions {
  uint32_t chunks = 64;             // chunks in the pool (1 to 65536)
  size_t chunk_bytes = 1 << 20;     // each chunk's capacity (rounded up to 64 bytes)
  uint32_t queue_depth = 16;        // per subscriber (a power of two, 1 to 4096)
  ChannelMode mode = ChannelMode::kBroadcast;
  WhenFull when_full = WhenFull::kWait;
  bool read_only_chunks = true;     // subscribers map the chunks read-only
  // The chunks' pages (membroker/client.h): kHugeFirst puts a pool of more
  // than 1 MiB on 2 MiB pages where the broker has them free (else normal
  // pages): fewer page-table pages and faults for every process that maps a
  // large pool (it did not make hand-offs faster: docs/PIPELINE.md);
  // kNormalOnly leaves reserved huge pages to others.
  PagePolicy page_policy = PagePolicy::kNormalOnly;
  // How the publisher waits for a free chunk or queue space: futex sleeps, or
  // spinning (for latency-critical stages).
  WakeMode wake = WakeMode::kFutex;
};

struct ChannelStats {
  uint64_t published = 0;        // chunks published
  uint64_t dropped = 0;          // queued chunks dropped under kDropOldest
  uint64_t unreceived = 0;       // published to nobody (no subscriber)
  uint64_t reaped = 0;           // dead subscribers cleaned up
  uint64_t reclaimed = 0;        // chunk references given back by reaping
  uint64_t redelivered = 0;      // work sharing: a dead subscriber's queued chunks passed on
  uint32_t subscribers = 0;      // joined now
};

// A chunk loaned to the publisher, or received by a subscriber.
struct Chunk {
  uint32_t index = 0;
  void* data = nullptr;    // publisher: writable; subscriber: as mapped
  size_t capacity = 0;
  size_t size = 0;         // publisher: set before Publish; subscriber: what was published
  uint64_t sequence = 0;   // publication number, from 1 (subscriber side)
};

class MEMBROKER_API ChannelPublisher {
 public:
  // Creates the channel and publishes it as `name` (ALREADY_EXISTS when the
  // name is taken). The channel lives as long as this publisher: when it is
  // destroyed or its process dies, subscribers get NOT_CONNECTED.
  static Result<ChannelPublisher> Create(Client& client, const std::string& name, const ChannelOptions& options = {});
  ChannelPublisher();
  ~ChannelPublisher();
  ChannelPublisher(ChannelPublisher&&) noexcept;
  ChannelPublisher& operator=(ChannelPublisher&&) noexcept;

  // A free chunk of at least `bytes` (at most chunk_bytes: PARAM_INVALID
  // beyond); waits up to timeout_ms while every chunk is in use (TIMEOUT).
  Result<Chunk> Loan(size_t bytes, int timeout_ms = 1000);
  // Hands chunk.size bytes to the subscribers (chunk.size <= capacity).
  // kWait: waits up to timeout_ms for room in a full queue (TIMEOUT: the
  // chunk is still loaned, publish it again or Discard it).
  Status Publish(Chunk& chunk, int timeout_ms = 1000);
  // Gives a loaned chunk back unpublished.
  Status Discard(Chunk& chunk);
  // Waits up to timeout_ms until at least n subscribers have joined.
  Status WaitForSubscribers(uint32_t n, int timeout_ms);
  // Cleans up after subscribers whose process has died; how many.
  size_t Reap();
  ChannelStats stats() const;
  // An owner of this channel's memory in this process: while it (or a copy)
  // lives, the memory stays mapped, also after Leave or destruction (the
  // channel is gone for every other purpose). What a language binding gives
  // each view of a chunk, so a view never points at unmapped memory; until
  // such owners are gone, this Client cannot join the channel again
  // (ALREADY_EXISTS: it holds the allocations).
  std::shared_ptr<const void> KeepMapped() const;


 private:
  class Impl;
  explicit ChannelPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct SubscribeOptions {
  WakeMode wake = WakeMode::kFutex;  // how Receive waits
  int lookup_timeout_ms = 1000;      // for the channel's name to appear
};

class MEMBROKER_API ChannelSubscriber {
 public:
  // Joins the channel published as `name` (waits for it up to
  // lookup_timeout_ms; RESOURCE_EXHAUSTED when 63 subscribers are in;
  // NOT_CONNECTED when its publisher has gone, whose name can outlive it
  // until the broker has seen it go: try again).
  static Result<ChannelSubscriber> Join(Client& client, const std::string& name, const SubscribeOptions& options = {});
  ChannelSubscriber();
  ~ChannelSubscriber();  // Leave()
  ChannelSubscriber(ChannelSubscriber&&) noexcept;
  ChannelSubscriber& operator=(ChannelSubscriber&&) noexcept;

  // The oldest chunk published to this subscriber; waits up to timeout_ms
  // (TIMEOUT). NOT_CONNECTED once the publisher is gone and nothing is left
  // queued; PROTOCOL_ERROR when the control block holds something impossible.
  Result<Chunk> Receive(int timeout_ms = 1000);
  // An fd for an event loop (epoll, asyncio's add_reader), made on the first
  // call: readable when a chunk may be queued for this subscriber or its
  // publisher has gone. Poll it after a Receive answered TIMEOUT (which asks
  // the publisher to send the fd a byte for the next chunk), then call
  // DrainWakeFd and Receive(0) again, in that order. Owned by the subscriber.
  Result<int> WakeFd();
  void DrainWakeFd();
  // Gives a received chunk back (once; PARAM_INVALID for one not held).
  Status Release(const Chunk& chunk);
  // Releases everything held, gives the subscriber slot back and unmaps the
  // channel: the same Client may Join it again at once. Receive and Release
  // are NOT_CONNECTED / PARAM_INVALID afterwards.
  void Leave();
  uint32_t slot() const;
  // An owner of this channel's memory in this process: while it (or a copy)
  // lives, the memory stays mapped, also after Leave or destruction (the
  // channel is gone for every other purpose). What a language binding gives
  // each view of a chunk, so a view never points at unmapped memory; until
  // such owners are gone, this Client cannot join the channel again
  // (ALREADY_EXISTS: it holds the allocations).
  std::shared_ptr<const void> KeepMapped() const;


 private:
  class Impl;
  explicit ChannelSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace membroker
