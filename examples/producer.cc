// Producer: allocates broker memory, fills it, exports it to one consumer pid,
// prints the token, and exits when told to (its memory outlives it as long as
// the consumer holds it).
//   producer --socket PATH --consumer-pid PID [--size BYTES]
// stdout: "TOKEN <token> <bytes>"; then waits for a line on stdin before exiting.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "membroker/client.h"
#include "pattern.h"

using namespace membroker;

static int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "producer: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  std::string socket;
  pid_t consumer = 0;
  size_t size = 64 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--socket")) socket = argv[i + 1];
    else if (!std::strcmp(argv[i], "--consumer-pid")) consumer = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--size")) size = std::strtoull(argv[i + 1], nullptr, 10);
  }
  if (socket.empty() || consumer <= 0) {
    std::fprintf(stderr, "usage: producer --socket PATH --consumer-pid PID [--size BYTES]\n");
    return 2;
  }

  auto client = Client::Connect({socket, "example-producer"});
  if (!client.ok()) return Fail("connect", client.status());

  // 1. Round the size to the allocation granularity, as CANN users do.
  AllocationProp prop;
  auto gran = client->GetAllocationGranularity(prop, GranularityOption::kMinimum);
  if (!gran.ok()) return Fail("granularity", gran.status());
  size = (size + *gran - 1) / *gran * *gran;

  // 2. Physical memory in the broker, 3. an address range of our own, 4. map.
  auto t0 = std::chrono::steady_clock::now();
  auto handle = client->MallocPhysical(size, prop);
  if (!handle.ok()) return Fail("MallocPhysical", handle.status());
  auto range = client->ReserveMemAddress(size);
  if (!range.ok()) return Fail("ReserveMemAddress", range.status());
  auto mapping = client->MapMem(range->base(), size, 0, *handle);
  if (!mapping.ok()) return Fail("MapMem", mapping.status());

  // 5. Write the data.
  examples::FillPattern(mapping->data(), size, /*seed=*/42);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // 6. Share it with the consumer process only.
  auto token = client->ExportToShareableHandle(*handle);
  if (!token.ok()) return Fail("ExportToShareableHandle", token.status());
  pid_t allowed[] = {consumer};
  if (Status st = client->SetPidToShareableHandle(*token, allowed); !st.ok())
    return Fail("SetPidToShareableHandle", st);
  std::fprintf(stderr, "producer: allocated, mapped and filled %zu MiB in %.1f ms (allocation %llu)\n",
               size >> 20, ms, static_cast<unsigned long long>(handle->id()));
  std::printf("TOKEN %s %zu\n", token->c_str(), size);
  std::fflush(stdout);

  std::string line;
  std::getline(std::cin, line);  // told to exit: mapping, handle and client close here
  std::fprintf(stderr, "producer: exiting; the consumer keeps the memory alive\n");
  return 0;
}
