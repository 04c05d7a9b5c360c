// The cluster's decoders (broker/cluster/): etcd's answers and the host
// records stored there, hostile ones included, and the --cluster settings.
#include <gtest/gtest.h>

#include "cluster/cluster.h"
#include "cluster/etcd_json.h"
#include "cluster/host_record.h"

namespace membroker::broker {
namespace {

const char kBoot[] = "0123abcd-0123-4567-89ab-0123456789ab";

HostRecord Sample() {
  HostRecord r;
  r.host = "node-1";
  r.pid = 42;
  r.boot_id = kBoot;
  r.pid_ns = 4026531836;
  r.started_s = 1764800000;
  r.engines = {{"decode-0", "10.0.0.2:4000"}, {"prefill", "[fe80::1]:9"}};
  r.names = {{"models/llama", 1 << 30, true, std::string("\0\xff meta", 7), 7}, {"kv/pool", 4096, false, "", 8}};
  return r;
}

TEST(EtcdJson, Base64RoundTripsAndRefusesWhatIsNotBase64) {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x80", 3)}) {
    std::string back;
    ASSERT_TRUE(Base64Decode(Base64Encode(s), &back)) << s;
    EXPECT_EQ(back, s);
  }
  EXPECT_EQ(Base64Encode("/membroker/t"), "L21lbWJyb2tlci90");
  std::string out;
  for (const char* bad : {"a", "abc", "a===", "ab=c", "ab\ncd", "====", "ab-_"}) EXPECT_FALSE(Base64Decode(bad, &out)) << bad;
}

TEST(EtcdJson, AnswersAreReadAndHostileOnesRefused) {
  auto range = ParseEtcdAnswer(
      R"({"header":{"revision":"7"},"kvs":[{"key":"YQ==","value":"Yg==","create_revision":"3","mod_revision":"5","lease":"9"}]})");
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(range->revision, 7);
  ASSERT_EQ(range->kvs.size(), 1u);
  EXPECT_EQ(range->kvs[0].key, "a");
  EXPECT_EQ(range->kvs[0].value, "b");
  EXPECT_EQ(range->kvs[0].create_revision, 3);
  EXPECT_EQ(range->kvs[0].lease, 9);

  auto watch = ParseEtcdAnswer(R"({"result":{"header":{"revision":"8"},"events":[{"type":"DELETE","kv":{"key":"YQ=="}}]}})");
  ASSERT_TRUE(watch.ok());
  ASSERT_EQ(watch->events.size(), 1u);
  EXPECT_TRUE(watch->events[0].deleted);

  auto gone = ParseEtcdAnswer(R"({"result":{"header":{"revision":"2"},"ID":"12345"}})");  // keep-alive, no TTL
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->ttl, 0);
  auto error = ParseEtcdAnswer(R"({"error":"x","code":16,"message":"etcdserver: invalid auth token"})");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->error_code, 16);
  EXPECT_EQ(error->error, "etcdserver: invalid auth token");

  for (const char* bad : {"", "[]", "{", R"({"header":{"revision":"x"}})", R"({"header":{"revision":"99999999999999999999"}})",
                          R"({"kvs":{}})", R"({"kvs":[{"key":"%%%%"}]})", R"({"events":[{"type":"EXPLODE","kv":{}}]})",
                          R"({"events":[{"type":"PUT"}]})", R"({"succeeded":"yes"})"})
    EXPECT_EQ(ParseEtcdAnswer(bad).status().code(), ErrorCode::kProtocolError) << bad;
  EXPECT_FALSE(ParseEtcdAnswer(std::string(kEtcdMaxAnswerBytes + 1, ' ')).ok());
  EXPECT_FALSE(ParseEtcdAnswer(std::string(100000, '[') + std::string(100000, ']')).ok());
}

TEST(EtcdJson, PrefixEndIsTheNextKeyAfterThePrefix) {
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(std::string("\xff", 1)), std::string(1, '\0'));
}

TEST(HostRecord, RoundTripsAndEachCheckRefuses) {
  const HostRecord r = Sample();
  auto back = DecodeHostRecord("node-1", EncodeHostRecord(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pid, 42);
  EXPECT_EQ(back->pid_ns, r.pid_ns);
  ASSERT_EQ(back->engines.size(), 2u);
  EXPECT_EQ(back->engines[1].address, "[fe80::1]:9");
  EXPECT_EQ(back->names, r.names);  // metadata's bytes, any of them, through base64

  EXPECT_FALSE(DecodeHostRecord("node-2", EncodeHostRecord(r)).ok());  // its key names another host
  EXPECT_FALSE(DecodeHostRecord("bad name", EncodeHostRecord(r)).ok());
  const auto refuses = [](auto edit) {
    HostRecord x = Sample();
    edit(x);
    return !DecodeHostRecord("node-1", EncodeHostRecord(x)).ok();
  };
  EXPECT_TRUE(refuses([](HostRecord& x) { x.pid = 0; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.boot_id = "not-a-boot-id"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines[0].address = "10.0.0.2"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines[0].address = "10.0.0.2:0"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines[0].address = "host.example:80"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines[0].name = "a\x1b[2Jb"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines[0].name = ""; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.engines.resize(kHostEnginesMax + 1, x.engines[0]); }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.names[0].name = "a\nb"; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.names[0].name = ""; }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.names[0].metadata = std::string(4097, 'm'); }));
  EXPECT_TRUE(refuses([](HostRecord& x) { x.names.resize(kHostNamesMax + 1, x.names[1]); }));
  // A record of a broker before names (no "names") has none; a malformed list is refused.
  std::string old = EncodeHostRecord(Sample());
  old = old.substr(0, old.find(",\"names\"")) + old.substr(old.find(",\"pid\""));
  auto without = DecodeHostRecord("node-1", old);
  ASSERT_TRUE(without.ok()) << old << without.status().ToString();
  EXPECT_TRUE(without->names.empty());
  for (const char* names : {R"("names":7)", R"("names":[{"name":"a","size":-1,"read_only":false,"meta":""}])",
                            R"("names":[{"name":"a","size":1,"read_only":0,"meta":""}])",
                            R"("names":[{"name":"a","size":1,"read_only":false,"meta":"!!"}])",
                            R"("names":[{"name":"a","size":1,"read_only":false,"meta":"","allocation":"7"}])"}) {
    std::string bad = EncodeHostRecord(Sample());
    bad = bad.substr(0, bad.find("\"names\"")) + names + bad.substr(bad.find(",\"pid\""));
    EXPECT_FALSE(DecodeHostRecord("node-1", bad).ok()) << bad;
  }
  // A name of a broker before allocations (no "allocation") has 0.
  std::string older = EncodeHostRecord(Sample());
  for (size_t at; (at = older.find("\"allocation\":")) != std::string::npos;)
    older.erase(at, older.find(',', at) + 1 - at);  // keys are sorted: it comes first, a comma after it
  auto no_ids = DecodeHostRecord("node-1", older);
  ASSERT_TRUE(no_ids.ok()) << older << no_ids.status().ToString();
  EXPECT_EQ(no_ids->names.at(0).allocation, 0u);
  EXPECT_EQ(no_ids->names.at(0).name, "models/llama");
  for (const char* bad : {"", "null", "[]", R"({"v":2})", R"({"v":1,"host":"node-1"})"})
    EXPECT_FALSE(DecodeHostRecord("node-1", bad).ok()) << bad;
}

TEST(HostRecord, HostNamesAndAddresses) {
  for (const char* ok : {"a", "node-1", "gpu07.rack3", "A_b"}) EXPECT_TRUE(CheckHostName(ok).ok()) << ok;
  for (const char* bad : {"", "-a", ".a", "a b", "a/b", "a\nb", "ü"}) EXPECT_FALSE(CheckHostName(bad).ok()) << bad;
  EXPECT_FALSE(CheckHostName(std::string(65, 'a')).ok());
  for (const char* ok : {"127.0.0.1:1", "10.1.2.3:65535", "[::1]:80"}) EXPECT_TRUE(ValidListenAddress(ok)) << ok;
  for (const char* bad : {"", ":1", "1.2.3.4:", "1.2.3.4:65536", "::1:80", "[::1]", "1.2.3.4:+1", "1.2.3:4"})
    EXPECT_FALSE(ValidListenAddress(bad)) << bad;
}

TEST(ClusterOptions, TheUrlNamesEtcdEndpoints) {
  std::vector<std::string> endpoints;
  ASSERT_TRUE(ParseClusterUrl("etcd://10.0.0.1:2379,etcd-b:2379", &endpoints).ok());
  EXPECT_EQ(endpoints, (std::vector<std::string>{"http://10.0.0.1:2379", "http://etcd-b:2379"}));
  for (const char* bad : {"", "etcd://", "http://a:1", "etcd://a", "etcd://a:", "etcd://a:123456", "etcd://a b:1",
                          "etcd://a:1/x", "etcd://user@a:1"})
    EXPECT_FALSE(ParseClusterUrl(bad, &endpoints).ok()) << bad;
}

}  // namespace
}  // namespace membroker::broker
