// KV-cache stores between real processes (docs/KV.md): put in one process and
// get in another, writers of one key, SIGKILL while reserving and while
// leasing, leases under eviction, stale references, and the kernel's refusal
// of any write to a sealed block.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "raw_client.h"
#include "membroker/client.h"
#include "membroker/kv_store.h"

namespace membroker::testing {
namespace {

constexpr size_t kBlock = 4096;

std::string Key(int i) { return "prefix-hash-" + std::to_string(i); }

// The bytes a block of `key` holds: derived from the key, so any reader can
// check every byte it got against the key it asked for.
std::vector<std::byte> BytesOf(const std::string& key, size_t n = kBlock) {
  std::vector<std::byte> out(n);
  uint64_t x = std::hash<std::string>{}(key) | 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

bool Holds(std::span<const std::byte> got, const std::string& key) {
  auto want = BytesOf(key, got.size());
  return !got.empty() && std::memcmp(got.data(), want.data(), got.size()) == 0;
}

std::vector<std::string> Keys(int first, int count) {
  std::vector<std::string> out;
  for (int i = first; i < first + count; ++i) out.push_back(Key(i));
  return out;
}

std::vector<ErrorCode> PutAll(KvStore& store, const std::vector<std::string>& keys) {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> values;
  for (const auto& k : keys) bytes.push_back(BytesOf(k));
  for (const auto& b : bytes) values.emplace_back(b);
  auto r = store.Put(keys, values);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<ErrorCode>{};
}

KvStore Made(Client& c, const std::string& name, size_t blocks, KvEviction eviction = KvEviction::kS3Fifo) {
  auto s = KvStore::Create(c, name, {.block_size = kBlock, .capacity = blocks * kBlock, .eviction = eviction});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : KvStore();
}

TEST(KvStore, PutInOneProcessGetInAnother) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "model/kv", 64);
  ASSERT_EQ(store.blocks(), 64u);
  auto keys = Keys(0, 10);
  for (ErrorCode code : PutAll(store, keys)) EXPECT_EQ(code, ErrorCode::kOk);
  // Written once: the same keys again are reported, not written twice.
  for (ErrorCode code : PutAll(store, keys)) EXPECT_EQ(code, ErrorCode::kAlreadyExists);

  pid_t child = ForkChild([&] {
    auto r = Client::Connect({broker.socket(), "reader"});
    if (!r.ok()) return 10;
    auto s = KvStore::Open(*r, "model/kv");
    if (!s.ok() || s->block_size() != kBlock) return 11;
    // A prompt whose first 10 blocks are cached and 5 are not.
    auto prompt = Keys(0, 15);
    if (*s->PrefixHits(prompt) != 10) return 12;
    auto exists = *s->Exists(Keys(8, 4));
    if (exists != std::vector<bool>{true, true, false, false}) return 13;
    auto got = s->Get(prompt);
    if (!got.ok() || got->leading() != 10) return 14;
    for (size_t i = 0; i < 10; ++i)
      if (!Holds(got->data(i), prompt[i])) return 15;
    for (size_t i = 10; i < 15; ++i)
      if (got->found(i)) return 16;
    return 0;
  });
  EXPECT_EQ(WaitChild(child), 0);
  EXPECT_EQ(broker.Stat("kv_blocks"), 10u);
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);  // the reader's leases ended with it
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// Two writers of one key: the second hears BUSY while the first writes, and
// ALREADY_EXISTS once it sealed; a reader never sees the unsealed block.
TEST(KvStore, OneWriterPerKey) {
  BrokerProcess broker;
  auto a = *Client::Connect({broker.socket(), "a"});
  auto b = *Client::Connect({broker.socket(), "b"});
  KvStore sa = Made(a, "kv", 8);
  KvStore sb = *KvStore::Open(b, "kv");
  std::vector<std::string> key{Key(1)};
  auto put = *sa.Reserve(key);
  ASSERT_EQ(put.status(0), ErrorCode::kOk);
  auto bytes = BytesOf(key[0]);
  std::memcpy(put.data(0).data(), bytes.data(), kBlock);
  EXPECT_EQ(sb.Reserve(key)->status(0), ErrorCode::kBusy);
  EXPECT_FALSE(sb.Get(key)->found(0));
  EXPECT_EQ(*sb.PrefixHits(key), 0u);
  ASSERT_TRUE(sa.Seal(put).ok());
  EXPECT_EQ(put.status(0), ErrorCode::kOk);
  EXPECT_TRUE(put.data(0).empty());  // sealed: nothing left to write
  EXPECT_EQ(sb.Reserve(key)->status(0), ErrorCode::kAlreadyExists);
  auto got = *sb.Get(key);
  EXPECT_TRUE(Holds(got.data(0), key[0]));
  // Aborted: the key is free to write again.
  auto other = *sa.Reserve(Keys(2, 1));
  ASSERT_TRUE(sa.Abort(other).ok());
  EXPECT_EQ(broker.WaitForStat("kv_writing", 0), 0u);
  EXPECT_EQ(sb.Reserve(Keys(2, 1))->status(0), ErrorCode::kOk);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// SIGKILL at each step of a put and a get: a writer killed before sealing
// leaves nothing visible and nothing held; a reader killed holding leases
// leaves its blocks evictable again.
TEST(KvStore, NothingOutlivesAKilledProcess) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "survivor"});
  KvStore store = Made(c, "kv", 16);
  PutAll(store, Keys(100, 4));
  for (const char* step : {"reserved", "written", "leased", "read"}) {
    SCOPED_TRACE(step);
    Channel ch;
    pid_t child = ForkChild([&] {
      ch.AsChild();
      auto r = Client::Connect({broker.socket(), "doomed"});
      if (!r.ok()) return 10;
      auto s = KvStore::Open(*r, "kv");
      if (!s.ok()) return 11;
      const std::string what = step;
      KvPut put;
      KvLeases got;
      if (what == "reserved" || what == "written") {
        auto r = s->Reserve(Keys(0, 8));
        if (!r.ok()) return 12;
        put = std::move(*r);
        if (what == "written")
          for (size_t i = 0; i < put.size(); ++i) std::memset(put.data(i).data(), 0x5a, kBlock);
      } else {
        auto r = s->Get(Keys(100, 4));
        if (!r.ok() || r->leading() != 4) return 13;
        got = std::move(*r);
        if (what == "read" && !Holds(got.data(3), Key(103))) return 14;
      }
      ch.Send("ready");
      ch.Receive();  // killed here, holding `put` or `got`
      return 0;
    });
    ch.AsParent();
    ASSERT_EQ(ch.Receive(), "ready");
    EXPECT_GT(broker.Stat("kv_writing") + broker.Stat("kv_leases"), 0u);
    ::kill(child, SIGKILL);
    EXPECT_EQ(WaitChild(child), 128 + SIGKILL);
    EXPECT_EQ(broker.WaitForStat("clients_connected", 1), 1u);
    EXPECT_EQ(broker.Stat("kv_writing"), 0u);
    EXPECT_EQ(broker.Stat("kv_leases"), 0u);
    EXPECT_EQ(*store.PrefixHits(Keys(0, 8)), 0u);  // nothing unsealed became visible
    EXPECT_EQ(*store.PrefixHits(Keys(100, 4)), 4u);
    EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  }
  // The killed writers' keys are free to write.
  for (ErrorCode code : PutAll(store, Keys(0, 8))) EXPECT_EQ(code, ErrorCode::kOk);
}

// A store far over its capacity: the leased block stays (and reads back
// right), unleased ones are evicted; with every block leased a reservation
// is refused, not served by reusing a leased block.
TEST(KvStore, LeasedBlocksAreNeverEvicted) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "engine"});
  for (KvEviction eviction : {KvEviction::kS3Fifo, KvEviction::kLru}) {
    const std::string name = eviction == KvEviction::kLru ? "lru" : "s3fifo";
    SCOPED_TRACE(name);
    KvStore store = Made(c, name, 20, eviction);
    PutAll(store, Keys(0, 1));
    auto leased = *store.Get(Keys(0, 1));
    ASSERT_TRUE(leased.found(0));
    for (int i = 1; i < 200; i += 10)
      for (ErrorCode code : PutAll(store, Keys(i, 10))) EXPECT_EQ(code, ErrorCode::kOk);
    EXPECT_TRUE(Holds(leased.data(0), Key(0)));
    EXPECT_EQ(*store.PrefixHits(Keys(0, 1)), 1u);
    auto present = *store.Exists(Keys(1, 199));
    EXPECT_LT(std::count(present.begin(), present.end(), true), 20);
    EXPECT_GT(std::count(present.begin(), present.end(), true), 0);

    // Lease everything present, then ask for more room than is left.
    std::vector<std::string> all = Keys(0, 200);
    auto everything = *store.Get(all);
    size_t held = 0;
    for (size_t i = 0; i < everything.size(); ++i) held += everything.found(i);
    auto put = *store.Reserve(Keys(1000, 25));
    size_t reserved = 0, exhausted = 0;
    for (size_t i = 0; i < put.size(); ++i) {
      reserved += put.status(i) == ErrorCode::kOk;
      exhausted += put.status(i) == ErrorCode::kResourceExhausted;
    }
    EXPECT_EQ(reserved, 20 - held);
    EXPECT_EQ(exhausted, 25 - reserved);
    ASSERT_TRUE(store.Abort(put).ok());
    for (size_t i = 0; i < everything.size(); ++i)
      if (everything.found(i)) {
        EXPECT_TRUE(Holds(everything.data(i), all[i]));
      }
    everything.Release();
    leased.Release();
    EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);
    EXPECT_EQ(broker.WaitForStat("kv_writing", 0), 0u);
    ASSERT_TRUE(KvStore::Drop(c, name).ok());
  }
  EXPECT_GT(broker.Stat("kv_evictions"), 0u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// The wire, by hand: a reference to a block evicted and reused is STALE;
// another client's reservation cannot be sealed; a seal's bytes come from an
// allocation this client holds, inside it.
TEST(KvStore, ReferencesAreCheckedByGeneration) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "owner"});
  KvStore store = Made(c, "kv", 4);
  RawClient raw(broker.socket());
  raw.Hello();
  auto call = [&](ipc::Message m) {
    EXPECT_TRUE(raw.SendMsg(std::move(m)).ok());
    return raw.Next();
  };
  auto blocks = [](const Result<ipc::Envelope>& r) {
    auto* m = r.ok() ? std::get_if<ipc::KvBlocksReply>(&r->body) : nullptr;
    return m ? m->blocks : std::vector<ipc::KvBlock>{};
  };
  auto reserved = blocks(call(ipc::KvReserveRequest{store.id(), {"raw-key"}}));
  ASSERT_EQ(reserved.size(), 1u);
  ASSERT_EQ(reserved[0].code, ErrorCode::kOk);
  const ipc::KvRef ref{reserved[0].slot, reserved[0].generation};
  // Sealed by another client: not its reservation.
  auto alloc = *c.MallocPhysical(kBlock);
  EXPECT_EQ(ErrorOf(call(ipc::KvAbortRequest{store.id(), {{ref.slot, ref.generation + 1}}})), ErrorCode::kStale);
  // The raw client seals from an allocation it does not hold, then out of range.
  auto sealed = blocks(call(ipc::KvSealRequest{store.id(), {{ref.slot, ref.generation, alloc.id(), 0, kBlock}}}));
  ASSERT_EQ(sealed.size(), 1u);
  EXPECT_EQ(sealed[0].code, ErrorCode::kInvalidHandle);
  EXPECT_EQ(ErrorOf(call(ipc::KvAbortRequest{store.id(), {ref}})), ErrorCode::kOk);
  // The slot goes to other keys: the old reference is STALE everywhere.
  PutAll(store, Keys(0, 4));
  EXPECT_EQ(ErrorOf(call(ipc::KvReleaseRequest{store.id(), {ref}})), ErrorCode::kStale);
  EXPECT_EQ(ErrorOf(call(ipc::KvAbortRequest{store.id(), {ref}})), ErrorCode::kStale);
  // Unknown store, an out-of-range slab, a lease this client does not hold.
  EXPECT_EQ(ErrorOf(call(ipc::KvGetRequest{store.id() + 100, {"k"}, true})), ErrorCode::kInvalidHandle);
  EXPECT_EQ(ErrorOf(call(ipc::KvSlabRequest{store.id(), 7})), ErrorCode::kParamInvalid);
  auto got = blocks(call(ipc::KvGetRequest{store.id(), {Key(0)}, false}));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(ErrorOf(call(ipc::KvReleaseRequest{store.id(), {{got[0].slot, got[0].generation}}})),
            ErrorCode::kInvalidHandle);
  EXPECT_GE(broker.Stat("kv_stale"), 3u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// Immutability is the kernel's: the slab fd a reader gets cannot be mapped
// writable, nor can a read-write fd reopened from it through /proc, nor can a
// read-only mapping be made writable, nor the file be written or resized.
TEST(KvStore, NoClientCanWriteASealedBlock) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "owner"});
  KvStore store = Made(c, "kv", 4);
  PutAll(store, Keys(0, 1));
  RawClient raw(broker.socket());
  raw.Hello();
  ASSERT_TRUE(raw.SendMsg(ipc::KvSlabRequest{store.id(), 0}).ok());
  ipc::Frame frame;
  auto r = raw.Next(&frame);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(std::holds_alternative<ipc::KvSlabReply>(r->body));
  ASSERT_EQ(frame.fds.size(), 1u);
  const int fd = frame.fds[0].get();
  const size_t size = std::get<ipc::KvSlabReply>(r->body).size;
  EXPECT_EQ(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {  // (memfds may be reopened read-write: the seal is what stops it)
    EXPECT_EQ(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    char byte = 1;
    EXPECT_EQ(::pwrite(rw, &byte, 1, 0), -1);
    EXPECT_EQ(::ftruncate(rw, 0), -1);
    ::close(rw);
  }
  void* ro = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(::mprotect(ro, size, PROT_READ | PROT_WRITE), -1);
  auto got = *store.Get(Keys(0, 1));
  EXPECT_TRUE(Holds(got.data(0), Key(0)));
  ::munmap(ro, size);
}

// One Client, four threads with a KvStore each (and one KvStore shared by two
// more, taking turns through its own lock): overlapping keys put and read at
// once; every block read holds its key's bytes. Run under TSan too.
TEST(KvStore, ThreadsShareAStore) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "threads"});
  KvStore first = Made(c, "kv", 64);
  std::atomic<int> wrong{0}, failed{0};
  auto work = [&](KvStore store, int t) {
    for (int round = 0; round < 30; ++round) {
      auto keys = Keys((round * 7 + t) % 40, 8);
      auto codes = PutAll(store, keys);
      for (ErrorCode code : codes)
        if (code != ErrorCode::kOk && code != ErrorCode::kAlreadyExists && code != ErrorCode::kBusy) ++failed;
      auto got = store.Get(keys);
      if (!got.ok()) {
        ++failed;
        continue;
      }
      for (size_t i = 0; i < got->size(); ++i)
        if (got->found(i) && !Holds(got->data(i), keys[i])) ++wrong;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, *KvStore::Open(c, "kv"), t);
  threads.emplace_back(work, first, 4);
  threads.emplace_back(work, first, 5);
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);
  EXPECT_EQ(broker.WaitForStat("kv_writing", 0), 0u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// A batch of 1 MiB or more is copied on a worker thread; every byte still
// lands in its block, and another process reads it.
TEST(KvStore, ALargeSealIsCopiedOnAWorkerAndReadsBackRight) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "writer"});
  constexpr size_t kBig = 64 << 10;
  auto made = KvStore::Create(c, "big", {.block_size = kBig, .capacity = 128 * kBig});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto keys = Keys(0, 64);
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> values;
  for (const auto& k : keys) bytes.push_back(BytesOf(k, kBig));
  for (const auto& b : bytes) values.emplace_back(b);
  auto put = made->Put(keys, values);  // 4 MiB in one seal
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  for (ErrorCode code : *put) EXPECT_EQ(code, ErrorCode::kOk);
  pid_t child = ForkChild([&] {
    auto r = Client::Connect({broker.socket(), "reader"});
    if (!r.ok()) return 10;
    auto s = KvStore::Open(*r, "big");
    auto got = s->Get(keys);
    if (!got.ok() || got->leading() != 64) return 11;
    for (size_t i = 0; i < 64; ++i)
      if (!Holds(got->data(i), keys[i])) return 12;
    return 0;
  });
  EXPECT_EQ(WaitChild(child), 0);
  EXPECT_EQ(broker.Stat("kv_writing"), 0u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// This process's mappings of a store's slabs.
int SlabMappings(const std::string& store) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("membroker-kv:" + store + ":") != std::string::npos;
  return n;
}

// The KV quota (kv= in --quota-client and --quota-uid) counts the blocks a
// client holds - leased or reserved, each block once - at the block size:
// past it a reservation answers QUOTA_EXCEEDED for the key and a Get fails
// with nothing leased; sealing, releasing and a SIGKILL give the charge back.
TEST(KvStore, QuotasCountTheBlocksAClientHolds) {
  BrokerProcess broker({"--quota-client", "kv=40K", "--quota-uid", "default:kv=60K"});
  auto a = *Client::Connect({broker.socket(), "a"});
  auto b = *Client::Connect({broker.socket(), "b"});
  KvStore sa = Made(a, "kv", 64);
  auto sb = *KvStore::Open(b, "kv");
  // 20 blocks in one put: the first 10 (40 KiB) reserved, the rest over the quota.
  auto put = PutAll(sa, Keys(0, 20));
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(put[i], i < 10 ? ErrorCode::kOk : ErrorCode::kQuotaExceeded) << i;
  for (ErrorCode code : PutAll(sa, Keys(10, 10))) EXPECT_EQ(code, ErrorCode::kOk);  // sealed: held no longer
  auto held = sa.Get(Keys(0, 10));
  ASSERT_TRUE(held.ok());
  auto again = sa.Get(Keys(0, 10));  // the same blocks again cost nothing more
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto over = sa.Get(Keys(10, 1));
  EXPECT_EQ(over.status().code(), ErrorCode::kQuotaExceeded) << over.status().ToString();
  EXPECT_EQ(broker.Stat("kv_leases"), 20u);  // nothing of the refused Get stays leased
  // The uid's quota: b may hold 20 KiB more (a holds 40 of the uid's 60).
  // A batch past it, with a key twice: the broker charges the batch at once,
  // then block by block, and what does not fit is released; the client
  // releases the rest, so nothing of it stays leased or charged.
  std::vector<std::string> mixed = Keys(10, 5);
  mixed.push_back(mixed[0]);
  for (const std::string& k : Keys(15, 2)) mixed.push_back(k);
  EXPECT_EQ(sb.Get(mixed).status().code(), ErrorCode::kQuotaExceeded);
  EXPECT_EQ(broker.WaitForStat("kv_leases", 20), 20u);  // (the client's release is one-way)
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  auto b5 = sb.Get(Keys(10, 5));
  ASSERT_TRUE(b5.ok()) << b5.status().ToString();
  EXPECT_EQ(sb.Get(Keys(15, 1)).status().code(), ErrorCode::kQuotaExceeded);
  // A holder killed gives its uid's share back.
  pid_t child = ForkChild([&] {
    auto c = Client::Connect({broker.socket(), "doomed"});
    if (!c.ok()) return 10;
    auto s = KvStore::Open(*c, "kv");
    auto got = s->Get(Keys(15, 5));  // the uid has 0 bytes left for it
    return got.status().code() == ErrorCode::kQuotaExceeded ? 0 : 11;
  });
  EXPECT_EQ(WaitChild(child), 0);
  b5->Release();
  held->Release();
  again->Release();
  Channel ch;
  child = ForkChild([&] {
    ch.AsChild();
    auto c = Client::Connect({broker.socket(), "holder"});
    if (!c.ok()) return 10;
    auto s = KvStore::Open(*c, "kv");
    auto got = s->Get(Keys(0, 10));
    if (!got.ok()) return 11;
    ch.Send("holding");
    ch.Receive();
    return 0;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "holding");
  EXPECT_EQ(sb.Get(Keys(10, 6)).status().code(), ErrorCode::kQuotaExceeded);  // 40 + 24 > 60
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitChild(child), 128 + SIGKILL);
  EXPECT_EQ(broker.WaitForStat("clients_connected", 2), 2u);
  auto b6 = sb.Get(Keys(10, 6));
  EXPECT_TRUE(b6.ok()) << b6.status().ToString();
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// A take-over keeps every store (docs/KV.md, "Across a restart"): the same
// id and keys, every sealed block's bytes, in new slabs the new broker can
// write; leases taken before it stay readable; a reservation made before it
// ends with the old broker (STALE at Seal), and nothing is left held.
TEST(KvStore, AStoreSurvivesATakeOverWithItsBlocksAndLeases) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "engine"});
  KvStore store = Made(c, "model/kv", 64);
  for (ErrorCode code : PutAll(store, Keys(0, 40))) ASSERT_EQ(code, ErrorCode::kOk);
  auto held = store.Get(Keys(0, 8));
  ASSERT_TRUE(held.ok());
  auto put = store.Reserve(Keys(100, 2));
  ASSERT_TRUE(put.ok());
  ASSERT_EQ(put->status(0), ErrorCode::kOk);
  const uint64_t id = store.id();

  ASSERT_EQ(broker.TakeOver(), 0);
  ASSERT_TRUE(c.WaitForReattach(1, 10000).ok());

  for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(Holds(held->data(i), Key(static_cast<int>(i)))) << i;
  // Every block is back, for this client and for a new one.
  auto got = store.Get(Keys(0, 40));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->leading(), 40u);
  for (size_t i = 0; i < 40; ++i) EXPECT_TRUE(Holds(got->data(i), Key(static_cast<int>(i)))) << i;
  pid_t child = ForkChild([&] {
    auto r = Client::Connect({broker.socket(), "reader"});
    if (!r.ok()) return 10;
    auto s = KvStore::Open(*r, "model/kv");
    if (!s.ok() || s->id() != id) return 11;
    auto all = s->Get(Keys(0, 40));
    if (!all.ok() || all->leading() != 40) return 12;
    for (size_t i = 0; i < 40; ++i)
      if (!Holds(all->data(i), Key(static_cast<int>(i)))) return 13;
    return 0;
  });
  EXPECT_EQ(WaitChild(child), 0);
  // The reservation went with the old broker.
  for (size_t i = 0; i < 2; ++i) std::memset(put->data(i).data(), 1, kBlock);
  EXPECT_EQ(store.Seal(*put).code(), ErrorCode::kStale);
  EXPECT_EQ(put->status(0), ErrorCode::kStale);
  // The new broker writes the store: new keys, the reserved ones again.
  for (ErrorCode code : PutAll(store, Keys(100, 4))) EXPECT_EQ(code, ErrorCode::kOk);
  EXPECT_EQ(broker.Stat("kv_blocks"), 44u);
  EXPECT_EQ(broker.Stat("kv_writing"), 0u);
  EXPECT_EQ(broker.Stat("kv_leases"), 40u);  // this client's second Get; the first one's were the old broker's
  // The old slab stays mapped while the leases taken there live, no longer.
  EXPECT_EQ(SlabMappings("model/kv"), 2);
  held->Release();
  EXPECT_EQ(SlabMappings("model/kv"), 1);
  got->Release();
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

TEST(KvStore, BadRequestsGetClearErrors) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "careless"});
  EXPECT_EQ(KvStore::Open(c, "none").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(KvStore::Create(c, "kv", {.block_size = 100, .capacity = 1 << 20}).status().code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(KvStore::Create(c, "kv", {.block_size = kBlock, .capacity = kBlock - 1}).status().code(),
            ErrorCode::kParamInvalid);
  EXPECT_EQ(KvStore::Create(c, "", {.block_size = kBlock, .capacity = kBlock}).status().code(),
            ErrorCode::kParamInvalid);
  KvStore store = Made(c, "kv", 4);
  auto other = KvStore::Create(c, "kv", {.block_size = 2 * kBlock, .capacity = 8 * kBlock});
  EXPECT_EQ(other.status().code(), ErrorCode::kAlreadyExists);
  EXPECT_NE(other.status().message().find("4096"), std::string::npos) << other.status().message();
  std::vector<std::string> long_key{std::string(65, 'k')};
  EXPECT_EQ(store.Get(long_key).status().code(), ErrorCode::kParamInvalid);
  std::vector<std::string> empty_key{""};
  EXPECT_EQ(store.Reserve(empty_key).status().code(), ErrorCode::kParamInvalid);
  std::vector<std::byte> too_big(kBlock + 1);
  std::vector<std::span<const std::byte>> values{too_big};
  EXPECT_EQ(store.Put(Keys(0, 1), values).status().code(), ErrorCode::kParamInvalid);
  // Busy while leased; dropped once not; gone for everyone after.
  PutAll(store, Keys(0, 1));
  {
    auto got = *store.Get(Keys(0, 1));
    auto busy = KvStore::Drop(c, "kv");
    EXPECT_EQ(busy.code(), ErrorCode::kBusy);
    EXPECT_NE(busy.message().find("1 leases"), std::string::npos) << busy.message();
  }
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);
  EXPECT_TRUE(KvStore::Drop(c, "kv").ok());
  EXPECT_EQ(KvStore::Drop(c, "kv").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store.PrefixHits(Keys(0, 1)).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(broker.Stat("kv_stores"), 0u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// The disk tier's directory, made for one test and removed after it.
struct DiskDir {
  std::string path;
  DiskDir() {
    char tmpl[] = "/tmp/membroker-kvdisk.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~DiskDir() {
    std::string cmd = "rm -rf '" + path + "'";
    (void)!std::system(cmd.c_str());
  }
  // The block files now there (each named <key hex>.<sequence>.kv).
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path))
      if (e.is_regular_file() && e.path().extension() == ".kv") out.push_back(e.path());
    return out;
  }
  std::string FileOf(const std::string& key) const {
    std::string hex;
    for (unsigned char c : key) {
      static const char kDigits[] = "0123456789abcdef";
      hex += kDigits[c >> 4];
      hex += kDigits[c & 15];
    }
    for (const std::string& f : Files())
      if (std::filesystem::path(f).filename().string().rfind(hex + ".", 0) == 0) return f;
    return "";
  }
};

// Puts keys [0, n) in batches of 10 into a store of 20 blocks (so most are
// evicted), then waits until the disk tier has written what was evicted.
void PutThroughASmallStore(KvStore& store, const BrokerProcess& broker, int n) {
  for (int at = 0; at < n; at += 10)
    for (ErrorCode code : PutAll(store, Keys(at, 10))) ASSERT_EQ(code, ErrorCode::kOk);
  ASSERT_EQ(broker.WaitForStat("kv_disk_writing", 0), 0u);
}

// A reader in another process: GetAll(n) has it get keys [0, n) in batches
// of 10, every byte checked, and answers its exit code: 0 when each was
// found, else why not. Made before this process has a client: a child forked
// later may copy a thread that ended but is not yet joined (the client's
// reattach thread, after a take-over), which TSan then takes for a live one
// when the child starts its own ("dup thread with used id").
class ReaderElsewhere {
 public:
  explicit ReaderElsewhere(const std::string& socket) {
    child_ = ForkChild([&] {
      ch_.AsChild();
      const std::string line = ch_.Receive();  // "get N", or nothing: the test ended first
      if (line.rfind("get ", 0) != 0) return 9;
      const int n = std::stoi(line.substr(4));
      auto c = Client::Connect({socket, "reader"});
      if (!c.ok()) return 10;
      auto s = KvStore::Open(*c, "kv");
      if (!s.ok()) return 11;
      for (int at = 0; at < n; at += 10) {
        auto got = s->Get(Keys(at, 10));
        if (!got.ok()) return 12;
        if (got->leading() != 10) return 13;
        for (size_t i = 0; i < 10; ++i)
          if (!Holds(got->data(i), Key(at + static_cast<int>(i)))) return 14;
      }
      return 0;
    });
    ch_.AsParent();
  }
  ~ReaderElsewhere() {
    if (child_ > 0) {
      ch_.Send("end");
      (void)WaitChild(child_);
    }
  }
  int GetAll(int n) {
    ch_.Send("get " + std::to_string(n));
    return WaitChild(std::exchange(child_, -1));
  }

 private:
  Channel ch_;
  pid_t child_ = -1;
};

TEST(KvStore, EvictedBlocksGoToTheDiskAndAGetBringsThemBack) {
  DiskDir disk;
  BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
  ReaderElsewhere reader(broker.socket());
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "kv", 20);
  PutThroughASmallStore(store, broker, 60);
  const uint64_t spilled = broker.Stat("kv_spilled");
  EXPECT_GE(spilled, 40u);  // at most 20 are in memory
  EXPECT_EQ(broker.Stat("kv_disk_blocks"), spilled);
  EXPECT_EQ(broker.Stat("kv_disk_bytes"), spilled * kBlock);
  EXPECT_EQ(disk.Files().size(), spilled);
  // A key on the disk exists, leads a prefix, and is not written twice.
  EXPECT_EQ(*store.PrefixHits(Keys(0, 60)), 60u);
  for (ErrorCode code : PutAll(store, Keys(0, 5))) EXPECT_EQ(code, ErrorCode::kAlreadyExists);

  EXPECT_EQ(reader.GetAll(60), 0);
  EXPECT_GE(broker.Stat("kv_disk_hits"), 40u);
  EXPECT_EQ(broker.Stat("kv_misses"), 0u);
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);
  EXPECT_EQ(broker.Stat("kv_disk_damaged"), 0u);
  // A block promoted and evicted again is not written again: it is there.
  // (The gets evicted the blocks only memory had: those were written.)
  EXPECT_EQ(broker.WaitForStat("kv_disk_writing", 0), 0u);
  EXPECT_EQ(broker.Stat("kv_disk_blocks"), broker.Stat("kv_spilled"));
  EXPECT_LE(broker.Stat("kv_spilled"), 60u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

TEST(KvStore, ADamagedDiskFileIsDroppedNeverServed) {
  DiskDir disk;
  BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "kv", 20);
  PutThroughASmallStore(store, broker, 40);
  const std::string file = disk.FileOf(Key(0));  // the first key put is evicted first
  ASSERT_FALSE(file.empty());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);  // one byte of the payload
    char b = 0;
    f.read(&b, 1);
    f.seekp(-100, std::ios::end);
    b = static_cast<char>(b ^ 0x5a);
    f.write(&b, 1);
  }
  auto got = store.Get(Keys(0, 2));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->found(0));
  ASSERT_TRUE(got->found(1));
  EXPECT_TRUE(Holds(got->data(1), Key(1)));
  EXPECT_EQ(broker.Stat("kv_disk_damaged"), 1u);
  EXPECT_FALSE(std::filesystem::exists(file));
  // Gone for good: a writer may put the key again.
  got->Release();
  EXPECT_EQ(PutAll(store, Keys(0, 1)), std::vector<ErrorCode>{ErrorCode::kOk});
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// A broker that starts - after a SIGKILL, without a store in memory - finds
// the tier's blocks; files damaged meanwhile, and unfinished writes, are
// dropped; past a smaller capacity the oldest go.
TEST(KvStore, ABrokerThatStartsFindsTheDiskTiersBlocks) {
  DiskDir disk;
  std::vector<std::string> files;
  {
    BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
    auto c = *Client::Connect({broker.socket(), "writer"});
    KvStore store = Made(c, "kv", 20);
    PutThroughASmallStore(store, broker, 60);
    files = disk.Files();
    broker.Kill();
  }
  ASSERT_GE(files.size(), 40u);
  const std::string junk = std::filesystem::path(files[0]).parent_path() / "00.7.kv";
  std::ofstream(junk) << "not a block";
  const std::string unfinished = std::filesystem::path(files[0]).parent_path() / ".tmp-99";
  std::ofstream(unfinished) << "half a block";

  BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
  EXPECT_EQ(broker.Stat("kv_disk_found"), files.size());
  EXPECT_EQ(broker.Stat("kv_disk_damaged"), 1u);
  EXPECT_FALSE(std::filesystem::exists(junk));
  EXPECT_FALSE(std::filesystem::exists(unfinished));
  ReaderElsewhere reader(broker.socket());
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "kv", 20);
  // Every key that was on the disk comes back, byte for byte.
  const int first_in_memory = static_cast<int>(files.size());  // (keys were evicted oldest first)
  EXPECT_EQ(*store.PrefixHits(Keys(0, first_in_memory)), static_cast<size_t>(first_in_memory));
  EXPECT_EQ(reader.GetAll(first_in_memory / 10 * 10), 0);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  broker.Stop();

  // The same directory with a capacity of 8 blocks: the 8 newest stay.
  BrokerProcess small({"--kv-disk", disk.path, "--kv-disk-bytes", std::to_string(8 * kBlock)});
  EXPECT_EQ(small.Stat("kv_disk_blocks"), 8u);
  EXPECT_EQ(small.Stat("kv_disk_trimmed"), files.size() - 8);
  EXPECT_EQ(disk.Files().size(), 8u);
}

// A restart makes each store again on a worker (docs/KV.md, "Across a
// restart"): the broker serves meanwhile, and a request that names the store
// waits for it - whether it comes while the copy runs (most likely here: 63
// MiB take tens of ms, and the client's requests are queued before the new
// broker serves) or after, every key is there, byte for byte.
TEST(KvStore, RequestsForAStoreBeingMadeAgainWaitForIt) {
  BrokerProcess broker;
  constexpr int kBlocks = 16000;
  // Named by id (this client's store) and by name (a new client's open).
  // The reader is forked before this process has a client, so before its
  // reattach thread exists: a fork while that thread allocates can leave the
  // child stuck on an allocator lock (ASan's takes no care of fork).
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    if (ch.Receive() != "go") return 9;
    auto r = Client::Connect({broker.socket(), "reader"});
    if (!r.ok()) return 10;
    auto s = KvStore::Open(*r, "big/kv");
    if (!s.ok()) return 11;
    auto got = s->Get(Keys(kBlocks - 10, 10));
    if (!got.ok() || got->leading() != 10) return 12;
    for (size_t i = 0; i < 10; ++i)
      if (!Holds(got->data(i), Key(kBlocks - 10 + static_cast<int>(i)))) return 13;
    return 0;
  });
  ch.AsParent();
  auto c = *Client::Connect({broker.socket(), "engine"});
  KvStore store = Made(c, "big/kv", 20000);
  for (int at = 0; at < kBlocks; at += 250)
    for (ErrorCode code : PutAll(store, Keys(at, 250))) ASSERT_EQ(code, ErrorCode::kOk);
  ASSERT_EQ(broker.TakeOver(), 0);
  ch.Send("go");
  for (int at = 0; at < kBlocks; at += 250) {
    auto got = store.Get(Keys(at, 250));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->leading(), 250u) << at;
    for (size_t i = 0; i < 250; ++i) ASSERT_TRUE(Holds(got->data(i), Key(at + static_cast<int>(i)))) << at + i;
  }
  EXPECT_EQ(WaitChild(child), 0);
  EXPECT_EQ(broker.Stat("kv_stores_restoring"), 0u);
  EXPECT_EQ(broker.Stat("kv_lost"), 0u);
  EXPECT_EQ(broker.Stat("kv_blocks"), static_cast<uint64_t>(kBlocks));
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// A take-over: the store comes back from memory (its slabs) and the tier from
// the disk; every key is there, byte for byte, those whose files the old
// broker was still writing too (it finishes them first). The directory's lock
// goes to the new broker: no third one may use it.
TEST(KvStore, ATakeOverKeepsTheStoreAndItsDiskTier) {
  DiskDir disk;
  BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
  ReaderElsewhere reader(broker.socket());
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "kv", 20);
  PutThroughASmallStore(store, broker, 60);
  for (ErrorCode code : PutAll(store, Keys(60, 20))) ASSERT_EQ(code, ErrorCode::kOk);  // 20 more evicted
  ASSERT_EQ(broker.TakeOver(), 0);
  EXPECT_EQ(broker.Stat("kv_disk_found"), 60u);
  EXPECT_EQ(broker.Stat("kv_disk_writing"), 0u);
  EXPECT_EQ(reader.GetAll(80), 0);
  EXPECT_EQ(broker.Stat("kv_lost"), 0u);
  EXPECT_GE(broker.Stat("kv_disk_hits"), 60u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
  DiskDir home;  // (for the third broker's socket)
  auto third = RunBrokerExpectingExit({"--socket", home.path + "/b.sock", "--kv-disk", disk.path});
  EXPECT_NE(third.exit_code, 0);
  EXPECT_NE(third.output.find("another running broker"), std::string::npos) << third.output;
}

// One broker per directory: a second is refused while the first runs, and
// the first's death (SIGKILL) frees the directory for the next.
TEST(KvStore, ADiskTierDirectoryServesOneBroker) {
  DiskDir disk;
  std::vector<std::string> files;
  {
    BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
    ReaderElsewhere reader(broker.socket());
    auto c = *Client::Connect({broker.socket(), "writer"});
    KvStore store = Made(c, "kv", 20);
    PutThroughASmallStore(store, broker, 40);
    files = disk.Files();
    DiskDir home;
    auto second = RunBrokerExpectingExit({"--socket", home.path + "/b.sock", "--kv-disk", disk.path});
    EXPECT_NE(second.exit_code, 0);
    EXPECT_NE(second.output.find("another running broker"), std::string::npos) << second.output;
    EXPECT_EQ(disk.Files(), files);  // it removed nothing
    EXPECT_EQ(reader.GetAll(40), 0);  // the first serves on
    ASSERT_EQ(broker.WaitForStat("kv_disk_writing", 0), 0u);
    files = disk.Files();  // (with the blocks the get evicted)
    broker.Kill();
  }
  BrokerProcess next({"--kv-disk", disk.path, "--kv-disk-bytes", "1M"});
  EXPECT_EQ(next.Stat("kv_disk_found"), files.size());
}

TEST(KvStore, TheDiskTierStaysWithinItsCapacity) {
  DiskDir disk;
  BrokerProcess broker({"--kv-disk", disk.path, "--kv-disk-bytes", std::to_string(10 * kBlock)});
  auto c = *Client::Connect({broker.socket(), "writer"});
  KvStore store = Made(c, "kv", 20);
  PutThroughASmallStore(store, broker, 80);
  EXPECT_LE(broker.Stat("kv_disk_blocks"), 10u);
  EXPECT_LE(disk.Files().size(), 10u);
  // At least 60 were evicted: each written and trimmed later, or not written
  // for want of room (the older files being written still).
  EXPECT_GE(broker.Stat("kv_disk_trimmed") + broker.Stat("kv_disk_write_skipped"), 50u);
  EXPECT_EQ(broker.Stat("kv_disk_trimmed") + broker.Stat("kv_disk_blocks"), broker.Stat("kv_spilled"));
  // The store's own share, in `list stores` (one store here: all of them).
  const std::string row = broker.Admin("list stores --json");
  for (const char* stat : {"trimmed", "write_skipped"}) {
    const std::string field = "\"disk_" + std::string(stat) + "\": " + std::to_string(broker.Stat("kv_disk_" + std::string(stat)));
    EXPECT_NE(row.find(field), std::string::npos) << field << " in " << row;
  }
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

TEST(KvStore, ADiskTierDirectoryOthersCanWriteIsRefused) {
  DiskDir disk;
  ASSERT_EQ(::chmod(disk.path.c_str(), 0777), 0);
  DiskDir home;  // (for the socket)
  auto r = RunBrokerExpectingExit({"--socket", home.path + "/b.sock", "--kv-disk", disk.path});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("writable by no one else"), std::string::npos) << r.output;
}

// --kv-store: the operator's stores are there as soon as the broker serves,
// owned by its uid; a take-over keeps one with its blocks; a drop makes it
// again, empty.
TEST(KvStore, TheOperatorsStoresAreThereFromTheStartAndAfterADrop) {
  BrokerProcess broker({"--kv-store", "op/kv:4K:256K:normal:lru", "--kv-store", "op/second:16K:1M"});
  auto c = *Client::Connect({broker.socket(), "engine"});
  auto store = KvStore::Open(c, "op/kv");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->block_size(), kBlock);
  EXPECT_EQ(store->blocks(), 64u);
  auto second = KvStore::Open(c, "op/second");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->block_size(), 16384u);
  const std::string rows = broker.Admin("list stores --json");
  EXPECT_NE(rows.find("\"eviction\": \"lru\""), std::string::npos) << rows;
  EXPECT_NE(rows.find("\"uid\": " + std::to_string(::geteuid())), std::string::npos) << rows;
  for (ErrorCode code : PutAll(*store, Keys(0, 10))) ASSERT_EQ(code, ErrorCode::kOk);

  // The next broker (same flags) keeps the store it took over, blocks and all.
  ASSERT_EQ(broker.TakeOver(), 0);
  ASSERT_TRUE(c.WaitForReattach(1, 10000).ok());
  EXPECT_EQ(broker.WaitForStat("kv_stores_restoring", 0), 0u);  // (each store is made again on a worker)
  auto got = store->Get(Keys(0, 10));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->leading(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_TRUE(Holds(got->data(i), Key(static_cast<int>(i)))) << i;
  got->Release();
  EXPECT_EQ(broker.WaitForStat("kv_leases", 0), 0u);

  // Dropped, it is made again at once, empty.
  const uint64_t before = store->id();
  ASSERT_TRUE(KvStore::Drop(c, "op/kv").ok());
  auto again = KvStore::Open(c, "op/kv");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(again->id(), before);
  EXPECT_EQ(again->blocks(), 64u);
  EXPECT_EQ(*again->PrefixHits(Keys(0, 10)), 0u);
  EXPECT_EQ(broker.Stat("kv_stores"), 2u);
  EXPECT_EQ(broker.Admin("check"), "tables: consistent\n");
}

// A take-over whose --kv-store asks for another size keeps the store it
// brings back, blocks and all, and says so in its log.
TEST(KvStore, ATakeOverKeepsAnOperatorsStoreItsOptionNowSizesOtherwise) {
  BrokerProcess broker({"--kv-store", "op/kv:4K:256K"}, /*log_to_file=*/true);
  auto c = *Client::Connect({broker.socket(), "engine"});
  auto store = KvStore::Open(c, "op/kv");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  for (ErrorCode code : PutAll(*store, Keys(0, 10))) ASSERT_EQ(code, ErrorCode::kOk);
  ASSERT_EQ(broker.TakeOver(std::vector<std::string>{"--kv-store", "op/kv:4K:512K"}), 0);
  ASSERT_TRUE(c.WaitForReattach(1, 10000).ok());
  EXPECT_EQ(broker.WaitForStat("kv_stores_restoring", 0), 0u);
  auto again = KvStore::Open(c, "op/kv");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->blocks(), 64u);  // as it was, not the 128 asked for now
  EXPECT_EQ(*again->PrefixHits(Keys(0, 10)), 10u);
  std::ifstream log(broker.log_path());
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("kv_store_kept store=\"op/kv\" block_size=4096 blocks=64"), std::string::npos) << text;
}

// A store the broker cannot make is a failed start that says which and why.
TEST(KvStore, AnOperatorsStoreThatCannotBeMadeFailsTheStart) {
  DiskDir home;  // (for the sockets)
  const std::string sock = home.path + "/b.sock", admin = home.path + "/b.admin";
  auto r = RunBrokerExpectingExit(
      {"--socket", sock, "--admin-socket", admin, "--kv-store", "op/kv:4K:64M", "--max-bytes", "16M"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--kv-store op/kv"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(sock));
  for (const char* bad : {"op/kv", "op/kv:4K", "op/kv:0:1M", "op/kv:4K:1K", "op/kv:4K:1M:tiny",
                          "op/kv:4K:1M:normal:mru", "op/kv:4K:1M:normal:lru:more"}) {
    r = RunBrokerExpectingExit({"--socket", sock, "--kv-store", bad});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.output.find("for kv-store"), std::string::npos) << bad << ": " << r.output;
  }
  r = RunBrokerExpectingExit({"--socket", sock, "--kv-store", "a:4K:1M", "--kv-store", "a:8K:1M"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("a store named once"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace membroker::testing
