// Named objects between real processes: publish, lookup (waiting in the
// broker), persistence past the publisher, events with a bounded queue.
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "readable.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

constexpr size_t kSize = 1 << 20;

// Maps a handle whole and returns the first byte and a checksum-free check
// that every byte equals `want`.
bool AllBytesAre(Client& c, const PhysicalHandle& h, char want) {
  auto m = MapWhole(c, h);
  if (!m.ok()) return false;
  for (size_t i = 0; i < h.size(); ++i)
    if (m->as<char>()[i] != want) return false;
  return true;
}

PhysicalHandle Filled(Client& c, char fill, WholeMapping* m) {
  auto h = *c.MallocPhysical(kSize);
  *m = *MapWhole(c, h);
  std::memset(m->data(), fill, kSize);
  return h;
}

TEST(Names, PublishedInOneProcessFoundInAnother) {
  BrokerProcess broker;
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    if (ch.Receive() != "look") return 9;
    auto c = *Client::Connect({broker.socket(), "consumer"});
    auto h = c.Lookup("tensors/a", 1000);
    if (!h.ok()) return 10;
    if (!h->read_only()) return 11;
    if (!AllBytesAre(c, *h, 'A')) return 12;
    if (c.Lookup("tensors/missing").code() != ErrorCode::kNotFound) return 13;
    if (c.Lookup("tensors/missing", 30).code() != ErrorCode::kTimeout) return 14;
    return 0;
  });
  ch.AsParent();
  auto c = *Client::Connect({broker.socket(), "producer"});
  WholeMapping m;
  auto h = Filled(c, 'A', &m);
  ASSERT_TRUE(c.Publish("tensors/a", h, kPublishReadOnly).ok());
  EXPECT_EQ(c.Publish("tensors/a", h).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(c.Publish("", h).code(), ErrorCode::kParamInvalid);
  ch.Send("look");
  EXPECT_EQ(WaitChild(child), 0);
  auto names = *c.ListNames("tensors/");
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].name, "tensors/a");
  EXPECT_EQ(names[0].size, kSize);
  EXPECT_TRUE(names[0].read_only);
  EXPECT_TRUE(c.Unpublish("tensors/a").ok());
  EXPECT_EQ(c.Unpublish("tensors/a").code(), ErrorCode::kNotFound);
  EXPECT_TRUE(c.ListNames("tensors/")->empty());
}

// A 7B model has ~300 tensors: every name comes back, in order, across the
// broker's pages of 128 (it answered the first 128 and nothing said so), and
// a prefix that sorts among other names still gets only its own.
TEST(Names, ListNamesGivesEveryNameAcrossPages) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "many"});
  auto h = *c.MallocPhysical(4096);
  std::vector<std::string> published;
  for (int i = 0; i < 300; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "model/layer-%03d", i);
    ASSERT_TRUE(c.Publish(name, h).ok());
    published.push_back(name);
  }
  ASSERT_TRUE(c.Publish("modem/other", h).ok());
  ASSERT_TRUE(c.Publish("mode", h).ok());
  auto names = c.ListNames("model/");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  ASSERT_EQ(names->size(), 300u);
  for (size_t i = 0; i < 300; ++i) EXPECT_EQ((*names)[i].name, published[i]);
  EXPECT_EQ(c.ListNames("")->size(), 302u);
  EXPECT_EQ(c.ListNames("modem/")->size(), 1u);
}

// A publisher that freed its handle (the name keeps the memory) and looks the
// name up again holds an import, charged and given back as one: the broker's
// tables agreed only until then (it was charged an import and later released
// the creation's charge a second time).
TEST(Names, TheMakerLookingUpWhatItFreedIsChargedAnImport) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "maker"});
  auto h = *c.MallocPhysical(4096);
  ASSERT_TRUE(c.Publish("names/again", h).ok());
  ASSERT_TRUE(c.FreePhysical(h).ok());
  ASSERT_TRUE(c.Ping().ok());  // the free (one-way) is served
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  auto again = c.Lookup("names/again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  ASSERT_TRUE(c.FreePhysical(*again).ok());
  ASSERT_TRUE(c.Unpublish("names/again").ok());
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u);
}

TEST(Names, LookupWaitsInTheBrokerForThePublisher) {
  BrokerProcess broker;
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    if (ch.Receive() != "go") return 9;
    auto c = *Client::Connect({broker.socket(), "late-publisher"});
    WholeMapping m;
    auto h = Filled(c, 'L', &m);
    if (!c.Publish("late", h).ok()) return 10;
    return ch.Receive() == "exit" ? 0 : 11;
  });
  ch.AsParent();
  auto c = *Client::Connect({broker.socket(), "waiter"});
  Result<PhysicalHandle> found = Status(ErrorCode::kInternal, "not run");
  std::thread looker([&] { found = c.Lookup("late", 10000); });
  ASSERT_EQ(broker.WaitForStat("waiters", 1), 1u);
  ch.Send("go");
  looker.join();
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_TRUE(AllBytesAre(c, *found, 'L'));
  EXPECT_EQ(broker.Stat("waiters"), 0u);
  ch.Send("exit");
  EXPECT_EQ(WaitChild(child), 0);
}

TEST(Names, PersistentObjectsOutliveTheirPublisherOthersDoNot) {
  BrokerProcess broker;
  pid_t child = ForkChild([&] {
    auto c = *Client::Connect({broker.socket(), "loader"});
    WholeMapping m1, m2;
    auto weights = Filled(c, 'W', &m1);
    auto scratch = Filled(c, 'S', &m2);
    if (!c.Publish("model/weights", weights, kPublishPersist | kPublishReadOnly).ok()) return 10;
    if (!c.Publish("model/scratch", scratch).ok()) return 11;
    return 0;  // exits: scratch goes, weights stay
  });
  ASSERT_EQ(WaitChild(child), 0);
  EXPECT_EQ(broker.WaitForStat("allocations_live", 1), 1u);
  auto c = *Client::Connect({broker.socket(), "server"});
  auto names = *c.ListNames("model/");
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].name, "model/weights");
  EXPECT_TRUE(names[0].persist);
  {
    auto w = c.Lookup("model/weights");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_TRUE(AllBytesAre(c, *w, 'W'));
  }
  EXPECT_TRUE(c.Unpublish("model/weights").ok());
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u) << "the last reference went with the name";
}

// A new version of a persistent object swapped in under its name: lookups
// from then on get it, a reader of the old version keeps its pages, the old
// version's memory goes when its last holder does, and another user cannot
// replace the name.
TEST(Names, ReplaceSwapsTheNameAndOldReadersKeepTheirPages) {
  BrokerProcess broker;
  auto loader = *Client::Connect({broker.socket(), "loader"});
  auto reader = *Client::Connect({broker.socket(), "reader"});
  {
    WholeMapping m1, m2;
    auto v1 = Filled(loader, '1', &m1);
    auto v2 = Filled(loader, '2', &m2);
    ASSERT_TRUE(loader.Publish("model/weights", v1, kPublishPersist | kPublishReadOnly).ok());
    auto old = reader.Lookup("model/weights");
    ASSERT_TRUE(old.ok());
    auto old_map = *MapWhole(reader, *old);
    EXPECT_EQ(loader.Publish("model/weights", v2, kPublishPersist).code(), ErrorCode::kAlreadyExists);
    Status st = loader.Publish("model/weights", v2, kPublishPersist | kPublishReadOnly | kPublishReplace);
    ASSERT_TRUE(st.ok()) << st.ToString();
    auto names = *reader.ListNames("model/");
    ASSERT_EQ(names.size(), 1u);
    EXPECT_TRUE(names[0].persist);
    auto fresh = reader.Lookup("model/weights");
    ASSERT_TRUE(fresh.ok());
    EXPECT_TRUE(AllBytesAre(reader, *fresh, '2'));
    for (size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(old_map.as<char>()[i], '1') << "the old reader lost its pages";
    // Replace onto a name nobody holds publishes it.
    ASSERT_TRUE(loader.Publish("model/new", v1, kPublishReplace).ok());
    EXPECT_TRUE(loader.Unpublish("model/new").ok());
    // Another user may not.
    if (::geteuid() == 0) {
      std::string s = broker.socket();
      pid_t other = ForkChild([&] {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 20;
        auto c = Client::Connect({s, "other-user"});
        if (!c.ok()) return 0;  // the socket's mode keeps other users out altogether: nothing to replace
        WholeMapping m;
        auto mine = Filled(*c, 'X', &m);
        return c->Publish("model/weights", mine, kPublishReplace).code() == ErrorCode::kPermissionDenied ? 0 : 21;
      });
      EXPECT_EQ(WaitChild(other), 0);
    }
  }
  // The loader's handles, the reader's imports and mappings are gone: the
  // named version is the one allocation left.
  EXPECT_EQ(broker.WaitForStat("allocations_live", 1), 1u);
  EXPECT_TRUE(reader.Unpublish("model/weights").ok());
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u);
}

TEST(Names, OperatorsListAndRemovePersistentObjects) {
  BrokerProcess broker;
  pid_t child = ForkChild([&] {
    auto c = *Client::Connect({broker.socket(), "loader"});
    auto h = *c.MallocPhysical(kSize);
    return c.Publish("weights", h, kPublishPersist).ok() ? 0 : 10;
  });
  ASSERT_EQ(WaitChild(child), 0);
  EXPECT_EQ(broker.WaitForStat("clients_connected", 0), 0u);
  std::string list = broker.Admin("list names");
  EXPECT_NE(list.find("weights"), std::string::npos) << list;
  EXPECT_EQ(broker.Stat("allocations_live"), 1u);
  EXPECT_NE(broker.Admin("unpublish weights").find("weights"), std::string::npos);
  EXPECT_EQ(broker.Stat("allocations_live"), 0u);
  EXPECT_EQ(broker.Stat("named_objects"), 0u);
  EXPECT_NE(broker.Admin("unpublish weights").find("no named object"), std::string::npos);
}

TEST(Names, SubscribersSeePublishUnpublishAndAHolderThatDied) {
  BrokerProcess broker;
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    if (ch.Receive() != "go") return 9;
    auto c = *Client::Connect({broker.socket(), "stage"});
    WholeMapping m;
    auto h = Filled(c, 'P', &m);
    if (!c.Publish("pipe/frame", h).ok()) return 10;
    ch.Send("published");
    ch.Receive();  // killed here
    return 11;
  });
  ch.AsParent();
  auto c = *Client::Connect({broker.socket(), "watcher"});
  EXPECT_EQ(c.WaitEvents(0).code(), ErrorCode::kParamInvalid) << "no subscription yet";
  ASSERT_TRUE(c.Subscribe("pipe/").ok());
  ch.Send("go");
  ASSERT_EQ(ch.Receive(), "published");
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitChild(child), 128 + SIGKILL);
  std::vector<NameEvent> seen;
  while (seen.size() < 3) {
    auto ev = c.WaitEvents(10000);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    ASSERT_FALSE(ev->events.empty()) << "timed out waiting for events";
    seen.insert(seen.end(), ev->events.begin(), ev->events.end());
  }
  EXPECT_EQ(seen[0].kind, NameEventKind::kPublished);
  EXPECT_EQ(seen[1].kind, NameEventKind::kHolderDied);
  EXPECT_EQ(seen[1].pid, child);
  EXPECT_EQ(seen[2].kind, NameEventKind::kUnpublished);
  for (const auto& e : seen) EXPECT_EQ(e.name, "pipe/frame");
  auto none = c.WaitEvents(20);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->events.empty());
}

TEST(Names, AFullEventQueueCountsWhatItDropped) {
  BrokerProcess broker;
  auto watcher = *Client::Connect({broker.socket(), "slow-watcher"});
  ASSERT_TRUE(watcher.Subscribe("").ok());
  auto c = *Client::Connect({broker.socket(), "busy"});
  auto h = *c.MallocPhysical(4096);
  for (int i = 0; i < 600; ++i) {  // 1200 events for a queue of 1024
    ASSERT_TRUE(c.Publish("n", h).ok());
    ASSERT_TRUE(c.Unpublish("n").ok());
  }
  size_t received = 0;
  uint64_t dropped = 0;
  for (;;) {
    auto ev = *watcher.WaitEvents(0);
    dropped = ev.dropped;
    if (ev.events.empty()) break;
    received += ev.events.size();
  }
  EXPECT_EQ(received, 1024u);
  EXPECT_EQ(dropped, 176u);
}

// The wake fd (an event loop's) becomes readable when an event is queued for
// this client and stays quiet otherwise; drained, then taken, it is quiet again.
TEST(Names, TheWakeFdWakesForQueuedEventsOnly) {
  BrokerProcess broker;
  auto watcher = *Client::Connect({broker.socket(), "watcher"});
  ASSERT_TRUE(watcher.Subscribe("w/").ok());
  auto fd = watcher.WakeFd();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(*watcher.WakeFd(), *fd) << "one fd for the life of the client";
  watcher.DrainWakeFd();
  EXPECT_FALSE(Readable(*fd, 0));
  auto maker = *Client::Connect({broker.socket(), "maker"});
  auto a = *maker.MallocPhysical(4096), b = *maker.MallocPhysical(4096);
  ASSERT_TRUE(maker.Publish("other/b", b).ok());  // answered after any wake it causes
  EXPECT_FALSE(Readable(*fd, 0)) << "woken for a name it did not subscribe to";
  ASSERT_TRUE(maker.Publish("w/a", a).ok());
  ASSERT_TRUE(Readable(*fd, 30'000));
  watcher.DrainWakeFd();
  auto got = watcher.WaitEvents(0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->events.size(), 1u);
  EXPECT_EQ(got->events[0].name, "w/a");
  EXPECT_FALSE(Readable(*fd, 0));
}

}  // namespace
}  // namespace membroker::testing
