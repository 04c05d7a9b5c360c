// Device memory to and from an engine of another broker over UCX (the staged
// path, libclient/transfer/staged_transfer.h; and device to device, where the
// peer's transport copies its side with its driver), against its two floors in the
// same run: the same transfer from host memory over the same connection (what
// the network alone costs) and the driver's copy between device memory and a
// host buffer (what staging alone costs). Two brokers on this machine, an
// engine at each, connected over loopback as engines of two hosts are; the
// cases alternate within each round.
//   bench_device_transfer --broker MEMBROKERD [--sizes 64M,1G] [--rounds N] [--quick]
// Prints one JSON object per (case, size) with the median GB/s.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "broker_launch.h"
#include "membroker/client.h"
#include "membroker/ipc/cuda_api.h"
#include "membroker/transfer_engine.h"
#include "payload.h"

using namespace membroker;
using Clock = std::chrono::steady_clock;

namespace {

using bench::Median;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_device_transfer: %s\n", why.c_str());
  std::exit(1);
}
void Check(const Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + st.ToString());
}
template <typename T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(*r);
}

// Memory of one side: device memory mapped into a device reservation, and
// host memory of the same size, both from its broker.
struct Side {
  PhysicalHandle dev_handle, host_handle;
  Reservation dev_range, host_range;
  Mapping dev, host;
  void Make(Client& c, size_t size) {
    AllocationProp prop;
    prop.location = MemLocation{MemLocation::kDevice, 0};
    dev_handle = Must(c.MallocPhysical(size, prop), "MallocPhysical (device)");
    dev_range = Must(c.ReserveMemAddress(size, 0, nullptr, kReserveDevice), "ReserveMemAddress (device)");
    dev = Must(c.MapMem(dev_range.base(), size, 0, dev_handle), "MapMem (device)");
    host_handle = Must(c.MallocPhysical(size), "MallocPhysical (host)");
    host_range = Must(c.ReserveMemAddress(size), "ReserveMemAddress (host)");
    host = Must(c.MapMem(host_range.base(), size, 0, host_handle), "MapMem (host)");
  }
  uintptr_t dev_addr() const { return reinterpret_cast<uintptr_t>(dev.data()); }
  uintptr_t host_addr() const { return reinterpret_cast<uintptr_t>(host.data()); }
};

}  // namespace

int main(int argc, char** argv) {
  std::string broker, sizes = "64M,1G";
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--broker" && i + 1 < argc) broker = argv[++i];
    else if (a == "--sizes" && i + 1 < argc) sizes = argv[++i];
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick") rounds = 2;
    else Die("usage: bench_device_transfer --broker MEMBROKERD [--sizes 64M,1G] [--rounds N] [--quick]");
  }
  if (broker.empty()) Die("--broker MEMBROKERD is required");
  const std::string dir = "/tmp/membroker-devxfer-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0700) != 0) Die("mkdir " + dir);
  const std::string here = dir + "/here.sock", there = dir + "/there.sock", secret = dir + "/secret";
  std::ofstream(secret) << "device-transfer-bench\n";
  if (::chmod(secret.c_str(), 0600) != 0) Die("chmod " + secret);
  const pid_t b1 = bench::LaunchBroker(broker, {"--socket", here, "--log-level", "warn"});
  const pid_t b2 = bench::LaunchBroker(broker, {"--socket", there, "--log-level", "warn"});

  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  if (!driver.Available().ok()) Die(driver.Available().ToString());
  const ipc::CudaDriver::Api& cu = *driver.api();
  CUcontext ctx = nullptr;
  if (cu.cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    Die("no context on device 0");

  const std::vector<size_t> list = bench::ParseSizes(sizes);
  const size_t g = Must(driver.Granularity(0, false), "granularity");
  int failed = 0;
  for (size_t size : list) {
    size = (size + g - 1) / g * g;
    Client a = Must(Client::Connect({here, "xfer-listener"}), "Connect");
    Client r = Must(Client::Connect({there, "xfer-initiator"}), "Connect");
    Side la, lr;
    la.Make(a, size);
    lr.Make(r, size);
    TransferEngine ea(a), er(r);
    Check(ea.Initialize("xfer-listener", {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret}}), "Initialize");
    Check(er.Initialize("xfer-initiator", {{"secret_file", secret}}), "Initialize");
    MemHandle m1, m2, m3, m4;
    Check(ea.RegisterMem({la.host_addr(), size}, MEM_HOST, m1), "RegisterMem");
    Check(ea.RegisterMem({la.dev_addr(), size}, MEM_DEVICE, m4), "RegisterMem");
    Check(er.RegisterMem({lr.host_addr(), size}, MEM_HOST, m2), "RegisterMem");
    Check(er.RegisterMem({lr.dev_addr(), size}, MEM_DEVICE, m3), "RegisterMem");
    NetworkStats ns;
    Check(ea.GetNetworkStats(ns), "GetNetworkStats");
    Check(er.Connect(ns.listen_address, 30000), "Connect");
    // A pinned host buffer for the copy floor, as the staging buffers are.
    std::vector<unsigned char> bounce(size);
    const bool pinned = cu.cuMemHostRegister(bounce.data(), size, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;

    struct Case {
      const char* name;
      std::function<Status()> run;
    };
    const std::string peer = ns.listen_address;
    std::vector<Case> cases = {
        {"write_host", [&] { return er.TransferSync(peer, WRITE, {{lr.host_addr(), la.host_addr(), size}}, 120000); }},
        {"write_device", [&] { return er.TransferSync(peer, WRITE, {{lr.dev_addr(), la.host_addr(), size}}, 120000); }},
        {"read_host", [&] { return er.TransferSync(peer, READ, {{lr.host_addr(), la.host_addr(), size}}, 120000); }},
        {"read_device", [&] { return er.TransferSync(peer, READ, {{lr.dev_addr(), la.host_addr(), size}}, 120000); }},
        // Device to device: staged here, copied by the peer's transport there.
        {"write_device_to_device",
         [&] { return er.TransferSync(peer, WRITE, {{lr.dev_addr(), la.dev_addr(), size}}, 120000); }},
        {"read_device_from_device",
         [&] { return er.TransferSync(peer, READ, {{lr.dev_addr(), la.dev_addr(), size}}, 120000); }},
        {"copy_dtoh", [&] {
           return cu.cuMemcpyDtoH(bounce.data(), lr.dev_addr(), size) == CUDA_SUCCESS
                      ? Status::Ok()
                      : Status(ErrorCode::kInternal, "cuMemcpyDtoH");
         }},
    };
    std::vector<std::vector<double>> gbps(cases.size());
    for (int round = 0; round < rounds + 1; ++round) {  // the first round warms up
      for (size_t k = 0; k < cases.size(); ++k) {
        const auto t0 = Clock::now();
        Status st = cases[k].run();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!st.ok()) {
          std::fprintf(stderr, "bench_device_transfer: %s: %s\n", cases[k].name, st.ToString().c_str());
          ++failed;
          continue;
        }
        if (round > 0) gbps[k].push_back(size / s / 1e9);
      }
    }
    for (size_t k = 0; k < cases.size(); ++k)
      if (!gbps[k].empty())
        std::printf("{\"bench\":\"device_transfer\",\"case\":\"%s\",\"size\":%zu,\"rounds\":%zu,\"gb_per_s\":%.2f%s}\n",
                    cases[k].name, size, gbps[k].size(), Median(gbps[k]),
                    std::string(cases[k].name) == "copy_dtoh" ? (pinned ? ",\"pinned\":true" : ",\"pinned\":false") : "");
    std::fflush(stdout);
    if (pinned) (void)cu.cuMemHostUnregister(bounce.data());
    er.Finalize();
    ea.Finalize();
  }
  ::kill(b1, SIGTERM);
  ::kill(b2, SIGTERM);
  ::waitpid(b1, nullptr, 0);
  ::waitpid(b2, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // the secret, and the state files the brokers leave by their sockets
  return failed == 0 ? 0 : 1;
}
