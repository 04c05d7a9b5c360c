// Channels between real processes (membroker/channel.h): broadcast and work
// sharing with every byte checked, full queues under both policies, a
// subscriber SIGKILLed while holding chunks, a publisher SIGKILLed mid-write,
// rejoining, and a damaged control block.
#include <signal.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "readable.h"
#include "membroker/channel.h"
#include "membroker/client.h"
#include "shm/channel_view.h"

namespace membroker::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Publication n fills its chunk with this pattern; n..n+size tells a
// subscriber exactly what it should read.
uint8_t Byte(uint64_t sequence, size_t i) { return static_cast<uint8_t>(sequence * 131 + i * 7); }
void Fill(Chunk& c, uint64_t sequence, size_t size) {
  auto* p = static_cast<uint8_t*>(c.data);
  for (size_t i = 0; i < size; ++i) p[i] = Byte(sequence, i);
  c.size = size;
}
bool Holds(const Chunk& c) {
  const auto* p = static_cast<const uint8_t*>(c.data);
  for (size_t i = 0; i < c.size; ++i)
    if (p[i] != Byte(c.sequence, i)) return false;
  return true;
}
size_t SizeOf(uint64_t sequence) { return 1 + (sequence * 977) % (64 << 10); }

// A subscriber process: joins, then receives until the publisher goes,
// checking every byte; says "joined" and, at the end, the sequences it got.
int Subscriber(const std::string& socket, const std::string& channel, Channel& ch, WakeMode wake) {
  auto c = Client::Connect({socket, "subscriber"});
  if (!c.ok()) return 10;
  SubscribeOptions o;
  o.wake = wake;
  o.lookup_timeout_ms = 10000;
  auto sub = ChannelSubscriber::Join(*c, channel, o);
  if (!sub.ok()) return 11;
  ch.Send("joined");
  std::ostringstream got;
  for (;;) {
    auto chunk = sub->Receive(20000);
    if (chunk.code() == ErrorCode::kNotConnected) break;  // the publisher has gone, nothing left
    if (!chunk.ok()) return 12;
    if (chunk->size != SizeOf(chunk->sequence) || !Holds(*chunk)) return 13;
    got << chunk->sequence << " ";
    if (!sub->Release(*chunk).ok()) return 14;
    if (sub->Release(*chunk).code() != ErrorCode::kParamInvalid) return 15;  // once
  }
  ch.Send(got.str());
  return 0;
}

std::vector<uint64_t> Sequences(const std::string& line) {
  std::istringstream in(line);
  std::vector<uint64_t> out;
  for (uint64_t s; in >> s;) out.push_back(s);
  return out;
}

struct Children {
  std::vector<Channel> channels;
  std::vector<pid_t> pids;
  explicit Children(size_t n) : channels(n) {}
  ~Children() {
    for (pid_t p : pids)
      if (p > 0) {
        ::kill(p, SIGKILL);
        (void)WaitChild(p);
      }
  }
  void Start(size_t i, const std::function<int(Channel&)>& fn) {
    pids.push_back(ForkChild([this, i, fn] {
      channels[i].AsChild();
      return fn(channels[i]);
    }));
    channels[i].AsParent();
  }
  int Wait(size_t i) {
    const int rc = WaitChild(pids[i]);
    pids[i] = 0;
    return rc;
  }
};

// Publications first .. first+count-1 (the channel numbers them from 1).
void PublishAll(ChannelPublisher& pub, uint64_t count, uint64_t first = 1) {
  for (uint64_t n = first; n < first + count; ++n) {
    auto chunk = pub.Loan(SizeOf(n), 10000);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    Fill(*chunk, n, SizeOf(n));
    ASSERT_TRUE(pub.Publish(*chunk, 10000).ok());
    ASSERT_EQ(chunk->sequence, n);
  }
}

// n Subscriber processes on `channel`, joined, and counted by the publisher.
void StartSubscribers(Children& kids, size_t n, const std::string& socket, const std::string& channel, WakeMode wake,
                      ChannelPublisher& pub) {
  for (size_t i = 0; i < n; ++i) kids.Start(i, [&](Channel& ch) { return Subscriber(socket, channel, ch, wake); });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(kids.channels[i].Receive(), "joined");
  ASSERT_TRUE(pub.WaitForSubscribers(static_cast<uint32_t>(n), 5000).ok());
}

// Publishes kCount chunks to one subscriber process per entry of `wakes`
// (each waiting that way) and checks that each got every one, in order.
void BroadcastTo(const std::vector<WakeMode>& wakes, const ChannelOptions& o) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  ASSERT_TRUE(c.ok());
  auto pub = ChannelPublisher::Create(*c, "chan/bcast", o);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  constexpr uint64_t kCount = 500;
  Children kids(wakes.size());
  for (size_t i = 0; i < wakes.size(); ++i)
    kids.Start(i, [&, i](Channel& ch) { return Subscriber(b.socket(), "chan/bcast", ch, wakes[i]); });
  for (size_t i = 0; i < wakes.size(); ++i) ASSERT_EQ(kids.channels[i].Receive(), "joined");
  ASSERT_TRUE(pub->WaitForSubscribers(static_cast<uint32_t>(wakes.size()), 5000).ok());
  PublishAll(*pub, kCount);
  EXPECT_EQ(pub->stats().published, kCount);
  EXPECT_EQ(pub->stats().dropped, 0u);
  *pub = ChannelPublisher();  // gone: subscribers drain, then NOT_CONNECTED
  for (size_t i = 0; i < wakes.size(); ++i) {
    std::vector<uint64_t> got = Sequences(kids.channels[i].Receive());
    ASSERT_EQ(got.size(), kCount) << "subscriber " << i;
    for (uint64_t n = 0; n < kCount; ++n) ASSERT_EQ(got[n], n + 1);
    EXPECT_EQ(kids.Wait(i), 0);
  }
}

class ChannelWake : public ::testing::TestWithParam<WakeMode> {};

TEST_P(ChannelWake, BroadcastGivesEverySubscriberEveryChunk) {
  const WakeMode w = GetParam();
  BroadcastTo({w, w, w}, ChannelOptions{.chunks = 8, .chunk_bytes = 64 << 10, .queue_depth = 4, .wake = w});
}

// A broadcast channel's sleepers share one futex word and its spinners watch
// their own: both kinds at once, with a queue of one so that each waits for
// almost every chunk.
TEST(Channel, BroadcastReachesSleepersAndSpinnersTogether) {
  const WakeMode f = WakeMode::kFutex, p = WakeMode::kPoll;
  BroadcastTo({f, p, f, p}, ChannelOptions{.chunks = 4, .chunk_bytes = 64 << 10, .queue_depth = 1});
}

INSTANTIATE_TEST_SUITE_P(FutexAndPoll, ChannelWake, ::testing::Values(WakeMode::kFutex, WakeMode::kPoll));

TEST(Channel, WorkSharingGivesEachChunkToExactlyOneSubscriber) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions o{.chunks = 8, .chunk_bytes = 64 << 10, .queue_depth = 2, .mode = ChannelMode::kWorkSharing};
  auto pub = ChannelPublisher::Create(*c, "chan/work", o);
  ASSERT_TRUE(pub.ok());
  constexpr size_t kSubs = 3;
  constexpr uint64_t kCount = 600;
  Children kids(kSubs);
  ASSERT_NO_FATAL_FAILURE(StartSubscribers(kids, kSubs, b.socket(), "chan/work", WakeMode::kFutex, *pub));
  PublishAll(*pub, kCount);
  *pub = ChannelPublisher();
  std::set<uint64_t> all;
  size_t total = 0;
  for (size_t i = 0; i < kSubs; ++i) {
    std::vector<uint64_t> got = Sequences(kids.channels[i].Receive());
    EXPECT_GT(got.size(), 0u) << "subscriber " << i << " got no work";
    total += got.size();
    all.insert(got.begin(), got.end());
    EXPECT_EQ(kids.Wait(i), 0);
  }
  EXPECT_EQ(total, kCount);      // no chunk twice
  EXPECT_EQ(all.size(), kCount);  // none lost
}

TEST(Channel, WorkSharingPassesADeadSubscribersQueuedChunksToTheOthers) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions o{.chunks = 16, .chunk_bytes = 64 << 10, .queue_depth = 8, .mode = ChannelMode::kWorkSharing};
  auto pub = ChannelPublisher::Create(*c, "chan/redeliver", o);
  ASSERT_TRUE(pub.ok());
  Children kids(1);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "idle"});
    auto sub = ChannelSubscriber::Join(*cc, "chan/redeliver");
    if (!sub.ok()) return 10;
    ch.Send("joined");
    ch.Receive();  // killed here, never taking its share
    return 0;
  });
  ASSERT_EQ(kids.channels[0].Receive(), "joined");
  auto other = Client::Connect({b.socket(), "worker"});
  auto worker = ChannelSubscriber::Join(*other, "chan/redeliver");
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(pub->WaitForSubscribers(2, 5000).ok());
  PublishAll(*pub, 8);  // shared between the two: four each
  ::kill(kids.pids[0], SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
  EXPECT_EQ(pub->Reap(), 1u);
  EXPECT_EQ(pub->stats().redelivered, 4u);
  std::set<uint64_t> got;
  for (int i = 0; i < 8; ++i) {
    auto chunk = worker->Receive(1000);
    ASSERT_TRUE(chunk.ok()) << "chunk " << i << ": " << chunk.status().ToString();
    EXPECT_TRUE(Holds(*chunk));
    got.insert(chunk->sequence);
    ASSERT_TRUE(worker->Release(*chunk).ok());
  }
  EXPECT_EQ(got.size(), 8u);  // all eight, the dead one's four included
}

// A subscriber in this process that never reads: its queue fills.
TEST(Channel, AFullQueueMakesThePublisherWaitOrDropTheOldest) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "both"});
  for (WhenFull policy : {WhenFull::kWait, WhenFull::kDropOldest}) {
    const std::string name = policy == WhenFull::kWait ? "chan/wait" : "chan/drop";
    const ChannelOptions o{.chunks = 16, .chunk_bytes = 4096, .queue_depth = 4, .when_full = policy};
    auto pub = ChannelPublisher::Create(*c, name, o);
    ASSERT_TRUE(pub.ok());
    auto other = Client::Connect({b.socket(), "slow"});
    auto sub = ChannelSubscriber::Join(*other, name);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    for (uint64_t n = 1; n <= 4; ++n) {
      auto chunk = pub->Loan(100);
      Fill(*chunk, n, 100);
      ASSERT_TRUE(pub->Publish(*chunk).ok());
    }
    auto fifth = pub->Loan(100);
    ASSERT_TRUE(fifth.ok());
    Fill(*fifth, 5, 100);
    if (policy == WhenFull::kWait) {
      const auto t0 = Clock::now();
      Status st = pub->Publish(*fifth, 50);
      EXPECT_EQ(st.code(), ErrorCode::kTimeout) << st.ToString();
      EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(50));
      // Nothing was published; the chunk is still ours. Room comes with a read.
      auto first = sub->Receive(0);
      ASSERT_TRUE(first.ok());
      EXPECT_EQ(first->sequence, 1u);
      ASSERT_TRUE(sub->Release(*first).ok());
      ASSERT_TRUE(pub->Publish(*fifth, 1000).ok());
      EXPECT_EQ(fifth->sequence, 5u);  // the timed-out attempt took no number
      EXPECT_EQ(pub->stats().dropped, 0u);
      for (uint64_t n = 2; n <= 5; ++n) {
        auto got = sub->Receive(0);
        ASSERT_TRUE(got.ok());
        EXPECT_EQ(got->sequence, n);
        EXPECT_TRUE(Holds(*got));
        ASSERT_TRUE(sub->Release(*got).ok());
      }
    } else {
      ASSERT_TRUE(pub->Publish(*fifth).ok());  // drops #1 at once
      for (uint64_t n = 6; n <= 12; ++n) {
        auto chunk = pub->Loan(100);
        ASSERT_TRUE(chunk.ok()) << "dropped chunks come back to the pool";
        Fill(*chunk, n, 100);
        ASSERT_TRUE(pub->Publish(*chunk).ok());
      }
      EXPECT_EQ(pub->stats().dropped, 8u);
      for (uint64_t n = 9; n <= 12; ++n) {  // the newest four
        auto got = sub->Receive(0);
        ASSERT_TRUE(got.ok());
        EXPECT_EQ(got->sequence, n);
        EXPECT_TRUE(Holds(*got));
        ASSERT_TRUE(sub->Release(*got).ok());
      }
    }
    EXPECT_EQ(sub->Receive(0).code(), ErrorCode::kTimeout);
    // Leave, then Join again on the same Client, the old object still alive.
    sub->Leave();
    EXPECT_EQ(sub->Receive(0).code(), ErrorCode::kNotConnected);
    auto again = ChannelSubscriber::Join(*other, name);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    const uint64_t next = pub->stats().published + 1;
    auto chunk = pub->Loan(100);
    ASSERT_TRUE(chunk.ok());
    Fill(*chunk, next, 100);
    ASSERT_TRUE(pub->Publish(*chunk).ok());
    auto got = again->Receive(1000);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->sequence, next);
    EXPECT_TRUE(Holds(*got));
  }
}

// A drop-oldest publisher that overflows queues of depth 1 all the time while
// subscribers take as fast as they can, and some are SIGKILLed and replaced:
// an honest subscriber never sees a damaged queue (reading head, then tail,
// while the publisher dropped and pushed in between, once looked like a
// queue holding more than its depth), and every chunk it gets is whole.
int Taker(const std::string& socket, Channel& ch) {
  auto c = Client::Connect({socket, "taker"});
  if (!c.ok()) return 10;
  SubscribeOptions o;
  o.wake = WakeMode::kPoll;
  auto sub = ChannelSubscriber::Join(*c, "chan/race", o);
  if (!sub.ok()) return 11;
  ch.Send("joined");
  for (;;) {
    auto chunk = sub->Receive(60000);
    if (chunk.code() == ErrorCode::kNotConnected) return 0;  // the publisher has gone
    if (!chunk.ok()) {
      std::fprintf(stderr, "taker: %s\n", chunk.status().ToString().c_str());
      return chunk.code() == ErrorCode::kProtocolError ? 20 : 12;
    }
    if (chunk->size != SizeOf(chunk->sequence) % 512 + 1) return 13;
    if (!sub->Release(*chunk).ok()) return 14;
  }
}

TEST(Channel, DropOldestOverflowingAllTheTimeNeverLooksDamagedToHonestSubscribers) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions o{.chunks = 8, .chunk_bytes = 4096, .queue_depth = 1, .when_full = WhenFull::kDropOldest};
  auto pub = ChannelPublisher::Create(*c, "chan/race", o);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  constexpr size_t kTakers = 3, kRounds = 6;
  Children kids(kTakers * kRounds);
  size_t started = 0;
  for (size_t round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < kTakers; ++i, ++started) {
      kids.Start(started, [&](Channel& ch) { return Taker(b.socket(), ch); });
      ASSERT_EQ(kids.channels[started].Receive(), "joined");
    }
    for (uint64_t n = 1; n <= 20000; ++n) {
      const uint64_t sequence = round * 20000 + n;  // the channel numbers publications from 1
      auto chunk = pub->Loan(SizeOf(sequence) % 512 + 1, 10000);
      ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
      chunk->size = SizeOf(sequence) % 512 + 1;
      ASSERT_TRUE(pub->Publish(*chunk, 10000).ok());
      ASSERT_EQ(chunk->sequence, sequence);
      // Two of each round's three takers die mid-stream; the third lives to the end.
      if ((n == 5000 || n == 10000) && round + 1 < kRounds) ::kill(kids.pids[started - n / 5000], SIGKILL);
    }
  }
  EXPECT_GT(pub->stats().dropped, 0u);
  *pub = ChannelPublisher();  // gone: the takers that live end with NOT_CONNECTED
  for (size_t i = 0; i < started; ++i) {
    const int rc = kids.Wait(i);
    EXPECT_TRUE(rc == 0 || rc == 128 + SIGKILL) << "taker " << i << " exited " << rc;
  }
}

TEST(Channel, ASubscriberKilledHoldingChunksGivesThemBackAndANewOneJoins) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions o{.chunks = 8, .chunk_bytes = 64 << 10, .queue_depth = 8};
  auto pub = ChannelPublisher::Create(*c, "chan/crash", o);
  ASSERT_TRUE(pub.ok());
  Children kids(2);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "victim"});
    auto sub = ChannelSubscriber::Join(*cc, "chan/crash");
    if (!sub.ok()) return 10;
    ch.Send("joined");
    for (int i = 0; i < 5; ++i)  // holds five, leaves three queued
      if (!sub->Receive(10000).ok()) return 11;
    ch.Send("holding");
    ch.Receive();  // killed here
    return 0;
  });
  ASSERT_EQ(kids.channels[0].Receive(), "joined");
  ASSERT_TRUE(pub->WaitForSubscribers(1, 5000).ok());
  PublishAll(*pub, 8);
  ASSERT_EQ(kids.channels[0].Receive(), "holding");
  EXPECT_EQ(pub->Loan(1, 0).code(), ErrorCode::kTimeout);  // every chunk is the victim's
  ::kill(kids.pids[0], SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
  // The next loan finds it dead and takes all eight back.
  const auto t0 = Clock::now();
  std::vector<Chunk> loaned;
  for (int i = 0; i < 8; ++i) {
    auto chunk = pub->Loan(4096, 1000);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    loaned.push_back(*chunk);
  }
  std::printf("subscriber SIGKILLed holding 8 chunks: all loanable again %.2f ms after it was reaped\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  EXPECT_EQ(pub->stats().reaped, 1u);
  EXPECT_EQ(pub->stats().reclaimed, 8u);
  EXPECT_EQ(pub->stats().subscribers, 0u);
  for (Chunk& chunk : loaned) ASSERT_TRUE(pub->Discard(chunk).ok());
  // A restarted subscriber joins and receives what is published from then on.
  kids.Start(1, [&](Channel& ch) { return Subscriber(b.socket(), "chan/crash", ch, WakeMode::kFutex); });
  ASSERT_EQ(kids.channels[1].Receive(), "joined");
  ASSERT_TRUE(pub->WaitForSubscribers(1, 5000).ok());
  PublishAll(*pub, 20, 9);
  *pub = ChannelPublisher();
  EXPECT_EQ(Sequences(kids.channels[1].Receive()).size(), 20u);
  EXPECT_EQ(kids.Wait(1), 0);
}

// A subscriber SIGKILLed is not counted by WaitForSubscribers (it was, until
// something reaped it, and the frames published meanwhile went to nobody).
TEST(Channel, WaitForSubscribersDoesNotCountADeadOne) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  auto pub = ChannelPublisher::Create(*c, "chan/dead", ChannelOptions{.chunks = 4, .chunk_bytes = 64 << 10});
  ASSERT_TRUE(pub.ok());
  Children kids(2);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "victim"});
    auto sub = ChannelSubscriber::Join(*cc, "chan/dead");
    if (!sub.ok()) return 10;
    ch.Send("joined");
    ch.Receive();  // killed here
    return 0;
  });
  ASSERT_EQ(kids.channels[0].Receive(), "joined");
  ASSERT_TRUE(pub->WaitForSubscribers(1, 5000).ok());
  ::kill(kids.pids[0], SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
  EXPECT_EQ(pub->WaitForSubscribers(1, 50).code(), ErrorCode::kTimeout);
  EXPECT_EQ(pub->stats().subscribers, 0u);
  EXPECT_EQ(pub->stats().reaped, 1u);
  kids.Start(1, [&](Channel& ch) { return Subscriber(b.socket(), "chan/dead", ch, WakeMode::kFutex); });
  ASSERT_EQ(kids.channels[1].Receive(), "joined");
  ASSERT_TRUE(pub->WaitForSubscribers(1, 5000).ok());
  PublishAll(*pub, 5);
  *pub = ChannelPublisher();
  EXPECT_EQ(Sequences(kids.channels[1].Receive()).size(), 5u);
  EXPECT_EQ(kids.Wait(1), 0);
}

TEST(Channel, APublisherKilledMidWritePublishesNothing) {
  BrokerProcess b;
  Children kids(1);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "publisher"});
    auto pub = ChannelPublisher::Create(*cc, "chan/half", {});
    if (!pub.ok()) return 10;
    ch.Send("created");
    if (!pub->WaitForSubscribers(1, 10000).ok()) return 11;
    auto chunk = pub->Loan(4096);
    if (!chunk.ok()) return 12;
    std::memset(chunk->data, 'h', 2048);  // half written
    ch.Send("writing");
    ch.Receive();  // killed here
    return 0;
  });
  ASSERT_EQ(kids.channels[0].Receive(), "created");
  auto c = Client::Connect({b.socket(), "subscriber"});
  auto sub = ChannelSubscriber::Join(*c, "chan/half");
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_EQ(kids.channels[0].Receive(), "writing");
  ::kill(kids.pids[0], SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
  auto got = sub->Receive(5000);
  EXPECT_EQ(got.code(), ErrorCode::kNotConnected) << got.status().ToString();
}

// A subscriber waits in an event loop: its wake fd becomes readable for a
// chunk published after a Receive answered TIMEOUT, stays quiet otherwise,
// and becomes readable when its publisher is SIGKILLed.
TEST(Channel, ASubscribersWakeFdWakesForChunksAndForItsPublishersDeath) {
  BrokerProcess b;
  Children kids(1);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "publisher"});
    auto pub = ChannelPublisher::Create(*cc, "chan/polled", {});
    if (!pub.ok()) return 10;
    ch.Send("created");
    for (uint64_t n = 1;; ++n) {
      if (ch.Receive() != "publish") return 11;
      auto chunk = pub->Loan(SizeOf(n), 10000);
      if (!chunk.ok()) return 12;
      Fill(*chunk, n, SizeOf(n));
      if (!pub->Publish(*chunk, 10000).ok()) return 13;
      ch.Send("published");
    }
  });
  ASSERT_EQ(kids.channels[0].Receive(), "created");
  auto c = Client::Connect({b.socket(), "subscriber"});
  auto sub = ChannelSubscriber::Join(*c, "chan/polled");
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto fd = sub->WakeFd();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(*sub->WakeFd(), *fd);
  for (uint64_t n = 1; n <= 3; ++n) {
    EXPECT_EQ(sub->Receive(0).code(), ErrorCode::kTimeout);  // nothing yet: the fd is armed
    EXPECT_FALSE(Readable(*fd, 0));
    kids.channels[0].Send("publish");
    ASSERT_EQ(kids.channels[0].Receive(), "published");
    ASSERT_TRUE(Readable(*fd, 30'000)) << "no wake for chunk " << n;
    sub->DrainWakeFd();
    auto got = sub->Receive(0);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->sequence, n);
    EXPECT_TRUE(Holds(*got));
    ASSERT_TRUE(sub->Release(*got).ok());
  }
  EXPECT_EQ(sub->Receive(0).code(), ErrorCode::kTimeout);
  EXPECT_FALSE(Readable(*fd, 0));
  ::kill(kids.pids[0], SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
  ASSERT_TRUE(Readable(*fd, 30'000)) << "no wake for the publisher's death";
  EXPECT_EQ(sub->Receive(0).code(), ErrorCode::kNotConnected);
}

// A publisher's name can outlive it: here a child it forked keeps its broker
// socket open, so the broker does not see its session end. Joining the channel
// of a dead publisher (a zombie, whose pid can still be opened) is refused.
TEST(Channel, AChannelWhosePublisherDiedCannotBeJoined) {
  BrokerProcess b;
  Children kids(1);
  kids.Start(0, [&](Channel& ch) {
    auto cc = Client::Connect({b.socket(), "publisher"});
    auto pub = ChannelPublisher::Create(*cc, "chan/orphan", {});
    if (!pub.ok()) return 10;
    std::fflush(stdout);
    const pid_t keeper = ::fork();
    if (keeper == 0) {
      for (;;) ::pause();  // holds the inherited broker socket until SIGKILLed
    }
    ch.Send(std::to_string(keeper));
    ch.Receive();  // killed here
    return 0;
  });
  const pid_t keeper = std::stoi(kids.channels[0].Receive());
  ASSERT_GT(keeper, 0);
  ::kill(kids.pids[0], SIGKILL);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(kids.pids[0]), &info, WEXITED | WNOWAIT), 0);  // a zombie now
  auto c = Client::Connect({b.socket(), "subscriber"});
  ASSERT_TRUE(c->Lookup("chan/orphan", 0).ok()) << "the name should outlive its publisher here";
  auto sub = ChannelSubscriber::Join(*c, "chan/orphan", {.lookup_timeout_ms = 0});
  EXPECT_EQ(sub.code(), ErrorCode::kNotConnected) << sub.status().ToString();
  ::kill(keeper, SIGKILL);
  EXPECT_NE(kids.Wait(0), 0);
}

TEST(Channel, BadArgumentsAndADamagedControlBlockAreClearErrors) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions bad{.queue_depth = 3};  // not a power of two
  EXPECT_EQ(ChannelPublisher::Create(*c, "chan/bad", bad).code(), ErrorCode::kParamInvalid);
  const ChannelOptions o{.chunks = 4, .chunk_bytes = 4096};
  auto pub = ChannelPublisher::Create(*c, "chan/ok", o);
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(ChannelPublisher::Create(*c, "chan/ok", o).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(pub->Loan(4097).code(), ErrorCode::kParamInvalid);
  Chunk stranger;
  EXPECT_EQ(pub->Publish(stranger).code(), ErrorCode::kParamInvalid);
  auto chunk = pub->Loan(10);
  chunk->size = 5000;
  EXPECT_EQ(pub->Publish(*chunk).code(), ErrorCode::kParamInvalid);
  ASSERT_TRUE(pub->Discard(*chunk).ok());
  EXPECT_EQ(pub->Discard(*chunk).code(), ErrorCode::kParamInvalid);

  auto other = Client::Connect({b.socket(), "subscriber"});
  SubscribeOptions quick;
  quick.lookup_timeout_ms = 0;
  EXPECT_EQ(ChannelSubscriber::Join(*other, "chan/none", quick).code(), ErrorCode::kNotFound);
  auto sub = ChannelSubscriber::Join(*other, "chan/ok");
  ASSERT_TRUE(sub.ok());
  Chunk never;
  EXPECT_EQ(sub->Release(never).code(), ErrorCode::kParamInvalid);
  // Someone scribbles over the control block (it is shared writable): the
  // subscriber reports it instead of reading out of bounds.
  auto vandal = Client::Connect({b.socket(), "vandal"});
  auto h = vandal->Lookup("chan/ok");
  ASSERT_TRUE(h.ok());
  auto m = MapWhole(*vandal, *h);
  ASSERT_TRUE(m.ok());
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t off = 256; off + 8 <= h->size(); off += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(m->as<char>() + off, &x, 8);
  }
  EXPECT_EQ(sub->Receive(100).code(), ErrorCode::kProtocolError);
  // A name that is not a channel.
  auto plain = vandal->MallocPhysical(4096), plain_chunks = vandal->MallocPhysical(4096);
  ASSERT_TRUE(vandal->Publish("chan/fake", *plain).ok());
  ASSERT_TRUE(vandal->Publish("chan/fake/chunks", *plain_chunks).ok());
  EXPECT_EQ(ChannelSubscriber::Join(*other, "chan/fake").code(), ErrorCode::kProtocolError);
  // A mode that is neither broadcast nor work sharing (the header's mode
  // word, after magic, chunks, queue depth and chunk size: byte 24).
  auto odd = ChannelPublisher::Create(*c, "chan/odd", o);
  ASSERT_TRUE(odd.ok());
  auto oh = vandal->Lookup("chan/odd");
  ASSERT_TRUE(oh.ok());
  auto om = MapWhole(*vandal, *oh);
  ASSERT_TRUE(om.ok());
  const uint32_t seven = 7;
  std::memcpy(om->as<char>() + 24, &seven, sizeof(seven));
  EXPECT_EQ(ChannelSubscriber::Join(*other, "chan/odd").code(), ErrorCode::kProtocolError);
}

// A subscriber that writes into the control block (it is shared writable: a
// bug, or a hostile process of the same uid) makes the others' calls answer
// PROTOCOL_ERROR or TIMEOUT by their deadlines; it never wedges the publisher
// in Publish or makes it write outside the block.
TEST(Channel, AScribbledControlBlockIsAnErrorNeverAWedgeOrAStrayWrite) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "publisher"});
  const ChannelOptions o{.chunks = 8, .chunk_bytes = 4096, .queue_depth = 4, .when_full = WhenFull::kDropOldest};
  auto pub = ChannelPublisher::Create(*c, "chan/scribble", o);
  ASSERT_TRUE(pub.ok());
  auto other = Client::Connect({b.socket(), "subscriber"});
  auto sub = ChannelSubscriber::Join(*other, "chan/scribble");
  ASSERT_TRUE(sub.ok());
  auto vandal = Client::Connect({b.socket(), "vandal"});
  auto h = vandal->Lookup("chan/scribble");
  ASSERT_TRUE(h.ok());
  auto m = MapWhole(*vandal, *h);
  ASSERT_TRUE(m.ok());
  namespace layout = detail::channel;
  const auto l = layout::Layout::For(o.chunks, o.chunk_bytes, o.queue_depth);
  auto& header = *m->as<layout::Header>();
  auto& slot = *reinterpret_cast<layout::SlotHeader*>(m->as<char>() + l.slots + l.slot_stride * sub->slot());
  auto publish = [&](int timeout_ms) {
    auto chunk = pub->Loan(64, timeout_ms);
    if (!chunk.ok()) return chunk.status();
    chunk->size = 64;
    Status st = pub->Publish(*chunk, timeout_ms);
    if (!st.ok()) {
      EXPECT_TRUE(pub->Discard(*chunk).ok());
    }
    return st;
  };
  // A queue that says it holds more than its depth: an error to both sides.
  slot.tail.store(slot.head.load() + 1000);
  Status st = publish(200);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.ToString();
  EXPECT_NE(st.message().find("queue holds more than its depth"), std::string::npos) << st.ToString();
  EXPECT_EQ(sub->Receive(100).code(), ErrorCode::kProtocolError);
  slot.tail.store(slot.head.load());
  EXPECT_TRUE(publish(200).ok());
  // An active bit for a slot past the block: not written to.
  header.active.fetch_or(uint64_t{1} << 63);
  EXPECT_TRUE(publish(200).ok());
  // A head that keeps moving under the publisher: each Publish still ends by
  // its deadline, with an answer.
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    for (uint64_t x = 1; !stop.load(); ++x) {
      slot.head.store(x * 0x9e3779b97f4a7c15ull);
      slot.tail.store(x % 3 == 0 ? slot.head.load() + 4 : x);
    }
  });
  for (int i = 0; i < 200; ++i) {
    st = publish(20);
    EXPECT_TRUE(st.ok() || st.code() == ErrorCode::kProtocolError || st.code() == ErrorCode::kTimeout)
        << st.ToString();
  }
  stop.store(true);
  scribbler.join();
}

// Publisher and subscribers as threads of one process (for ThreadSanitizer).
TEST(Channel, ThreadsOfOneProcessShareAChannel) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "threads"});
  const ChannelOptions o{.chunks = 4, .chunk_bytes = 4096, .queue_depth = 2};
  auto pub = ChannelPublisher::Create(*c, "chan/threads", o);
  ASSERT_TRUE(pub.ok());
  constexpr int kSubs = 2;
  constexpr uint64_t kCount = 2000;
  std::atomic<int> bad{0};
  std::vector<std::thread> subs;
  std::vector<Client> clients;
  for (int i = 0; i < kSubs; ++i) clients.push_back(*Client::Connect({b.socket(), "sub"}));
  std::atomic<int> joined{0};
  for (int i = 0; i < kSubs; ++i)
    subs.emplace_back([&, i] {
      auto sub = ChannelSubscriber::Join(clients[i], "chan/threads");
      if (!sub.ok()) {
        ++bad;
        return;
      }
      ++joined;
      for (uint64_t n = 1; n <= kCount; ++n) {
        auto got = sub->Receive(20000);
        if (!got.ok() || got->sequence != n || !Holds(*got) || !sub->Release(*got).ok()) {
          ++bad;
          return;
        }
      }
    });
  ASSERT_TRUE(pub->WaitForSubscribers(kSubs, 10000).ok());
  for (uint64_t n = 1; n <= kCount; ++n) {
    auto chunk = pub->Loan(64, 20000);
    ASSERT_TRUE(chunk.ok());
    Fill(*chunk, n, 64);
    ASSERT_TRUE(pub->Publish(*chunk, 20000).ok());
  }
  for (auto& t : subs) t.join();
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace membroker::testing
