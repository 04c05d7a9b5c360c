// Loading the network module (net_transport.h): found in membroker/ beside the library
// that holds this code (libmembroker.so, wherever it was loaded from: the
// build tree, an install prefix, a Python package's rpath), once per process,
// and never unloaded (UCX keeps threads and handlers while it is mapped).
#include "transfer/net_transport.h"

#include <dlfcn.h>

#include <mutex>

namespace membroker::detail {

namespace {
struct Module {
  StartNetTransportFn start = nullptr;
  Status status = Status::Ok();
};

Module LoadModule() {
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&StartNetTransport), &self) == 0 || self.dli_fname == nullptr)
    return {nullptr, Status(ErrorCode::kInternal, "cannot tell where libmembroker was loaded from (dladdr)")};
  std::string path = self.dli_fname;
  const size_t slash = path.rfind('/');
  path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + kNetTransportModule;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return {nullptr, Status(ErrorCode::kUnsupported,
                            "engines on other hosts need the network module " + path +
                                " (built where UCX is, installed in membroker/ beside libmembroker): " + (why ? why : "not found"))};
  }
  auto start = reinterpret_cast<StartNetTransportFn>(::dlsym(handle, kNetTransportEntry));
  if (start == nullptr)
    return {nullptr, Status(ErrorCode::kInternal, path + " has no " + kNetTransportEntry + " (a module of another build)")};
  return {start, Status::Ok()};
}
}  // namespace

Result<std::unique_ptr<NetTransport>> StartNetTransport(NetOptions options) {
  static std::once_flag once;
  static Module module;
  std::call_once(once, [] { module = LoadModule(); });
  if (module.start == nullptr) return module.status;
  Result<std::unique_ptr<NetTransport>> out = Status(ErrorCode::kInternal, "the network module did not answer");
  module.start(std::move(options), &out);
  return out;
}

}  // namespace membroker::detail
