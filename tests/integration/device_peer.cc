// A second process for the device tests (device_test.cc): a fresh process, as
// CUDA needs (a forked child of a process that initialised the driver cannot
// use it). It imports an exported device allocation through membroker, maps
// it into a device reservation, and checks or writes its bytes with the
// driver's copies, never by touching device memory from the CPU.
//
//   device_peer SOCKET TOKEN SEED check     every byte is Pattern(SEED); then
//                                           writes Pattern(SEED + 1); "OK"
//   device_peer SOCKET TOKEN SEED readonly  checks, and a read-write access or
//                                           a write is refused; "OK"
//   device_peer SOCKET TOKEN SEED hold      checks, prints "HOLDING", and
//                                           waits for stdin to close (or SIGKILL)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "membroker/client.h"
#include "membroker/ipc/cuda_api.h"

namespace {

unsigned char Pattern(size_t i, unsigned seed) { return static_cast<unsigned char>(i * 131 + seed); }

int Fail(const std::string& why) {
  std::printf("FAIL %s\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace membroker;
  if (argc != 5) return Fail("usage: device_peer SOCKET TOKEN SEED check|readonly|hold");
  const std::string mode = argv[4];
  const unsigned seed = static_cast<unsigned>(std::atoi(argv[3]));
  auto c = Client::Connect({argv[1], "device_peer"});
  if (!c.ok()) return Fail(c.status().ToString());
  auto h = c->ImportFromShareableHandle(argv[2]);
  if (!h.ok()) return Fail("import: " + h.status().ToString());
  if (h->device() < 0) return Fail("the import is not device memory");
  const ipc::CudaDriver::Api& cu = *ipc::CudaDriver::Get().api();
  CUcontext ctx = nullptr;
  if (cu.cuDevicePrimaryCtxRetain(&ctx, h->device()) != CUDA_SUCCESS || cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return Fail("no context on the device");
  auto r = c->ReserveMemAddress(h->size(), 0, nullptr, kReserveDevice);
  if (!r.ok()) return Fail("reserve: " + r.status().ToString());
  auto m = c->MapMem(r->base(), h->size(), 0, *h);
  if (!m.ok()) return Fail("map: " + m.status().ToString());
  const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(m->data());
  std::vector<unsigned char> bytes(h->size());
  if (CUresult rc = cu.cuMemcpyDtoH(bytes.data(), va, bytes.size()); rc != CUDA_SUCCESS)
    return Fail("cuMemcpyDtoH: " + std::to_string(rc));
  for (size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != Pattern(i, seed)) return Fail("byte " + std::to_string(i) + " differs");

  if (mode == "check") {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = Pattern(i, seed + 1);
    if (CUresult rc = cu.cuMemcpyHtoD(va, bytes.data(), bytes.size()); rc != CUDA_SUCCESS)
      return Fail("cuMemcpyHtoD: " + std::to_string(rc));
  } else if (mode == "readonly") {
    if (!h->read_only()) return Fail("the import is not read-only");
    Status rw = c->MemSetAccess(m->data(), h->size(), Access::kReadWrite);
    if (rw.code() != ErrorCode::kPermissionDenied) return Fail("read-write access was not refused: " + rw.ToString());
  } else if (mode == "hold") {
    std::printf("HOLDING\n");
    std::fflush(stdout);
    char b;
    while (::read(0, &b, 1) > 0) {
    }
  }
  if (!c->UnmapMem(*m).ok() || !c->ReleaseMemAddress(*r).ok() || !c->FreePhysical(*h).ok()) return Fail("teardown");
  std::printf("OK\n");
  return 0;
}
