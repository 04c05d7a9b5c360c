// Helpers for tests of the transfer engine's network path: registered broker
// memory, a secret file, and the skip rule for builds without the module.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"

namespace membroker::testing {

struct Memory {
  PhysicalHandle handle;
  WholeMapping mem;
  MemHandle registered = nullptr;
  char* data() const { return mem.as<char>(); }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(mem.data()); }
};

inline Memory Register(Client& c, TransferEngine& e, size_t size) {
  Memory m;
  m.handle = *c.MallocPhysical(size);
  m.mem = *MapWhole(c, m.handle);
  Status st = e.RegisterMem({m.addr(), size}, MEM_HOST, m.registered);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return m;
}

inline std::string SecretFile(const std::string& dir, const std::string& text, mode_t mode = 0600) {
  const std::string path = dir + "/secret-" + std::to_string(::getpid()) + "-" + std::to_string(mode);
  std::ofstream(path) << text << "\n";
  ::chmod(path.c_str(), mode);
  return path;
}

// Initializes e as `name`, listening on 127.0.0.1 (on a port the kernel
// chooses) for holders of the secret in secret_file; its address, or "" when
// Initialize failed.
inline std::string ListenOnLoopback(TransferEngine& e, const std::string& name, const std::string& secret_file) {
  Status st = e.Initialize(name, {{"listen_address", "127.0.0.1:0"}, {"secret_file", secret_file}});
  if (!st.ok()) return "";
  NetworkStats ns;
  EXPECT_TRUE(e.GetNetworkStats(ns).ok());
  return ns.listen_address;
}

// Skipped where the build has no network module (no UCX); where it has one,
// UNSUPPORTED (the module failed to load) is a failure.
#ifdef MEMBROKER_TEST_HAVE_NET_MODULE
#define MB_UCX_OR_SKIP(st) \
  ASSERT_NE((st).code(), ErrorCode::kUnsupported) << "the network module did not load: " << (st).ToString()
#else
#define MB_UCX_OR_SKIP(st)                                                                   \
  if ((st).code() == ErrorCode::kUnsupported) GTEST_SKIP() << "built without UCX: " << (st).ToString()
#endif

}  // namespace membroker::testing
