// Device memory requests on any machine (ctest label "device"). Without a GPU
// (no libcuda.so.1, or no device) every device request answers UNSUPPORTED
// with the reason and changes nothing; with one, device N's absence is named
// and allocation itself says it is not built yet (docs/MEMORY.md).
#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"
#include "membroker/ipc/cuda_driver.h"

namespace membroker::testing {
namespace {

AllocationProp OnDevice(int id) {
  AllocationProp p;
  p.location = MemLocation{MemLocation::kDevice, id};
  return p;
}

TEST(Device, RequestsSayWhyDeviceMemoryIsUnavailableAndChangeNothing) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "device"});
  ASSERT_TRUE(c.ok());
  const ipc::CudaDriver& driver = ipc::CudaDriver::Get();
  std::printf("CUDA here: %s (%d devices, driver %d)\n", driver.Available().ToString().c_str(), driver.device_count(),
              driver.driver_version());

  auto h = c->MallocPhysical(2 << 20, OnDevice(0));
  EXPECT_EQ(h.code(), ErrorCode::kUnsupported) << h.status().ToString();
  auto g = c->GetAllocationGranularity(OnDevice(0), GranularityOption::kMinimum);
  if (!driver.Available().ok()) {
    // The broker's reason is the driver's: no libcuda, no device, no headers.
    EXPECT_NE(h.status().message().find("device memory is unavailable here"), std::string::npos) << h.status().ToString();
    EXPECT_EQ(g.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(g.status().message(), driver.Available().message());
  } else {
    EXPECT_NE(h.status().message().find("not implemented"), std::string::npos) << h.status().ToString();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_GT(*g, 0u);
  }
  // A device this machine does not have is named.
  const int missing = driver.device_count() + 3;
  auto none = c->MallocPhysical(4096, OnDevice(missing));
  EXPECT_EQ(none.code(), ErrorCode::kUnsupported);
  if (driver.Available().ok()) {
    EXPECT_NE(none.status().message().find("no CUDA device " + std::to_string(missing)), std::string::npos);
  }
  EXPECT_EQ(c->MallocPhysical(4096, OnDevice(-5)).code(), ErrorCode::kParamInvalid);
  // Nothing was made, nothing is charged, and host memory works as before.
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("bytes_allocated"), 0u);
  EXPECT_TRUE(c->MallocPhysical(4096).ok());
  EXPECT_TRUE(c->Ping().ok());
}

}  // namespace
}  // namespace membroker::testing
