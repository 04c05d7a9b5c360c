// Consumer: imports a token, maps it read-only and checks every byte; then,
// once the producer has exited, checks again.
//   consumer --socket PATH
// stdin: "TOKEN <token> <bytes>", later any line to re-check; stdout: results.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "membroker/client.h"
#include "pattern.h"

using namespace membroker;

static int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

static bool Verify(const Mapping& m, const char* when) {
  auto t0 = std::chrono::steady_clock::now();
  size_t bad = examples::CheckPattern(m.data(), m.size(), /*seed=*/42);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (bad != SIZE_MAX) {
    std::printf("MISMATCH %s at word %zu\n", when, bad);
    return false;
  }
  std::printf("VERIFIED %s: %zu bytes correct (read in %.1f ms, %.2f GB/s)\n", when, m.size(), ms,
              m.size() / ms / 1e6);
  std::fflush(stdout);
  return true;
}

int main(int argc, char** argv) {
  std::string socket;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--socket")) socket = argv[i + 1];
  if (socket.empty()) {
    std::fprintf(stderr, "usage: consumer --socket PATH\n");
    return 2;
  }
  auto client = Client::Connect({socket, "example-consumer"});
  if (!client.ok()) return Fail("connect", client.status());

  std::string line, word, token;
  size_t size = 0;
  if (!std::getline(std::cin, line)) return 1;
  std::istringstream(line) >> word >> token >> size;
  if (word != "TOKEN") return 1;

  auto handle = client->ImportFromShareableHandle(token);
  if (!handle.ok()) return Fail("ImportFromShareableHandle", handle.status());
  auto range = client->ReserveMemAddress(handle->size());
  if (!range.ok()) return Fail("ReserveMemAddress", range.status());
  auto mapping = client->MapMem(range->base(), handle->size(), 0, *handle);
  if (!mapping.ok()) return Fail("MapMem", mapping.status());
  // Read-only from here on: a stray write would fault instead of corrupting.
  if (Status st = client->MemSetAccess(mapping->data(), mapping->size(), Access::kRead); !st.ok())
    return Fail("MemSetAccess", st);

  if (!Verify(*mapping, "while the producer lives")) return 1;
  if (!std::getline(std::cin, line)) return 1;
  if (!Verify(*mapping, "after the producer exited")) return 1;
  return 0;
}
