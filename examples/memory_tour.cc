// A tour of the memory features, one short section each: page policies and
// huge pages, pinned host memory, host register, same-address mappings, and
// what pools and quotas look like to a client.
//   memory_tour --socket PATH
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "membroker/client.h"

using namespace membroker;

namespace {
void Show(const char* what, const Status& st) {
  std::printf("  %-44s %s\n", what, st.ok() ? "ok" : st.ToString().c_str());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "--socket") != 0) {
    std::fprintf(stderr, "usage: memory_tour --socket PATH\n");
    return 2;
  }
  auto client = Client::Connect({argv[2], "memory-tour"});
  if (!client.ok()) {
    std::fprintf(stderr, "memory_tour: %s\n", client.status().ToString().c_str());
    return 1;
  }
  Client& c = *client;

  std::printf("1. Page policies (CANN semantics)\n");
  for (auto [name, policy] : {std::pair{"NORMAL_ONLY", PagePolicy::kNormalOnly},
                              std::pair{"HUGE_FIRST", PagePolicy::kHugeFirst},
                              std::pair{"HUGE_ONLY", PagePolicy::kHugeOnly}}) {
    auto h = c.MallocPhysical(3 << 20, AllocationProp{policy});
    if (h.ok())
      std::printf("  %-12s 3 MiB -> %zu bytes in %zu-byte pages%s\n", name, h->size(),
                  h->page_size(), h->fell_back() ? " (fell back: no free huge pages)" : "");
    else
      std::printf("  %-12s 3 MiB -> %s\n", name, h.status().ToString().c_str());
  }

  std::printf("2. Pinned host memory (MallocHost / FreeHost)\n");
  auto host = c.MallocHost(1 << 20);
  Show("MallocHost(1 MiB): locked by the broker", host.status());
  if (host.ok()) {
    std::memset(*host, 1, 1 << 20);
    Show("FreeHost", c.FreeHost(*host));
  }

  std::printf("3. Host register: pin this process's own buffer\n");
  void* own = std::aligned_alloc(4096, 64 << 10);
  std::memset(own, 0, 64 << 10);
  Show("HostRegister(64 KiB)", c.HostRegister(own, 64 << 10));
  Show("HostRegister(unaligned pointer)", c.HostRegister(static_cast<char*>(own) + 8, 4096));
  Show("HostUnregister", c.HostUnregister(own));
  std::free(own);

  std::printf("4. Same-address mapping: raw pointers stay valid in every process\n");
  AllocationProp same;
  same.same_address = true;
  auto shared = c.MallocPhysical(2 << 20, same);
  Show("MallocPhysical(same_address)", shared.status());
  if (shared.ok()) {
    auto range = c.ReserveMemAddress(shared->size(), 0, shared->fixed_address(), kReserveFixed);
    Show("ReserveMemAddress(at fixed_address, kReserveFixed)", range.status());
    if (range.ok()) {
      auto m = c.MapMem(range->base(), shared->size(), 0, *shared);
      Show("MapMem", m.status());
      if (m.ok()) std::printf("  mapped at %p, the same address in every importer\n", m->data());
    }
  }

  std::printf("5. Pools and quotas are broker settings; a client sees them as:\n");
  auto pooled = c.MallocPhysical(2 << 20);
  if (pooled.ok())
    std::printf("  2 MiB allocation %s a pool\n", pooled->from_pool() ? "came from" : "did not come from");
  else
    std::printf("  2 MiB allocation refused: %s\n", pooled.status().ToString().c_str());
  return 0;
}
