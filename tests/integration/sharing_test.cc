// Export and import between real processes: pid allow-lists, same-uid sharing,
// read-only exports, and memory that outlives its creator.
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

constexpr size_t kSize = 1 << 20;

// In a child: import token, map, check the first and last byte, optionally write.
int ImportAndCheck(const std::string& socket, const std::string& token, char expect, char write) {
  auto c = Client::Connect({socket, "importer"});
  if (!c.ok()) return 10;
  auto h = c->ImportFromShareableHandle(token);
  if (!h.ok()) return h.code() == ErrorCode::kNotFound ? 3 : 11;
  auto m = MapWhole(*c, *h);
  if (!m.ok()) return 12;
  const char* p = m->as<char>();
  if (p[0] != expect || p[h->size() - 1] != expect) return 13;
  if (write) std::memset(m->data(), write, m->size());
  return 0;
}

class Sharing : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Client::Connect({broker.socket(), "exporter"});
    ASSERT_TRUE(c.ok());
    client = std::move(*c);
    auto h = client.MallocPhysical(kSize);
    ASSERT_TRUE(h.ok());
    handle = std::move(*h);
    auto r = client.ReserveMemAddress(kSize);
    ASSERT_TRUE(r.ok());
    range = std::move(*r);
    auto m = client.MapMem(range.base(), kSize, 0, handle);
    ASSERT_TRUE(m.ok());
    mapping = std::move(*m);
    std::memset(mapping.data(), 'A', kSize);
  }

  BrokerProcess broker;
  Client client;
  PhysicalHandle handle;
  Reservation range;
  Mapping mapping;
};

TEST_F(Sharing, WriteInOneProcessReadInAnother) {
  auto token = client.ExportToShareableHandle(handle, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), 32u);
  std::string t = *token, s = broker.socket();
  pid_t pid = ForkChild([&] { return ImportAndCheck(s, t, 'A', 'B'); });
  EXPECT_EQ(WaitChild(pid), 0);
  // The child's writes are visible here: one physical memory, no copy.
  EXPECT_EQ(mapping.as<char>()[0], 'B');
  EXPECT_EQ(mapping.as<char>()[kSize - 1], 'B');
}

// prop.exported: the token comes with the allocation; exporting again with the
// same flags asks the broker nothing, other flags make a second export.
TEST_F(Sharing, ExportedWhenMadeTheTokenComesInTheSameRoundTrip) {
  AllocationProp prop;
  prop.exported = true;
  prop.export_flags = kExportNoPidCheck;
  auto h = client.MallocPhysical(kSize, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->export_token().size(), 32u);
  EXPECT_EQ(broker.Stat("exports_live"), 1u);
  const uint64_t requests = broker.Stat("requests");
  auto same = client.ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, h->export_token());
  EXPECT_EQ(broker.Stat("requests"), requests) << "the same export must not ask the broker";
  auto other = client.ExportToShareableHandle(*h, kExportNoPidCheck | kExportReadOnly);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, h->export_token());
  EXPECT_EQ(broker.Stat("exports_live"), 2u);
  {
    auto m = MapWhole(client, *h);
    ASSERT_TRUE(m.ok());
    std::memset(m->data(), 'E', kSize);
  }
  std::string t = h->export_token(), s = broker.socket();
  pid_t pid = ForkChild([&] { return ImportAndCheck(s, t, 'E', 0); });
  EXPECT_EQ(WaitChild(pid), 0);
  // Unknown export flags: refused before anything is made or charged.
  const uint64_t live = broker.Stat("allocations_live");
  prop.export_flags = 0x80;
  EXPECT_EQ(client.MallocPhysical(kSize, prop).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(broker.Stat("allocations_live"), live);
  // Freed: its exports go with it.
  *h = PhysicalHandle();
  ASSERT_TRUE(client.Ping().ok());
  EXPECT_EQ(broker.Stat("exports_live"), 0u);
}

TEST(SharingFromAPool, PooledAllocationsCanBeExportedWhenTaken) {
  BrokerProcess broker({"--pool", "1M:normal:1"});
  auto c = Client::Connect({broker.socket(), "exporter"});
  ASSERT_TRUE(c.ok());
  AllocationProp prop;
  prop.exported = true;
  auto h = c->MallocPhysical(kSize, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->from_pool());
  EXPECT_EQ(h->export_token().size(), 32u);
  EXPECT_EQ(broker.Stat("exports_live"), 1u);
}

TEST_F(Sharing, PidAllowListAdmitsOnlyTheNamedProcess) {
  auto token = client.ExportToShareableHandle(handle);
  ASSERT_TRUE(token.ok());
  std::string t = *token, s = broker.socket();
  Channel allowed_go, denied_go;
  // Start both children first so their pids are known, then allow one.
  pid_t allowed = ForkChild([&] {
    allowed_go.AsChild();
    allowed_go.Receive();
    return ImportAndCheck(s, t, 'A', 0);
  });
  pid_t denied = ForkChild([&] {
    denied_go.AsChild();
    denied_go.Receive();
    return ImportAndCheck(s, t, 'A', 0);
  });
  allowed_go.AsParent();
  denied_go.AsParent();
  pid_t list[] = {allowed};
  ASSERT_TRUE(client.SetPidToShareableHandle(t, list).ok());
  allowed_go.Send("go");
  denied_go.Send("go");
  EXPECT_EQ(WaitChild(allowed), 0);
  EXPECT_EQ(WaitChild(denied), 3) << "a process not on the list must get NOT_FOUND";
}

TEST_F(Sharing, WithoutAllowListNobodyElseMayImport) {
  auto token = client.ExportToShareableHandle(handle);
  ASSERT_TRUE(token.ok());
  std::string t = *token, s = broker.socket();
  pid_t pid = ForkChild([&] { return ImportAndCheck(s, t, 'A', 0); });
  EXPECT_EQ(WaitChild(pid), 3);
}

TEST_F(Sharing, SetPidIsOnlyForTheExporter) {
  auto token = client.ExportToShareableHandle(handle);
  ASSERT_TRUE(token.ok());
  auto other = Client::Connect({broker.socket(), "other"});
  ASSERT_TRUE(other.ok());
  pid_t me[] = {::getpid()};
  EXPECT_EQ(other->SetPidToShareableHandle(*token, me).code(), ErrorCode::kNotFound);
  EXPECT_EQ(client.SetPidToShareableHandle("not-a-token", me).code(), ErrorCode::kNotFound);
}

TEST_F(Sharing, WrongAndStaleTokensLookLikeMissingOnes) {
  auto other = Client::Connect({broker.socket(), "other"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->ImportFromShareableHandle("00000000000000000000000000000000").code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(other->ImportFromShareableHandle("").code(), ErrorCode::kNotFound);  // docs/API.md
  EXPECT_EQ(other->ImportFromShareableHandle(std::string(200, 'a')).code(), ErrorCode::kNotFound);
  auto h = client.MallocPhysical(4096);
  ASSERT_TRUE(h.ok());
  auto token = client.ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  ASSERT_TRUE(client.FreePhysical(*h).ok());  // last holder: the token dies
  EXPECT_EQ(other->ImportFromShareableHandle(*token).code(), ErrorCode::kNotFound);
}

TEST_F(Sharing, DoubleImportIsRefusedAndHarmless) {
  auto token = client.ExportToShareableHandle(handle, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  auto other = Client::Connect({broker.socket(), "other"});
  ASSERT_TRUE(other.ok());
  auto first = other->ImportFromShareableHandle(*token);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(other->ImportFromShareableHandle(*token).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(client.ImportFromShareableHandle(*token).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(broker.Stat("imports"), 1u);
}

TEST_F(Sharing, ReadOnlyExportCannotBeMadeWritable) {
  auto token = client.ExportToShareableHandle(handle, kExportNoPidCheck | kExportReadOnly);
  ASSERT_TRUE(token.ok());
  auto other = Client::Connect({broker.socket(), "reader"});
  ASSERT_TRUE(other.ok());
  auto h = other->ImportFromShareableHandle(*token);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->read_only());
  auto m = MapWhole(*other, *h);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->as<char>()[100], 'A');
  EXPECT_EQ(other->MemSetAccess(m->data(), kSize, Access::kReadWrite).code(),
            ErrorCode::kPermissionDenied);
  EXPECT_TRUE(other->MemSetAccess(m->data(), kSize, Access::kRead).ok());
}

TEST_F(Sharing, MemoryOutlivesItsCreator) {
  auto token = client.ExportToShareableHandle(handle, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  auto other = Client::Connect({broker.socket(), "survivor"});
  ASSERT_TRUE(other.ok());
  auto h = other->ImportFromShareableHandle(*token);
  ASSERT_TRUE(h.ok());
  // The creator lets go of everything.
  mapping = Mapping();
  range = Reservation();
  handle = PhysicalHandle();
  client = Client();
  ASSERT_TRUE(other->Ping().ok());
  EXPECT_EQ(broker.Stat("allocations_live"), 1u);
  auto m = MapWhole(*other, *h);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->as<char>()[kSize / 2], 'A');
  // The last holder lets go: the broker frees it.
  *m = WholeMapping();
  *h = PhysicalHandle();
  ASSERT_TRUE(other->Ping().ok());
  EXPECT_EQ(broker.Stat("allocations_live"), 0u);
  EXPECT_EQ(broker.Stat("bytes_allocated"), 0u);
}

TEST_F(Sharing, CreatorCrashDoesNotTakeTheMemoryFromImporters) {
  std::string s = broker.socket();
  Channel ch;
  pid_t creator = ForkChild([&] {
    ch.AsChild();
    auto c = Client::Connect({s, "doomed-creator"});
    if (!c.ok()) return 1;
    auto h = c->MallocPhysical(kSize);
    auto m = MapWhole(*c, *h);
    std::memset(m->data(), 'Z', kSize);
    auto t = c->ExportToShareableHandle(*h, kExportNoPidCheck);
    ch.Send(*t);
    ch.Receive();  // blocks until SIGKILL
    return 0;
  });
  ch.AsParent();
  std::string token = ch.Receive();
  auto h = client.ImportFromShareableHandle(token);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ::kill(creator, SIGKILL);
  EXPECT_EQ(WaitChild(creator), 128 + SIGKILL);
  EXPECT_EQ(broker.WaitForStat("clients_crashed", 1), 1u);
  auto m = MapWhole(client, *h);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->as<char>()[kSize - 1], 'Z');
}

}  // namespace
}  // namespace membroker::testing
