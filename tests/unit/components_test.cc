// The broker's components on their own, without a Broker or a socket: each
// owns its state and keeps its rules (engine_registry.h, name_registry.h,
// waiters.h, server/sessions.h, memory/holdings.h, memory/worker_threads.h).
// Waiters, Holdings and WorkerThreads get a libuv loop of the test's own;
// nothing waits on time.
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine_registry.h"
#include "memory/holdings.h"
#include "memory/worker_threads.h"
#include "name_registry.h"
#include "server/sessions.h"
#include "waiters.h"

namespace membroker::broker {
namespace {

auto AllAlive() {
  return [](uint64_t) { return true; };
}

// ---- EngineRegistry ----------------------------------------------------------

TEST(EngineRegistry, EachPeerHoldsOneSlotAndTheSlotIsTheConnection) {
  EngineRegistry r;
  r.Add("decode", /*session=*/1, /*control=*/7, /*restoring=*/false);
  EXPECT_EQ(r.NameOf(1), "decode");
  ASSERT_NE(r.OwnedBy(1), nullptr);
  EXPECT_EQ(r.OwnedBy(2), nullptr);
  std::set<uint32_t> slots;
  for (uint64_t peer = 10; peer < 10 + kEngineSlots; ++peer) {
    auto slot = r.Connect(peer, "decode");
    ASSERT_TRUE(slot.ok()) << peer;
    EXPECT_TRUE(slots.insert(*slot).second) << "slot " << *slot << " given twice";
    EXPECT_EQ(r.SlotOf(peer, "decode"), *slot);
  }
  EXPECT_EQ(r.Connect(10, "decode").code(), ErrorCode::kAlreadyConnected);
  EXPECT_EQ(r.Connect(999, "decode").code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(r.Connect(10, "nobody").code(), ErrorCode::kNotConnected);
  // A slot freed by a disconnect is given again.
  const uint32_t freed = *r.SlotOf(12, "decode");
  EXPECT_TRUE(r.Disconnect(12, "decode"));
  EXPECT_FALSE(r.Disconnect(12, "decode"));
  EXPECT_FALSE(r.SlotOf(12, "decode").has_value());
  EXPECT_EQ(*r.Connect(999, "decode"), freed);
  EXPECT_TRUE(r.Check(AllAlive()).ok());
}

TEST(EngineRegistry, ASessionsEndTakesItsEngineAndItsConnections) {
  EngineRegistry r;
  r.Add("prefill", 1, 7, false);
  r.Add("decode", 2, 8, false);
  ASSERT_TRUE(r.Connect(1, "decode").ok());  // prefill's client connects to decode
  ASSERT_TRUE(r.Connect(2, "prefill").ok());
  r.OnSessionEnd(1);
  EXPECT_EQ(r.Find("prefill"), nullptr);
  EXPECT_EQ(r.OwnedBy(1), nullptr);
  EXPECT_FALSE(r.SlotOf(1, "decode").has_value());
  EXPECT_TRUE(r.Find("decode")->peers.empty());
  EXPECT_TRUE(r.Check([](uint64_t id) { return id != 1; }).ok());
  // A peer left behind by a session that ended is a broken table.
  ASSERT_TRUE(r.Connect(3, "decode").ok());
  EXPECT_EQ(r.Check([](uint64_t id) { return id != 3; }).code(), ErrorCode::kInternal);
}

TEST(EngineRegistry, RegionsGetFreshIdsAndNotifiesAreBounded) {
  EngineRegistry r;
  Engine& e = r.Add("decode", 1, 7, false);
  const uint64_t a = r.AddRegion(e, {0, 0x1000, 0x1000, 0, 0, false, ""});
  const uint64_t b = r.AddRegion(e, {0, 0x4000, 0x1000, 0, 0, false, "kv"});
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(e.regions.at(0x4000).id, b);
  for (size_t i = 0; i < kMaxQueuedNotifies; ++i) ASSERT_TRUE(r.QueueNotify(e, "decode", {"p", "n", "m"}).ok());
  EXPECT_EQ(r.QueueNotify(e, "decode", {"p", "n", "m"}).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(e.notifies.size(), kMaxQueuedNotifies);
  EXPECT_EQ(e.notifies_dropped, 1u);
}

// ---- NameRegistry ------------------------------------------------------------

NamedEntry Entry(uint64_t allocation, uint64_t publisher, bool persist = false) {
  NamedEntry e;
  e.allocation = allocation;
  e.publisher_session = publisher;
  e.persist = persist;
  return e;
}

TEST(NameRegistry, ANameIsPublishedOnceAndListedByPrefix) {
  NameRegistry n;
  ASSERT_TRUE(n.Add("model/a", Entry(1, 1)).ok());
  ASSERT_TRUE(n.Add("model/b", Entry(2, 1)).ok());
  ASSERT_TRUE(n.Add("other", Entry(3, 1)).ok());
  EXPECT_EQ(n.Add("model/a", Entry(4, 2)).status().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(n.Find("model/a")->allocation, 1u);
  bool truncated = true;
  auto all = n.List("model/", "", 10, &truncated);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(all[0].first, "model/a");
  auto one = n.List("model/", "", 1, &truncated);
  EXPECT_EQ(one.size(), 1u);
  EXPECT_TRUE(truncated);
  // The next page starts after the last name of the one before.
  auto next = n.List("model/", one[0].first, 10, &truncated);
  ASSERT_FALSE(next.empty());
  EXPECT_GT(next[0].first, one[0].first);
  EXPECT_EQ(next.size() + 1, all.size());
  EXPECT_EQ(n.Remove("model/a"), 1u);
  EXPECT_EQ(n.Find("model/a"), nullptr);
}

TEST(NameRegistry, EventsGoToMatchingSubscribersWithinTheirQueue) {
  NameRegistry n;
  ASSERT_TRUE(n.Subscribe(1, "model/").ok());
  ASSERT_TRUE(n.Subscribe(2, "").ok());  // every name
  EXPECT_EQ(n.Post({ipc::NameEventKind::kPublished, "other", 1, 0, ""}), std::vector<uint64_t>{2});
  EXPECT_EQ(n.Post({ipc::NameEventKind::kPublished, "model/x", 2, 0, ""}), (std::vector<uint64_t>{1, 2}));
  // Another host's event (it names its host) goes to cluster subscriptions only.
  ASSERT_TRUE(n.Subscribe(4, "model/", /*cluster=*/true).ok());
  EXPECT_EQ(n.Post({ipc::NameEventKind::kHostGone, "model/x", 0, 0, "gpu-07"}), std::vector<uint64_t>{4});
  EXPECT_EQ(n.TakeEvents(4).events.size(), 1u);
  EXPECT_TRUE(n.HasEvents(1));
  ipc::EventsReply r = n.TakeEvents(1);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].name, "model/x");
  EXPECT_FALSE(n.HasEvents(1));
  // A full queue drops and counts what it cannot hold.
  for (size_t i = 0; i < kMaxQueuedEvents + 5; ++i) n.Post({ipc::NameEventKind::kPublished, "model/y", 3, 0, ""});
  r = n.TakeEvents(1);
  EXPECT_EQ(r.dropped, 5u);
  EXPECT_LE(r.events.size(), ipc::kMaxEventsPerReply);
  for (size_t i = 1; i < kMaxSubscriptionsPerClient; ++i) ASSERT_TRUE(n.Subscribe(3, "p").ok());
  ASSERT_TRUE(n.Subscribe(3, "p").ok());
  EXPECT_EQ(n.Subscribe(3, "p").code(), ErrorCode::kResourceExhausted);
}

TEST(NameRegistry, APublishersEndUnpublishesAllButPersistentNames) {
  NameRegistry n;
  ASSERT_TRUE(n.Add("temp", Entry(1, 7)).ok());
  ASSERT_TRUE(n.Add("weights", Entry(2, 7, /*persist=*/true)).ok());
  ASSERT_TRUE(n.Add("theirs", Entry(3, 8)).ok());
  ASSERT_TRUE(n.Subscribe(7, "").ok());
  EXPECT_EQ(n.OnSessionEnd(7), std::vector<std::string>{"temp"});  // the caller unpublishes it
  EXPECT_EQ(n.Find("weights")->publisher_session, 0u);            // outlives its publisher
  EXPECT_EQ(n.Find("theirs")->publisher_session, 8u);
  EXPECT_FALSE(n.Subscribed(7));
  n.Remove("temp");
  EXPECT_TRUE(n.Check([](uint64_t id) { return id != 7; }).ok());
  EXPECT_EQ(n.Check([](uint64_t id) { return id != 8; }).code(), ErrorCode::kInternal);
}

// ---- Waiters -----------------------------------------------------------------

class WaitersTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    waiters_.CloseAll();
    uv_run(&loop_, UV_RUN_DEFAULT);  // the timers' close callbacks
    ASSERT_EQ(uv_loop_close(&loop_), 0);
  }
  uv_loop_t loop_{};
  std::vector<Waiter> timed_out_;
  Waiters waiters_{&loop_, [this](const Waiter& w) { timed_out_.push_back(w); }};
};

TEST_F(WaitersTest, WaitersAreTakenByWhatTheyWaitForOrTheirSession) {
  ASSERT_TRUE(waiters_.Add({Waiter::Kind::kLookup, 1, 100, "a"}, 60000).ok());
  ASSERT_TRUE(waiters_.Add({Waiter::Kind::kLookup, 2, 200, "a"}, 60000).ok());
  ASSERT_TRUE(waiters_.Add({Waiter::Kind::kConnect, 1, 101, "a"}, 60000).ok());
  ASSERT_TRUE(waiters_.Add({Waiter::Kind::kEvents, 1, 102, ""}, 60000).ok());
  EXPECT_EQ(waiters_.CountFor(1), 3u);
  auto lookups = waiters_.Take(Waiter::Kind::kLookup, "a");
  ASSERT_EQ(lookups.size(), 2u);
  EXPECT_EQ(lookups[0].request_id, 100u);  // in the order they came
  EXPECT_EQ(lookups[1].request_id, 200u);
  auto events = waiters_.TakeEvents(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].request_id, 102u);
  waiters_.OnSessionEnd(1);
  EXPECT_TRUE(waiters_.empty());
}

TEST_F(WaitersTest, LimitsAndTimeouts) {
  EXPECT_EQ(waiters_.Add({Waiter::Kind::kLookup, 1, 1, "x"}, kMaxWaitMs + 1).code(), ErrorCode::kParamInvalid);
  for (size_t i = 0; i < kMaxWaitersPerClient; ++i)
    ASSERT_TRUE(waiters_.Add({Waiter::Kind::kLookup, 1, i, "x"}, 60000).ok());
  EXPECT_EQ(waiters_.Add({Waiter::Kind::kLookup, 1, 99, "x"}, 60000).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(waiters_.Check([](uint64_t id) { return id != 1; }).code(), ErrorCode::kInternal);
  waiters_.OnSessionEnd(1);
  // A timeout answers the waiter through the callback and removes it.
  ASSERT_TRUE(waiters_.Add({Waiter::Kind::kConnect, 2, 7, "remote"}, 0).ok());
  uv_run(&loop_, UV_RUN_DEFAULT);  // returns once the timer fired and closed
  ASSERT_EQ(timed_out_.size(), 1u);
  EXPECT_EQ(timed_out_[0].key, "remote");
  EXPECT_TRUE(waiters_.empty());
}

// ---- Sessions ----------------------------------------------------------------

TEST(Sessions, IdsHandshakesAndQueuedBytes) {
  Sessions sessions;
  Session a, b;
  sessions.Add(&a);
  sessions.Add(&b);
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(sessions.Handshaking(), 2u);
  EXPECT_EQ(sessions.OldestHandshaking(), &a);
  sessions.HelloDone(a);
  EXPECT_EQ(sessions.OldestHandshaking(), &b);
  EXPECT_EQ(sessions.Handshaken(), 1u);
  sessions.Queued(a, OutFrame{std::vector<uint8_t>(100), {}});
  sessions.Queued(b, OutFrame{std::vector<uint8_t>(50), {}});
  EXPECT_EQ(sessions.queued_bytes(), 150u);
  sessions.Dequeued(a);
  EXPECT_EQ(sessions.queued_bytes(), 50u);
  EXPECT_TRUE(sessions.Check().ok());
  b.hello_done = true;  // said hello behind Sessions' back
  EXPECT_EQ(sessions.Check().code(), ErrorCode::kInternal);
  b.hello_done = false;
  sessions.Remove(b);
  EXPECT_EQ(sessions.queued_bytes(), 0u);
  EXPECT_EQ(sessions.Find(b.id), nullptr);
  a.closing = true;
  EXPECT_EQ(sessions.Find(a.id), nullptr);  // a closing session is not found
  sessions.CountEnd(CloseReason::kCrash);
  EXPECT_EQ(sessions.Ends(CloseReason::kCrash), 1u);
  EXPECT_STREQ(CloseReasonName(CloseReason::kCrash), "crash");
  EXPECT_STREQ(CloseReasonName(CloseReason::kRefused), "refused");
}

// ---- WorkerThreads -----------------------------------------------------------

TEST(WorkerThreads, WorkRunsOffTheLoopAtNice10AndCompletionsRunOnTheLoop) {
  uv_loop_t loop{};
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    WorkerThreads threads(&loop);
    EXPECT_EQ(threads.Start(0, 10).code(), ErrorCode::kParamInvalid);
    ASSERT_TRUE(threads.Start(4, 10).ok());
    using Lane = WorkerThreads::Lane;
    const std::thread::id loop_thread = std::this_thread::get_id();
    std::atomic<int> off_loop{0}, niced{0};
    std::vector<int> completed;
    bool completed_on_loop = true;
    auto work = [&] {
      if (std::this_thread::get_id() != loop_thread) ++off_loop;
      if (::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())) >= 10) ++niced;
    };
    auto complete = [&](int i) {
      completed_on_loop = completed_on_loop && std::this_thread::get_id() == loop_thread;
      completed.push_back(i);
    };
    // A completion may queue more work, and may close the threads.
    threads.Submit(Lane::kRequest, work, [&] {
      complete(0);
      threads.Submit(Lane::kBackground, work, [&] {
        complete(1);
        threads.Close();
      });
    });
    uv_run(&loop, UV_RUN_DEFAULT);  // returns once closed and the handle is gone
    EXPECT_EQ(completed, (std::vector<int>{0, 1}));
    EXPECT_TRUE(completed_on_loop);
    EXPECT_EQ(off_loop.load(), 2);
    EXPECT_EQ(niced.load(), 2);
    EXPECT_EQ(threads.outstanding(), 0u);
  }
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(WorkerThreads, RequestWorkGoesBeforeQueuedBackgroundWork) {
  uv_loop_t loop{};
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    using Lane = WorkerThreads::Lane;
    WorkerThreads threads(&loop);
    ASSERT_TRUE(threads.Start(1, 10).ok());
    std::promise<void> gate;
    std::vector<std::string> ran;  // by the one thread; read after it is joined
    threads.Submit(
        Lane::kBackground, [&] { gate.get_future().wait(); }, [] {});  // holds the thread
    threads.Submit(
        Lane::kBackground, [&] { ran.push_back("b1"); }, [] {});
    threads.Submit(
        Lane::kRequest, [&] { ran.push_back("r1"); }, [] {});
    threads.Submit(
        Lane::kBackground, [&] { ran.push_back("b2"); }, [] {});
    threads.Submit(
        Lane::kRequest, [&] { ran.push_back("r2"); }, [&] { threads.Close(); });
    gate.set_value();
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(ran, (std::vector<std::string>{"r1", "r2", "b1", "b2"}));
  }
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(WorkerThreads, WorkQueuedWhenTheyCloseStillRunsAndCompletes) {
  uv_loop_t loop{};
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    WorkerThreads threads(&loop);
    ASSERT_TRUE(threads.Start(2, 19).ok());
    std::atomic<int> worked{0}, at_19{0};
    int completed = 0;
    for (int i = 0; i < 200; ++i)
      threads.Submit(
          i % 2 ? WorkerThreads::Lane::kRequest : WorkerThreads::Lane::kBackground,
          [&] {
            ++worked;
            if (::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())) == 19) ++at_19;
          },
          [&] { ++completed; });
    threads.Close();
    EXPECT_FALSE(threads.open());
    uv_run(&loop, UV_RUN_DEFAULT);
    EXPECT_EQ(worked.load(), 200);
    EXPECT_EQ(at_19.load(), 200);
    EXPECT_EQ(completed, 200);
    EXPECT_EQ(threads.outstanding(), 0u);
  }
  EXPECT_EQ(uv_loop_close(&loop), 0);  // nothing of the threads is left in the loop
}

// ---- Holdings ----------------------------------------------------------------

struct RecordingJournal : MemoryJournal {
  void Entered(Allocation& a) override { entered.push_back(a.id); }
  void Left(const Allocation& a) override { left.push_back(a.id); }
  void ExportsChanged() override { ++exports_changed; }
  std::vector<uint64_t> entered, left;
  int exports_changed = 0;
};

class HoldingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    ASSERT_TRUE(workers_.Init().ok());
    holdings_.limits().max_bytes = 1ull << 30;
    holdings_.limits().max_pinned_bytes = 1ull << 20;
    creator_.id = 1;
    creator_.cred.uid = 1000;
    importer_.id = 2;
    importer_.cred.uid = 1000;
  }
  void TearDown() override {
    workers_.Stop();
    uv_run(&loop_, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&loop_), 0);
  }
  Allocation& Create(Session& s, uint64_t size) {
    const Usage charged{.bytes = size, .allocations = 1};
    EXPECT_TRUE(holdings_.Charge(s, charged).ok());
    auto mem = MemfdBackend().Create({"test", size, ipc::PagePolicy::kNormalOnly, false});
    EXPECT_TRUE(mem.ok());
    return holdings_.Insert(s, std::move(*mem), ipc::PagePolicy::kNormalOnly, false, charged, 0, -1);
  }
  uv_loop_t loop_{};
  Pools pools_{MemfdBackend(), {}, [](const std::string& w) { return w; }};
  Workers workers_{&loop_, MemfdBackend(), pools_, 0};
  RecordingJournal journal_;
  Holdings holdings_{MemfdBackend(), pools_, workers_, journal_, AddressWindow(0x400000000000ull, 1ull << 40),
                     1ull << 20};
  Session creator_, importer_;
};

TEST_F(HoldingsTest, AnAllocationLivesWhileAnyoneHoldsItAndIsSettledWhenItGoes) {
  Allocation& a = Create(creator_, 8192);
  const uint64_t id = a.id;
  EXPECT_EQ(journal_.entered, std::vector<uint64_t>{id});
  EXPECT_EQ(creator_.usage.bytes, 8192u);
  ASSERT_TRUE(holdings_.Grant(importer_, a, /*read_only=*/true, Holding::kLedger).ok());
  EXPECT_EQ(holdings_.Grant(importer_, a, true, Holding::kLedger).code(), ErrorCode::kAlreadyExists);
  ASSERT_TRUE(holdings_.Grant(importer_, a, false, Holding::kEngine).ok());  // held apart from its ledger
  EXPECT_TRUE(importer_.ledger.ReadOnly(id));
  EXPECT_EQ(importer_.usage.imports, 2u);
  EXPECT_EQ(holdings_.Find(id)->holders, 3u);

  EXPECT_TRUE(holdings_.Release(creator_, id, Holding::kLedger));
  EXPECT_FALSE(holdings_.Release(creator_, id, Holding::kLedger));  // held no more
  EXPECT_EQ(creator_.usage.bytes, 0u);
  EXPECT_EQ(holdings_.accounting().total().bytes, 8192u);  // its uid pays while it lives
  EXPECT_EQ(holdings_.ReleaseAll(importer_, Holding::kEngine), 1u);
  EXPECT_NE(holdings_.Find(id), nullptr);
  EXPECT_TRUE(journal_.left.empty());
  EXPECT_EQ(holdings_.ReleaseAll(importer_, Holding::kLedger), 1u);
  EXPECT_EQ(holdings_.Find(id), nullptr);
  EXPECT_EQ(journal_.left, std::vector<uint64_t>{id});
  const Usage& total = holdings_.accounting().total();
  EXPECT_EQ(total.bytes + total.allocations + total.imports + total.pinned_bytes, 0u);
  EXPECT_EQ(importer_.usage.imports, 0u);
}

TEST_F(HoldingsTest, ACheckThatFailsChargesNothing) {
  holdings_.limits().client_limits.imports = 0;
  Allocation& a = Create(creator_, 4096);
  EXPECT_EQ(holdings_.Grant(importer_, a, false, Holding::kLedger).code(), ErrorCode::kQuotaExceeded);
  EXPECT_FALSE(importer_.ledger.Holds(a.id));
  EXPECT_EQ(importer_.usage.imports, 0u);
  EXPECT_EQ(holdings_.Find(a.id)->holders, 1u);
  EXPECT_EQ(holdings_.Charge(creator_, Usage{.pinned_bytes = 2ull << 20}).code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(creator_.usage.pinned_bytes, 0u);
}

TEST_F(HoldingsTest, ExportsAreJournaledAndFreedPagesGoToAWorkerWhenGathered) {
  Allocation& a = Create(creator_, 4096);
  const uint64_t id = a.id;
  ASSERT_TRUE(holdings_.Export(id, creator_, ipc::kExportNoPidCheck).ok());
  EXPECT_EQ(journal_.exports_changed, 1u);
  ReturnBatch batch;
  ReturnBatch* outer = holdings_.GatherReturns(&batch);
  EXPECT_EQ(outer, nullptr);
  EXPECT_TRUE(holdings_.Release(creator_, id, Holding::kLedger));
  holdings_.GatherReturns(outer);
  ASSERT_EQ(batch.memories.size(), 1u);  // gathered, not closed yet
  EXPECT_EQ(batch.bytes, 4096u);
  EXPECT_EQ(holdings_.table().export_count(), 0u);  // the token went with it
}

}  // namespace
}  // namespace membroker::broker
