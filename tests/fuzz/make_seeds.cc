// Writes the seed corpus for the fuzz targets: one file per valid message, and
// dispatch inputs that walk through a session (see fuzz_dispatch.cc for the
// record format), and one file per engine-to-engine message.
// Run: make_seeds DIR_DECODE DIR_DISPATCH [DIR_ENGINE_WIRE]
#include <cstdio>
#include <string>
#include <vector>

#include "transfer/share/name_card.h"
#include "transfer/ucx/engine_wire.h"
#include "membroker/ipc/protocol.h"

using namespace membroker::ipc;

static void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

static void AddRecord(std::vector<uint8_t>* out, const std::vector<uint8_t>& frame, uint8_t nfds = 0) {
  out->push_back(nfds);
  out->push_back(static_cast<uint8_t>(frame.size() & 0xff));
  out->push_back(static_cast<uint8_t>(frame.size() >> 8));
  out->insert(out->end(), frame.begin(), frame.end());
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return 2;
  if (argc == 4) {
    namespace w = membroker::detail::wire;
    w::Region r{7, 0x7f0000000000, 1 << 20, false, "kv-cache"}, unnamed{8, 0x7f0000100000, 4096, true, ""};
    std::vector<w::Message> wire = {
        w::Welcome{"decode", {1, 2, 3}, {r, unnamed}}, w::RegionAdded{r},
        w::RegionGone{7},                           w::RegionGoneAck{7},
        w::Notify{1, "kv-ready", "layer=3"},        w::NotifyAck{1, 0, ""},
        w::RegionAddedAck{7},                       w::Goodbye{"disconnected"}};
    int n = 0;
    for (const auto& m : wire) {
      const std::string bytes = w::Encode(m);
      Write(std::string(argv[3]) + "/message-" + std::to_string(n++), {bytes.begin(), bytes.end()});
    }
    for (w::DataKind kind : {w::DataKind::kWrite, w::DataKind::kWriteAck, w::DataKind::kReadRequest,
                             w::DataKind::kReadData, w::DataKind::kWriteV, w::DataKind::kReadV}) {
      const bool batch = kind == w::DataKind::kWriteV || kind == w::DataKind::kReadV;
      const w::EncodedDataHeader h = w::EncodeData(w::DataHeader{kind, 0, 9, batch ? uint64_t{2} : uint64_t{0x7f0000001000}, 65536});
      Write(std::string(argv[3]) + "/data-" + std::to_string(n++), {h.begin(), h.end()});
    }
    // A share's name card (FetchNamed reads it from another host); 328 bytes
    // hold all of its fields, the rest of its page is zero.
    std::vector<uint8_t> card(membroker::share::kCardBytes);
    (void)membroker::share::EncodeCard({"models/llama-70b", 3, 41, 0x7f0000200000, 3 << 20, 0x1234567890abcdefull}, card);
    card.resize(328);
    Write(std::string(argv[3]) + "/name-card", card);
  }
  std::vector<Message> msgs = {
      HelloRequest{"seed", kProtocolVersion, 0}, MallocRequest{4096, PagePolicy::kNormalOnly, 0},
      MallocRequest{3 << 20, PagePolicy::kHugeFirst, 0}, FreeRequest{1}, ExportRequest{1, 1},
      SetPidRequest{"0123456789abcdef0123456789abcdef", {1, 2}}, ImportRequest{"abc"},
      PingRequest{}, GoodbyeRequest{}, OkReply{}, ErrorReply{membroker::ErrorCode::kBusy, "x"},
      MallocReply{1, 4096, 4096}, ImportReply{1, 4096, 4096, true}, ExportReply{"t"},
      HelloReply{1, 1, 0, {{PagePolicy::kNormalOnly, 4096, 4096}}, "host-a"},
      MallocRequest{8192, PagePolicy::kNormalOnly, kMallocPinned | kMallocSameAddress},
      MallocRequest{4096, PagePolicy::kNormalOnly, kMallocExport, kExportNoPidCheck | kExportReadOnly},
      RegisterHostRequest{0x10000, 8192, 0}, UnregisterHostRequest{0x10000},
      EngineInitRequest{"e", 1}, EngineFinalizeRequest{}, EngineRegisterRequest{0x10000, 4096, 1, 0, "kv"},
      EngineRegisterRequest{0x10000, 8192, 0, 0, ""}, EngineDeregisterRequest{1},
      EngineConnectRequest{"e", 0}, EngineConnectRequest{"f", 5}, EngineRegionsRequest{"e"},
      EngineResolveRequest{"e", 0}, EngineResolveRequest{"f", 5}, EngineResolveReply{"h", 1, "127.0.0.1:1"},
      ClusterLookupRequest{"p/a", 0}, ClusterLookupReply{"h", 1, 4096, false, "m", 3},
      EngineImportRequest{"e", 1}, EngineReleaseRequest{1}, EngineDisconnectRequest{"e"},
      EngineNotifyRequest{"e", "n", "m"}, EngineGetNotifiesRequest{},
      EngineInfoReply{1, 0, 1, {{1, 0x10000, 4096, 1, 0, false, "kv"}}}, EngineRegisterReply{1},
      EngineNotifiesReply{{{"e", "n", "m"}}, 0}, PublishRequest{"p/a", 1, kPublishPersist},
      LookupRequest{"p/a", 0}, LookupRequest{"p/b", 5}, UnpublishRequest{"p/a"},
      ListNamesRequest{"p/", ""}, SubscribeRequest{"p/"}, WaitEventsRequest{0}, WaitEventsRequest{5}, WakeRequest{},
      ListNamesReply{{{"p/a", 1, 4096, false, true, 1}}, false},
      EventsReply{{{NameEventKind::kHolderDied, "p/a", 1, 2, ""}}, 0},
      EventsReply{{{NameEventKind::kHostGone, "p/a", 0, 0, "h"}}, 0}, SubscribeRequest{"p/", true},
      KvOpenRequest{"kv", true, 4096, 16384}, KvSlabRequest{1, 0}, KvReserveRequest{1, {"a", "b"}},
      KvSealRequest{1, {{0, 1, 1, 0, 4096}}}, KvAbortRequest{1, {{1, 1}}}, KvGetRequest{1, {"a", "c"}, true},
      KvReleaseRequest{1, {{0, 1}}}, KvDropRequest{"kv"}, KvBlocksReply{{{membroker::ErrorCode::kOk, 0, 1, 4096}}, 1}};
  int i = 0;
  for (const auto& m : msgs) {
    auto bytes = Encode({kProtocolVersion, 7, 0, m});
    Write(std::string(argv[1]) + "/" + MessageName(m), bytes);
    std::vector<uint8_t> in{1};
    AddRecord(&in, bytes);
    Write(std::string(argv[2]) + "/single-" + std::to_string(i++) + "-" + MessageName(m), in);
  }
  // A whole session: malloc, export, set pids, import, free, with one fd abuse.
  std::vector<uint8_t> session{1};
  AddRecord(&session, Encode({kProtocolVersion, 2, 0, MallocRequest{8192}}));
  AddRecord(&session, Encode({kProtocolVersion, 3, 0, ExportRequest{1, kExportNoPidCheck}}));
  AddRecord(&session, Encode({kProtocolVersion, 4, kFlagNoReplyOnSuccess, FreeRequest{1}}));
  AddRecord(&session, Encode({kProtocolVersion, 5, 0, PingRequest{}}), 2);
  Write(std::string(argv[2]) + "/session", session);
  // A transfer-engine session: control allocation, init, register, connect to
  // itself, import its region, notify, read notifies, release, finalize.
  std::vector<uint8_t> engine{1};
  AddRecord(&engine, Encode({kProtocolVersion, 2, 0, MallocRequest{4096}}));
  AddRecord(&engine, Encode({kProtocolVersion, 3, 0, EngineInitRequest{"e", 1}}));
  AddRecord(&engine, Encode({kProtocolVersion, 4, 0, EngineResolveRequest{"e", 0}}));
  AddRecord(&engine, Encode({kProtocolVersion, 4, 0, EngineConnectRequest{"e", 0}}));
  AddRecord(&engine, Encode({kProtocolVersion, 5, 0, EngineImportRequest{"e", 1}}));
  AddRecord(&engine, Encode({kProtocolVersion, 6, 0, EngineNotifyRequest{"e", "n", "m"}}));
  AddRecord(&engine, Encode({kProtocolVersion, 7, 0, EngineGetNotifiesRequest{}}));
  AddRecord(&engine, Encode({kProtocolVersion, 8, kFlagNoReplyOnSuccess, EngineReleaseRequest{1}}));
  AddRecord(&engine, Encode({kProtocolVersion, 9, 0, EngineConnectRequest{"later", 5}}));
  AddRecord(&engine, Encode({kProtocolVersion, 10, 0, EngineFinalizeRequest{}}));
  Write(std::string(argv[2]) + "/engine-session", engine);
  // Named objects: publish, subscribe, look up, wait for events, unpublish.
  std::vector<uint8_t> names{1};
  AddRecord(&names, Encode({kProtocolVersion, 2, 0, MallocRequest{4096}}));
  AddRecord(&names, Encode({kProtocolVersion, 3, 0, SubscribeRequest{""}}));
  AddRecord(&names, Encode({kProtocolVersion, 4, 0, PublishRequest{"p/a", 1, kPublishReadOnly}}));
  AddRecord(&names, Encode({kProtocolVersion, 5, 0, LookupRequest{"p/b", 5}}));
  AddRecord(&names, Encode({kProtocolVersion, 6, 0, ListNamesRequest{"p/", ""}}));
  AddRecord(&names, Encode({kProtocolVersion, 7, 0, WaitEventsRequest{5}}));
  AddRecord(&names, Encode({kProtocolVersion, 8, 0, UnpublishRequest{"p/a"}}));
  AddRecord(&names, Encode({kProtocolVersion, 9, 0, PublishRequest{"p/c", 1, kPublishPersist}}));
  AddRecord(&names, Encode({kProtocolVersion, 10, 0, WakeRequest{}}), 1);  // (the fuzzer's fd: /dev/null)
  Write(std::string(argv[2]) + "/names-session", names);
  // A KV store: create, reserve, seal from an allocation, get with a lease,
  // release, a stale release, reserve and leave it for the disconnect.
  std::vector<uint8_t> kv{1};
  AddRecord(&kv, Encode({kProtocolVersion, 2, 0, MallocRequest{8192}}));
  AddRecord(&kv, Encode({kProtocolVersion, 3, 0, KvOpenRequest{"kv", true, 4096, 16384}}));
  AddRecord(&kv, Encode({kProtocolVersion, 4, 0, KvReserveRequest{1, {"a", "b"}}}));
  AddRecord(&kv, Encode({kProtocolVersion, 5, 0, KvSealRequest{1, {{0, 1, 1, 0, 4096}, {1, 1, 1, 4096, 100}}}}));
  AddRecord(&kv, Encode({kProtocolVersion, 6, 0, KvGetRequest{1, {"a", "b", "c"}, true}}));
  AddRecord(&kv, Encode({kProtocolVersion, 7, 0, KvSlabRequest{1, 0}}));
  AddRecord(&kv, Encode({kProtocolVersion, 8, kFlagNoReplyOnSuccess, KvReleaseRequest{1, {{0, 1}}}}));
  AddRecord(&kv, Encode({kProtocolVersion, 9, 0, KvReleaseRequest{1, {{0, 7}}}}));
  AddRecord(&kv, Encode({kProtocolVersion, 10, 0, KvReserveRequest{1, {"c", "d", "e", "f"}}}));
  // The keys as a table each, as clients before packed keys sent them.
  AddRecord(&kv, EncodeWithKeyTables({kProtocolVersion, 11, 0, KvGetRequest{1, {"a", "b"}, true}}));
  AddRecord(&kv, EncodeWithKeyTables({kProtocolVersion, 12, 0, KvReserveRequest{1, {"g", "h"}}}));
  Write(std::string(argv[2]) + "/kv-session", kv);
  return 0;
}
