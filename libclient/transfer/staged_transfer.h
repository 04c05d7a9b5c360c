// Device memory to and from an engine of another host: the "ucx+staged" way.
// The network transport moves host memory only (Debian's UCX 1.13 has no
// CUDA transport), so the descriptors whose local side is device memory go
// through two host staging buffers: for a WRITE the driver copies a batch of
// device ranges into one buffer while the transport sends the other; for a
// READ the transport fills one buffer while the driver copies the other into
// device memory. A batch gathers several small descriptors (KV blocks) into
// one buffer and one transport call; a long descriptor takes several batches.
// The buffers are registered with the driver (pinned) where the first staged
// transfer's thread is a CUDA program's, so the copies run at full speed.
// One staged transfer runs at a time per engine (they share the buffers).
// A remote side in the peer's device memory is the peer's to copy: its
// transport moves each piece with its driver (ucx_transport.cc, MoveDevice).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "membroker/status.h"
#include "membroker/transfer_engine.h"
#include "transfer/transport.h"

namespace membroker::detail {

// One descriptor whose local side is device memory on `device`.
struct DeviceDesc {
  uintptr_t device_addr = 0;
  uintptr_t remote_addr = 0;
  size_t len = 0;
  int device = 0;
};

class StagedTransfer {
 public:
  using Clock = std::chrono::steady_clock;
  // Bytes of one staging buffer (there are two): the size of one batch.
  static constexpr size_t kBufferBytes = 8u << 20;

  StagedTransfer() = default;
  ~StagedTransfer();  // unpins and frees the buffers
  StagedTransfer(const StagedTransfer&) = delete;
  StagedTransfer& operator=(const StagedTransfer&) = delete;

  // Moves `descs` over `transport`'s connection `conn`; the first failure
  // (a driver copy, the transport's answer, the deadline) ends it, and no
  // buffer is in use when it returns.
  Status Run(Transport& transport, uint64_t conn, TransferOp op, const std::vector<DeviceDesc>& descs,
             Clock::time_point deadline);

 private:
  // One piece of a batch: len bytes at device_addr, at `staged` in its buffer.
  struct Piece {
    uintptr_t device_addr;
    uintptr_t remote_addr;
    size_t len;
    size_t staged;
    int device;
  };
  using Batch = std::vector<Piece>;
  static std::vector<Batch> Batches(const std::vector<DeviceDesc>& descs);
  Status Allocate();
  // The driver's copies of a batch, between device memory and buffer `b`.
  Status CopyOut(const Batch& batch, int b);  // device -> buffer (WRITE)
  Status CopyIn(const Batch& batch, int b);   // buffer -> device (READ)
  // The batch as the transport's descriptors, local side in buffer `b`.
  std::vector<TransferOpDesc> Wire(const Batch& batch, int b) const;

  std::mutex mu_;  // one staged transfer at a time
  unsigned char* buffers_[2] = {nullptr, nullptr};
  bool pinned_[2] = {false, false};
};

}  // namespace membroker::detail
