// KV-cache store batches against their floors, measured in the same run
// (docs/KV.md). For blocks of 16 KiB and 256 KiB in batches of 1, 64 and 256:
//  - get: KvStore::Get (leases), every byte read, the leases released; its
//    floor is one broker round trip (Ping) plus reading the same bytes - the
//    very blocks, through the mapping the client made once (so both read the
//    same pages: on this VM two sets of fresh pages can read the same bytes
//    at speeds 1.5-2x apart);
//  - acquire: the same Get without reading, against one round trip;
//  - put: Reserve, fill the staging blocks, Seal (the broker copies them in),
//    into a store kept full (each batch evicts the oldest); its floor is one
//    round trip plus writing the bytes once;
//  - put p99 in a store kept full (eviction on every batch) against one with room.
// With --disk-broker, a broker of its own with a disk tier (--kv-disk):
//  - disk get: a batch of 64 blocks evicted to the disk, read back by a Get
//    (promoted), every byte read; against the same Get once they are in
//    memory, and against its floor: one round trip plus pread of the same
//    bytes from 64 files of the same filesystem;
//  - put into a full store with a disk tier (each eviction written out).
// Prints one JSON line per case; asserts nothing.
//   bench_kv --socket PATH [--quick] [--disk-broker MEMBROKERD] [--only BLOCK BATCH]
//            [--batches-only | --no-batches] [--cpus LABEL]
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "broker_launch.h"
#include "membroker/client.h"
#include "membroker/ipc/admin_client.h"
#include "membroker/kv_store.h"
#include "payload.h"

using namespace membroker;
using bench::Median;
using Clock = std::chrono::steady_clock;

namespace {

void Check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "bench_kv: %s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Reads every 8-byte word (the reader's work, which the floor does too), with
// the one out-of-line loop every bench reads with (bench/payload.h): a copy
// inlined in each caller ran at one or two cycles per 16 bytes by where it fell.
uint64_t ReadAll(const std::byte* p, size_t n) { return bench::Sum(p, n); }

// 32-byte keys, as content hashes are ("key-000...0123"): a key past 15 bytes
// is a heap string in the client and the broker, which shorter keys hide.
std::vector<std::string> KeysFrom(size_t first, size_t n) {
  std::vector<std::string> out;
  for (size_t i = first; i < first + n; ++i) {
    std::string k = std::to_string(i);
    out.push_back("key-" + std::string(28 - k.size(), '0') + k);
  }
  return out;
}

double P99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 99 / 100)];
}

volatile uint64_t g_sink;

// Waits (bounded) until the broker's disk tier writes nothing.
void WaitForDiskWrites(const std::string& admin) {
  for (int i = 0; i < 30000; ++i) {
    auto r = ipc::AskAdmin(admin, "stats --json");
    if (r.ok() && r->find("\"kv_disk_writing\": 0,") != std::string::npos) return;
    ::usleep(1000);
  }
  std::fprintf(stderr, "bench_kv: the disk tier did not finish its writes\n");
  std::exit(1);
}

// The disk tier's cases, against a broker of their own (see the top).
void DiskTier(const std::string& binary, bool quick) {
  char tmpl[] = "/var/tmp/membroker-bench-kv.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string socket = dir + "/d.sock";
  const pid_t broker = bench::LaunchBroker(binary, {"--socket", socket, "--kv-disk", dir + "/tier",
                                                    "--kv-disk-bytes", "8G", "--log-level", "warn"});
  auto c = Client::Connect({socket, "bench-kv-disk"});
  Check(c.status(), "connect (disk)");
  const size_t batch = 64;
  for (size_t block : {size_t{16} << 10, size_t{256} << 10}) {
    const int rounds = quick ? 8 : 24;
    const std::string name = "bench/disk/" + std::to_string(block);
    auto store = KvStore::Create(*c, name, {.block_size = block, .capacity = batch * 4 * block});
    Check(store.status(), "Create");
    std::vector<std::byte> source(batch * block, std::byte{9});
    std::vector<std::span<const std::byte>> values(batch, std::span<const std::byte>(source.data(), block));
    // 4 batches to warm up with, rounds batches to read back, then 4 more
    // that push them all out to the disk.
    std::vector<double> put_s;
    for (int r = 0; r < rounds + 8; ++r) {
      auto t0 = Clock::now();
      Check(store->Put(KeysFrom(static_cast<size_t>(r) * batch, batch), values).status(), "Put");
      put_s.push_back(Seconds(Clock::now() - t0));
    }
    WaitForDiskWrites(socket + ".admin");
    // Warm up: 4 batches read back push the last 4 (in memory only) out to
    // the disk; from then on the blocks a get evicts are on the disk already,
    // as in a tier in service, and each get below is one disk hit per block.
    for (int r = 0; r < 4; ++r) Check(store->Get(KeysFrom(static_cast<size_t>(r) * batch, batch)).status(), "Get");
    WaitForDiskWrites(socket + ".admin");
    // The floor's files: the same bytes, one file per block, read with pread.
    const std::string files = dir + "/floor-" + std::to_string(block);
    ::mkdir(files.c_str(), 0700);
    for (size_t i = 0; i < batch; ++i) {
      const int fd = ::open((files + "/" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || ::write(fd, source.data(), block) != static_cast<ssize_t>(block)) std::exit(1);
      ::close(fd);
    }
    std::vector<std::byte> buffer(batch * block);
    std::vector<double> disk_s, memory_s, floor_s;
    for (int r = 0; r < rounds; ++r) {
      const auto keys = KeysFrom(static_cast<size_t>(r + 4) * batch, batch);
      auto t0 = Clock::now();
      auto got = store->Get(keys);  // from the disk
      Check(got.status(), "Get (disk)");
      if (got->leading() != batch) {
        std::fprintf(stderr, "bench_kv: %zu of %zu blocks came back from the disk\n", got->leading(), batch);
        std::exit(1);
      }
      uint64_t sum = 0;
      for (size_t i = 0; i < batch; ++i) sum += ReadAll(got->data(i).data(), got->data(i).size());
      got->Release();
      disk_s.push_back(Seconds(Clock::now() - t0));
      auto t1 = Clock::now();
      auto again = store->Get(keys);  // in memory now
      Check(again.status(), "Get (memory)");
      for (size_t i = 0; i < batch; ++i) sum += ReadAll(again->data(i).data(), again->data(i).size());
      again->Release();
      memory_s.push_back(Seconds(Clock::now() - t1));
      auto t2 = Clock::now();
      Check(c->Ping(), "Ping");
      for (size_t i = 0; i < batch; ++i) {
        const int fd = ::open((files + "/" + std::to_string(i)).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::pread(fd, buffer.data() + i * block, block, 0) != static_cast<ssize_t>(block)) std::exit(1);
        ::close(fd);
      }
      sum += ReadAll(buffer.data(), buffer.size());
      floor_s.push_back(Seconds(Clock::now() - t2));
      g_sink = sum;
    }
    std::printf(
        "{\"bench\": \"kv_disk\", \"block_bytes\": %zu, \"batch\": %zu, \"rounds\": %d, \"disk_get_us\": %.1f, "
        "\"memory_get_us\": %.1f, \"file_floor_us\": %.1f, \"put_spilling_us\": %.1f}\n",
        block, batch, rounds, Median(disk_s) * 1e6, Median(memory_s) * 1e6, Median(floor_s) * 1e6,
        Median(std::vector<double>(put_s.begin() + 4, put_s.end())) * 1e6);
    std::fflush(stdout);
    Check(KvStore::Drop(*c, name), "Drop");
  }
  ::kill(broker, SIGTERM);
  int status = 0;
  ::waitpid(broker, &status, 0);
  (void)!std::system(("rm -rf '" + dir + "'").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  bool quick = false;
  std::string disk_broker, cpus = "unpinned";
  bool batches_only = false, no_batches = false;
  size_t only_block = 0, only_batch = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) socket = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--disk-broker" && i + 1 < argc) disk_broker = argv[++i];
    if (a == "--cpus" && i + 1 < argc) cpus = argv[++i];  // where bench/run placed the processes (a label)
    if (a == "--batches-only") batches_only = true;       // no eviction or disk cases
    if (a == "--no-batches") no_batches = true;           // only those
    if (a == "--only" && i + 2 < argc) {  // one case: --only BLOCK_BYTES BATCH
      only_block = std::stoul(argv[++i]);
      only_batch = std::stoul(argv[++i]);
    }
  }
  if (socket.empty()) {
    std::fprintf(stderr, "usage: bench_kv --socket PATH [--quick]\n");
    return 2;
  }
  auto c = Client::Connect({socket, "bench-kv"});
  Check(c.status(), "connect");
  int run = 0;
  // Each case in a store of 4 KiB pages; the 16 KiB batches of 64 and 256
  // again in one of 2 MiB pages (where the kernel has them): a batch's blocks
  // lie scattered over the store's slabs, and reading 256 scattered 16 KiB
  // blocks of 4 KiB pages took 2.3x as long as reading the same bytes in one
  // range, in a bare program here (page walks; 2 MiB pages need few).
  struct Case {
    size_t block, batch;
    bool huge;
  };
  std::vector<Case> cases;
  for (size_t block : {size_t{16} << 10, size_t{256} << 10})
    for (size_t batch : {size_t{1}, size_t{64}, size_t{256}}) cases.push_back({block, batch, false});
  cases.push_back({16 << 10, 64, true});
  cases.push_back({16 << 10, 256, true});
  for (const auto& [block, batch, huge] : cases) {
    if (no_batches || (only_block != 0 && (block != only_block || batch != only_batch))) continue;
    const size_t bytes = block * batch;
    // Rounds by the bytes a get reads (about 256 MiB a side in a quick run),
    // at least 20 and at most 1024: a batch of 1 MiB gets 256 rounds, whose
    // tenths give the get's ratio a spread the report shows.
    const int rounds =
        static_cast<int>(std::clamp<uint64_t>((quick ? (256ull << 20) : (4ull << 30)) / bytes, 20, 1024));
    const std::string name = "bench/" + std::to_string(++run);
    // Eight batches of room, filled once before timing: the timed puts
    // reuse slots (warm pages) by evicting the oldest blocks, as a store in
    // service does. The keys read below are leased while the puts run.
    auto store = KvStore::Create(*c, name,
                                 {.block_size = block,
                                  .capacity = batch * 8 * block,
                                  .page_policy = huge ? PagePolicy::kHugeOnly : PagePolicy::kNormalOnly});
    if (huge && !store.ok()) {
      std::printf("{\"bench\": \"kv_skipped\", \"why\": \"no store of 2 MiB pages: %s\"}\n",
                  std::string(ErrorCodeName(store.status().code())).c_str());
      continue;
    }
    Check(store.status(), "Create");
    std::vector<std::byte> source(bytes, std::byte{7});
    std::vector<std::span<const std::byte>> values(batch, std::span<const std::byte>(source.data(), block));
    for (size_t b = 0; b < 8; ++b) Check(store->Put(KeysFrom(2'000'000 + b * batch, batch), values).status(), "fill");
    // The put floor's memory: the same number of bytes, mapped once.
    auto floor_mem = c->MallocHost(bytes);
    Check(floor_mem.status(), "MallocHost");
    auto* floor = static_cast<std::byte*>(*floor_mem);
    std::memset(floor, 3, bytes);
    auto keys = KeysFrom(0, batch);
    Check(store->Put(keys, values).status(), "Put");
    // Maps the slabs, faults the pages in, and keeps these blocks: the get
    // floor reads them through these spans.
    auto warm = store->Get(keys);
    Check(warm.status(), "Get");
    for (size_t i = 0; i < batch; ++i) g_sink = ReadAll(warm->data(i).data(), warm->data(i).size());

    std::vector<double> put_s, put_floor_s;
    for (int r = 0; r < rounds; ++r) {
      auto fresh = KeysFrom(1'000'000 + static_cast<size_t>(r) * batch, batch);
      auto t0 = Clock::now();
      auto put = store->Reserve(fresh);
      Check(put.status(), "Reserve");
      for (size_t i = 0; i < batch; ++i) std::memcpy(put->data(i).data(), source.data() + i * block, block);
      Check(store->Seal(*put), "Seal");
      put_s.push_back(Seconds(Clock::now() - t0));
      auto t1 = Clock::now();
      Check(c->Ping(), "Ping");
      std::memcpy(floor, source.data(), bytes);
      put_floor_s.push_back(Seconds(Clock::now() - t1));
    }
    std::vector<double> get_s, get_floor_s, acquire_s, rt_s;
    auto get = [&] {
      auto t0 = Clock::now();
      auto got = store->Get(keys);
      Check(got.status(), "Get");
      uint64_t sum = 0;
      for (size_t i = 0; i < batch; ++i) sum += ReadAll(got->data(i).data(), got->data(i).size());
      got->Release();
      get_s.push_back(Seconds(Clock::now() - t0));
      g_sink = sum;
    };
    auto get_floor = [&] {
      auto t1 = Clock::now();
      Check(c->Ping(), "Ping");
      uint64_t sum = 0;
      for (size_t i = 0; i < batch; ++i) sum += ReadAll(warm->data(i).data(), warm->data(i).size());
      get_floor_s.push_back(Seconds(Clock::now() - t1));
      g_sink = sum;
    };
    // Three rounds untimed first: the first reads of a round after the puts
    // ran 2-5x slower than the later ones (caches and the VM settling).
    for (int r = 0; r < 3; ++r) {
      get();
      get_floor();
    }
    get_s.clear();
    get_floor_s.clear();
    for (int r = 0; r < rounds; ++r) {  // in turns, so neither always follows the other
      if (r % 2 == 0) {
        get();
        get_floor();
      } else {
        get_floor();
        get();
      }
    }
    // Acquire and its round trip, in pairs (they read no bytes, so many
    // pairs are cheap and their medians steady on a noisy VM), each right
    // after another request, so both find the broker awake (on a VM, a
    // request that wakes an idle vCPU can cost milliseconds).
    for (int r = 0; r < (quick ? 200 : 1000); ++r) {
      Check(c->Ping(), "Ping");
      auto t2 = Clock::now();
      auto leased = store->Get(keys);
      acquire_s.push_back(Seconds(Clock::now() - t2));
      leased->Release();
      auto t3 = Clock::now();
      Check(c->Ping(), "Ping");
      rt_s.push_back(Seconds(Clock::now() - t3));
    }
    warm->Release();
    // The ratio of each tenth of the rounds or pairs (their spread in the report).
    auto tenths = [](const std::vector<double>& op, const std::vector<double>& base) {
      std::string out;
      const size_t tenth = op.size() / 10;
      for (size_t t = 0; t < 10; ++t) {
        auto part = [&](const std::vector<double>& v) {
          return Median(std::vector<double>(v.begin() + t * tenth, v.begin() + (t + 1) * tenth));
        };
        out += (t ? ", " : "") + std::to_string(part(op) / part(base));
      }
      return out;
    };
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf(
        "{\"bench\": \"kv\", \"cpus\": \"%s\", \"pages\": \"%s\", \"block_bytes\": %zu, \"batch\": %zu, \"rounds\": %d, \"get_us\": "
        "%.1f, "
        "\"get_floor_us\": %.1f, \"get_gbps\": %.2f, \"acquire_us\": %.1f, \"round_trip_us\": %.1f, "
        "\"put_us\": %.1f, \"put_floor_us\": %.1f, \"put_gbps\": %.2f, \"acquire_pairs\": %zu, "
        "\"acquire_tenths\": [%s], \"get_tenths\": [%s]}\n",
        cpus.c_str(), huge ? "2M" : "4K", block, batch, rounds, Median(get_s) * 1e6, Median(get_floor_s) * 1e6, gb / Median(get_s),
        Median(acquire_s) * 1e6, Median(rt_s) * 1e6, Median(put_s) * 1e6, Median(put_floor_s) * 1e6, gb / Median(put_s),
        acquire_s.size(), tenths(acquire_s, rt_s).c_str(), tenths(get_s, get_floor_s).c_str());
    std::fflush(stdout);
    Check(c->FreeHost(floor), "FreeHost");
    Check(KvStore::Drop(*c, name), "Drop");
  }
  // Eviction's cost on put latency: batches of 64 x 16 KiB into a store of
  // 1024 blocks kept full (every batch past the watermark evicts), against
  // the same puts into a store with room for all of them.
  for (bool full : {false, true}) {
    if (only_block != 0 || batches_only) break;
    const size_t block = 16 << 10, batch = 64, rounds = quick ? 200 : 1000;
    const size_t blocks = full ? 1024 : rounds * batch + 64;
    const std::string name = full ? "bench/full" : "bench/room";
    auto store = KvStore::Create(*c, name, {.block_size = block, .capacity = blocks * block});
    Check(store.status(), "Create");
    std::vector<std::byte> source(block, std::byte{5});
    std::vector<std::span<const std::byte>> values(batch, std::span<const std::byte>(source));
    std::vector<double> s;
    for (size_t r = 0; r < rounds; ++r) {
      auto keys = KeysFrom(r * batch, batch);
      auto t0 = Clock::now();
      auto codes = store->Put(keys, values);
      s.push_back(Seconds(Clock::now() - t0));
      Check(codes.status(), "Put");
    }
    std::printf("{\"bench\": \"kv_eviction\", \"full\": %s, \"rounds\": %zu, \"put_p50_us\": %.1f, \"put_p99_us\": %.1f}\n",
                full ? "true" : "false", rounds, Median(s) * 1e6, P99(s) * 1e6);
    std::fflush(stdout);
    Check(KvStore::Drop(*c, name), "Drop");
  }
  if (!disk_broker.empty() && only_block == 0 && !batches_only) DiskTier(disk_broker, quick);
  return 0;
}
