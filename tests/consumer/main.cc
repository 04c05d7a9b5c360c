// Connects to the broker given on the command line, allocates, maps and writes.
#include <cstdio>
#include <cstring>

#include <membroker/client.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto c = membroker::Client::Connect({argv[1], "installed-consumer"});
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  auto h = c->MallocPhysical(4096);
  auto r = c->ReserveMemAddress(4096);
  if (!h.ok() || !r.ok()) return 1;
  auto m = c->MapMem(r->base(), 4096, 0, *h);
  if (!m.ok()) return 1;
  std::memset(m->data(), 7, 4096);
  std::printf("installed library works: allocation %llu\n", static_cast<unsigned long long>(h->id()));
  return 0;
}
