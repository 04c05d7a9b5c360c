// Asks the CUDA driver the questions its documentation leaves open
// (shared/reference/cuda-vmm-double.md, "Left to the device") and prints the
// answers as one JSON object, for scripts/device-check. Against the driver
// double it prints the double's answers, which is the dry run: on a GPU, each
// answer that differs from the double's is a rule to encode in the double.
//
//   driver_probe            all questions, on device 0
//   driver_probe exporter   (internal) creates, exports, sends the fd on fd 3, exits
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "membroker/ipc/cuda_api.h"

namespace {

using membroker::ipc::CudaDriver;

const CudaDriver::Api* cu = nullptr;
std::vector<std::string> fields;

std::string Name(CUresult rc) {
  const char* n = nullptr;
  if (cu->cuGetErrorName(rc, &n) != CUDA_SUCCESS || n == nullptr) return "CUresult " + std::to_string(rc);
  return n;
}
void Answer(const char* key, const std::string& json_value) { fields.push_back("\"" + std::string(key) + "\": " + json_value); }
void AnswerCode(const char* key, CUresult rc) { Answer(key, "\"" + Name(rc) + "\""); }

CUmemAllocationProp Prop(CUmemLocationType type = CU_MEM_LOCATION_TYPE_DEVICE) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = type;
  p.location.id = 0;
  p.requestedHandleTypes = type == CU_MEM_LOCATION_TYPE_DEVICE ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                                              : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

// One byte with room for one fd beside it (SCM_RIGHTS).
struct FdMessage {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
};

bool SendFd(int sock, int fd) {
  FdMessage m;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &m.msg, 0) == 1;
}

int RecvFd(int sock) {
  FdMessage m;
  if (::recvmsg(sock, &m.msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

int Exporter(size_t g) {
  CUmemAllocationProp p = Prop();
  CUmemGenericAllocationHandle h = 0;
  int fd = -1;
  if (cu->cuMemCreate(&h, g, &p, 0) != CUDA_SUCCESS) return 2;
  if (cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) return 3;
  (void)cu->cuMemRelease(h);
  return SendFd(3, fd) ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
  const CudaDriver& driver = CudaDriver::Get();
  if (!driver.Available().ok()) {
    std::printf("{\"error\": \"%s\"}\n", driver.Available().message().c_str());
    return 1;
  }
  cu = driver.api();
  size_t g = 0, rec = 0;
  CUmemAllocationProp dev = Prop();
  (void)cu->cuMemGetAllocationGranularity(&g, &dev, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  (void)cu->cuMemGetAllocationGranularity(&rec, &dev, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (argc == 2 && std::strcmp(argv[1], "exporter") == 0) return Exporter(g);

  Answer("driver_version", std::to_string(driver.driver_version()));
  Answer("devices", std::to_string(driver.device_count()));
  Answer("granularity_device_minimum", std::to_string(g));
  Answer("granularity_device_recommended", std::to_string(rec));
  size_t numa = 0;
  CUmemAllocationProp host_numa = Prop(CU_MEM_LOCATION_TYPE_HOST_NUMA);
  CUresult numa_rc = cu->cuMemGetAllocationGranularity(&numa, &host_numa, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  Answer("granularity_host_numa_minimum", numa_rc == CUDA_SUCCESS ? std::to_string(numa) : "\"" + Name(numa_rc) + "\"");

  // 6. cuMemCreate without a current context (none is current yet).
  CUmemGenericAllocationHandle h = 0;
  AnswerCode("create_without_context", cu->cuMemCreate(&h, 2 * g, &dev, 0));
  if (h == 0) {
    CUcontext ctx = nullptr;
    (void)cu->cuDevicePrimaryCtxRetain(&ctx, 0);
    (void)cu->cuCtxSetCurrent(ctx);
    if (cu->cuMemCreate(&h, 2 * g, &dev, 0) != CUDA_SUCCESS) {
      std::printf("{\"error\": \"cuMemCreate fails with a context too\"}\n");
      return 1;
    }
  }
  // 2. Error codes.
  CUmemGenericAllocationHandle bad = 0;
  AnswerCode("create_misaligned_size", cu->cuMemCreate(&bad, g + 4096, &dev, 0));
  if (bad != 0) (void)cu->cuMemRelease(bad);
  CUdeviceptr va = 0;
  (void)cu->cuMemAddressReserve(&va, 2 * g, 0, 0, 0);
  // 1. A nonzero map offset.
  CUresult offset_rc = cu->cuMemMap(va, g, g, h, 0);
  AnswerCode("map_nonzero_offset", offset_rc);
  if (offset_rc == CUDA_SUCCESS) (void)cu->cuMemUnmap(va, g);
  (void)cu->cuMemMap(va, 2 * g, 0, h, 0);
  AnswerCode("map_over_a_mapping", cu->cuMemMap(va, g, 0, h, 0));
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  AnswerCode("set_access_partial_range", cu->cuMemSetAccess(va + g, g, &d, 1));
  AnswerCode("unmap_partial_range", cu->cuMemUnmap(va, g));
  (void)cu->cuMemUnmap(va, 2 * g);
  (void)cu->cuMemAddressFree(va, 2 * g);
  // 3. Two imports of one fd.
  int fd = -1;
  (void)cu->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CUmemGenericAllocationHandle a = 0, b = 0;
  void* os = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  CUresult ia = cu->cuMemImportFromShareableHandle(&a, os, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUresult ib = cu->cuMemImportFromShareableHandle(&b, os, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  Answer("second_import_same_handle",
         ia == CUDA_SUCCESS && ib == CUDA_SUCCESS ? (a == b ? "true" : "false") : "\"" + Name(ib) + "\"");
  if (ia == CUDA_SUCCESS) (void)cu->cuMemRelease(a);
  if (ib == CUDA_SUCCESS && b != a) (void)cu->cuMemRelease(b);
  ::close(fd);
  (void)cu->cuMemRelease(h);

  // 5. Import after the exporting process died: a fresh process exports and exits.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  pid_t child = ::fork();
  if (child == 0) {
    ::dup2(sv[1], 3);
    ::execl("/proc/self/exe", argv[0], "exporter", nullptr);
    ::_exit(127);
  }
  ::close(sv[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  int dead_fd = RecvFd(sv[0]);
  ::close(sv[0]);
  if (dead_fd < 0) {
    Answer("import_after_exporter_died", "\"no fd (exporter status " + std::to_string(status) + ")\"");
  } else {
    CUmemGenericAllocationHandle late = 0;
    CUresult rc = cu->cuMemImportFromShareableHandle(&late, reinterpret_cast<void*>(static_cast<uintptr_t>(dead_fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    AnswerCode("import_after_exporter_died", rc);
    if (rc == CUDA_SUCCESS) (void)cu->cuMemRelease(late);
    ::close(dead_fd);
  }

  // 2. Releasing a handle that is not one: undefined on a GPU, so last, in a
  // child process whose crash is also an answer.
  pid_t rel = ::fork();
  if (rel == 0) {
    ::alarm(10);  // a hang is an answer too, and bounded
    ::_exit(static_cast<int>(cu->cuMemRelease(0xdeadbeef00ull)) & 0xff);
  }
  int rs = 0;
  ::waitpid(rel, &rs, 0);
  Answer("release_unknown_handle", WIFEXITED(rs) ? "\"" + Name(static_cast<CUresult>(WEXITSTATUS(rs))) + "\""
                                                 : "\"killed by signal " + std::to_string(WTERMSIG(rs)) + "\"");

  std::printf("{");
  for (size_t i = 0; i < fields.size(); ++i) std::printf("%s%s", i ? ", " : "", fields[i].c_str());
  std::printf("}\n");
  return 0;
}
