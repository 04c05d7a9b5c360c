// Channels in the C API (membroker/membroker.h) over membroker/channel.h.
#include <memory>

#include "c_api/c_api_internal.h"
#include "membroker/channel.h"
#include "membroker/membroker.h"

using namespace membroker;
using membroker::c_api::Done;
using membroker::c_api::Fail;
using membroker::c_api::Guard;

struct mb_channel_publisher {
  ChannelPublisher publisher;
};
struct mb_channel_subscriber {
  ChannelSubscriber subscriber;
};

static_assert(MB_CHANNEL_WORK_SHARING == static_cast<int>(ChannelMode::kWorkSharing) &&
              MB_WHEN_FULL_DROP_OLDEST == static_cast<int>(WhenFull::kDropOldest) &&
              MB_WAKE_POLL == static_cast<int>(WakeMode::kPoll));

namespace {

mb_chunk ToC(const Chunk& c) { return {c.index, c.data, c.capacity, c.size, c.sequence}; }
Chunk FromC(const mb_chunk& c) { return {c.index, c.data, c.capacity, c.size, c.sequence}; }
bool InRange(int v, int last) { return v >= 0 && v <= last; }

}  // namespace

extern "C" {

void mb_channel_options_init(mb_channel_options* options) {
  if (options == nullptr) return;
  const ChannelOptions d;
  *options = {d.chunks,
              d.chunk_bytes,
              d.queue_depth,
              static_cast<int>(d.mode),
              static_cast<int>(d.when_full),
              static_cast<int>(d.wake),
              d.read_only_chunks ? 1 : 0,
              static_cast<int>(d.page_policy)};
}

int mb_channel_create(mb_client* client, const char* name, const mb_channel_options* options,
                      mb_channel_publisher** out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && out, "client, name and out must not be NULL");
    mb_channel_options o;
    mb_channel_options_init(&o);
    if (options != nullptr) o = *options;
    MB_NEED(InRange(o.mode, MB_CHANNEL_WORK_SHARING), "mode is MB_CHANNEL_BROADCAST or MB_CHANNEL_WORK_SHARING");
    MB_NEED(InRange(o.when_full, MB_WHEN_FULL_DROP_OLDEST), "when_full is MB_WHEN_FULL_WAIT or MB_WHEN_FULL_DROP_OLDEST");
    MB_NEED(InRange(o.wake, MB_WAKE_POLL), "wake is MB_WAKE_FUTEX or MB_WAKE_POLL");
    MB_NEED(InRange(o.page_policy, MB_HUGE1G_ONLY), "page_policy is one of enum mb_page_policy");
    ChannelOptions co;
    co.chunks = o.chunks;
    co.chunk_bytes = o.chunk_bytes;
    co.queue_depth = o.queue_depth;
    co.mode = static_cast<ChannelMode>(o.mode);
    co.when_full = static_cast<WhenFull>(o.when_full);
    co.wake = static_cast<WakeMode>(o.wake);
    co.read_only_chunks = o.read_only_chunks != 0;
    co.page_policy = static_cast<PagePolicy>(o.page_policy);
    auto p = ChannelPublisher::Create(client->client, name, co);
    if (!p.ok()) return Fail(p.status());
    *out = new mb_channel_publisher{std::move(*p)};
    return MB_OK;
  });
}

void mb_channel_close(mb_channel_publisher* publisher) { delete publisher; }

int mb_channel_loan(mb_channel_publisher* publisher, size_t bytes, int timeout_ms, mb_chunk* out) {
  return Guard([&]() -> int {
    MB_NEED(publisher && out, "publisher and out must not be NULL");
    auto c = publisher->publisher.Loan(bytes, timeout_ms);
    if (!c.ok()) return Fail(c.status());
    *out = ToC(*c);
    return MB_OK;
  });
}

int mb_channel_publish(mb_channel_publisher* publisher, mb_chunk* chunk, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(publisher && chunk, "publisher and chunk must not be NULL");
    Chunk c = FromC(*chunk);
    if (Status st = publisher->publisher.Publish(c, timeout_ms); !st.ok()) return Fail(st);
    chunk->sequence = c.sequence;
    return MB_OK;
  });
}

int mb_channel_discard(mb_channel_publisher* publisher, mb_chunk* chunk) {
  return Guard([&]() -> int {
    MB_NEED(publisher && chunk, "publisher and chunk must not be NULL");
    Chunk c = FromC(*chunk);
    return Done(publisher->publisher.Discard(c));
  });
}

int mb_channel_wait_for_subscribers(mb_channel_publisher* publisher, uint32_t n, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(publisher != nullptr, "publisher is NULL");
    return Done(publisher->publisher.WaitForSubscribers(n, timeout_ms));
  });
}

size_t mb_channel_reap(mb_channel_publisher* publisher) {
  if (publisher == nullptr) return 0;
  try {
    return publisher->publisher.Reap();
  } catch (...) {
    return 0;
  }
}

int mb_channel_stats_get(const mb_channel_publisher* publisher, mb_channel_stats* out) {
  return Guard([&]() -> int {
    MB_NEED(publisher && out, "publisher and out must not be NULL");
    const ChannelStats s = publisher->publisher.stats();
    *out = {s.published, s.dropped, s.unreceived, s.reaped, s.reclaimed, s.redelivered, s.subscribers};
    return MB_OK;
  });
}

int mb_channel_join(mb_client* client, const char* name, int wake, int lookup_timeout_ms,
                    mb_channel_subscriber** out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && out, "client, name and out must not be NULL");
    MB_NEED(InRange(wake, MB_WAKE_POLL), "wake is MB_WAKE_FUTEX or MB_WAKE_POLL");
    SubscribeOptions o;
    o.wake = static_cast<WakeMode>(wake);
    o.lookup_timeout_ms = lookup_timeout_ms;
    auto s = ChannelSubscriber::Join(client->client, name, o);
    if (!s.ok()) return Fail(s.status());
    *out = new mb_channel_subscriber{std::move(*s)};
    return MB_OK;
  });
}

void mb_channel_leave(mb_channel_subscriber* subscriber) { delete subscriber; }

int mb_channel_receive(mb_channel_subscriber* subscriber, int timeout_ms, mb_chunk* out) {
  return Guard([&]() -> int {
    MB_NEED(subscriber && out, "subscriber and out must not be NULL");
    auto c = subscriber->subscriber.Receive(timeout_ms);
    if (!c.ok()) return Fail(c.status());
    *out = ToC(*c);
    return MB_OK;
  });
}

int mb_channel_wake_fd(mb_channel_subscriber* subscriber, int* fd) {
  return Guard([&]() -> int {
    MB_NEED(subscriber && fd, "subscriber and fd must not be NULL");
    auto got = subscriber->subscriber.WakeFd();
    if (!got.ok()) return Fail(got.status());
    *fd = *got;
    return MB_OK;
  });
}

void mb_channel_drain_wake_fd(mb_channel_subscriber* subscriber) {
  if (subscriber) subscriber->subscriber.DrainWakeFd();
}

int mb_channel_release(mb_channel_subscriber* subscriber, const mb_chunk* chunk) {
  return Guard([&]() -> int {
    MB_NEED(subscriber && chunk, "subscriber and chunk must not be NULL");
    return Done(subscriber->subscriber.Release(FromC(*chunk)));
  });
}

}  // extern "C"
