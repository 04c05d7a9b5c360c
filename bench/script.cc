// Sends a fixed script of requests to a broker: N times one operation. Used by
// bench/run to count the broker's instructions per request under callgrind.
//   script --socket PATH --op ping|malloc|export|import|connect|kv_get64 --count N
// kv_get64: a leased get of 64 blocks of 16 KiB (+ its one-way release).
#include <cstdio>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "membroker/client.h"
#include "membroker/kv_store.h"

using namespace membroker;

int main(int argc, char** argv) {
  std::string socket, op;
  long count = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--socket")) socket = argv[i + 1];
    else if (!std::strcmp(argv[i], "--op")) op = argv[i + 1];
    else if (!std::strcmp(argv[i], "--count")) count = std::atol(argv[i + 1]);
  }
  auto c = Client::Connect({socket, "script"});
  if (!c.ok()) {
    std::fprintf(stderr, "script: %s\n", c.status().ToString().c_str());
    return 1;
  }
  auto owned = c->MallocPhysical(4096);
  auto token = c->ExportToShareableHandle(*owned, kExportNoPidCheck);
  auto importer = Client::Connect({socket, "script-importer"});
  if (!owned.ok() || !token.ok() || !importer.ok()) return 1;
  // An allocation has at most 64 exports at once: exports rotate over enough
  // handles, all made before the first export.
  std::vector<PhysicalHandle> exportable;
  if (op == "export")
    for (long i = 0; i < count / 60 + 1; ++i) {
      auto h = c->MallocPhysical(4096);
      if (!h.ok()) return 1;
      exportable.push_back(std::move(*h));
    }
  std::optional<KvStore> store;
  std::vector<std::string> keys;
  if (op == "kv_get64") {
    auto s = KvStore::Create(*c, "script", {.block_size = 16 << 10, .capacity = 128 << 14});
    if (!s.ok()) return 1;
    store = std::move(*s);
    // 32-byte keys, as content hashes are (a key past 15 bytes is a heap string on both sides).
    for (int k = 0; k < 64; ++k) keys.push_back(std::string(32 - std::to_string(k).size(), 'h') + std::to_string(k));
    std::vector<std::byte> block(16 << 10);
    std::vector<std::span<const std::byte>> values(64, std::span<const std::byte>(block));
    if (!store->Put(keys, values).ok()) return 1;
  }
  for (long i = 0; i < count; ++i) {
    bool ok = true;
    if (op == "ping") ok = c->Ping().ok();
    else if (op == "malloc") ok = c->MallocPhysical(4096).ok();  // + its one-way free
    else if (op == "export") ok = c->ExportToShareableHandle(exportable[i / 60]).ok();
    else if (op == "import") ok = importer->ImportFromShareableHandle(*token).ok();  // + free
    else if (op == "connect")
      ok = Client::Connect({socket, "script-connect"}).ok();  // + goodbye and close
    else if (op == "kv_get64") {
      auto got = store->Get(keys);  // + its release
      ok = got.ok() && got->leading() == keys.size();
    }
    else return 2;
    if (!ok) return 1;
  }
  return c->Ping().ok() ? 0 : 1;  // every one-way release has been handled
}
