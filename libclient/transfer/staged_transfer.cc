#include "transfer/staged_transfer.h"

#include <sys/mman.h>

#include <future>
#include <optional>

#include "client/device_vmm.h"

namespace membroker::detail {

StagedTransfer::~StagedTransfer() {
  for (int b = 0; b < 2; ++b) {
    if (buffers_[b] == nullptr) continue;
    if (pinned_[b]) (void)device::UnregisterHost(buffers_[b]);
    ::munmap(buffers_[b], kBufferBytes);
  }
}

Status StagedTransfer::Allocate() {
  for (int b = 0; b < 2; ++b) {
    if (buffers_[b] != nullptr) continue;
    void* p = ::mmap(nullptr, kBufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return Status(ErrorCode::kResourceExhausted, "no host memory for a staging buffer of device memory's transfers");
    buffers_[b] = static_cast<unsigned char*>(p);
    // Pinned where this thread is a CUDA program's; else the copies still
    // work, through the driver's own bounce buffers.
    Result<bool> pinned = device::RegisterHost(p, kBufferBytes);
    pinned_[b] = pinned.ok() && *pinned;
  }
  return Status::Ok();
}

std::vector<StagedTransfer::Batch> StagedTransfer::Batches(const std::vector<DeviceDesc>& descs) {
  std::vector<Batch> out(1);
  size_t used = 0;
  for (const DeviceDesc& d : descs) {
    for (size_t done = 0; done < d.len;) {
      if (used == kBufferBytes) {
        out.emplace_back();
        used = 0;
      }
      const size_t n = std::min(d.len - done, kBufferBytes - used);
      out.back().push_back(Piece{d.device_addr + done, d.remote_addr + done, n, used, d.device});
      used += n;
      done += n;
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

Status StagedTransfer::CopyOut(const Batch& batch, int b) {
  for (const Piece& p : batch)
    MB_RETURN_IF_ERROR(device::Copy(reinterpret_cast<uintptr_t>(buffers_[b] + p.staged), false, p.device_addr, true,
                                    p.len, p.device));
  return Status::Ok();
}

Status StagedTransfer::CopyIn(const Batch& batch, int b) {
  for (const Piece& p : batch)
    MB_RETURN_IF_ERROR(device::Copy(p.device_addr, true, reinterpret_cast<uintptr_t>(buffers_[b] + p.staged), false,
                                    p.len, p.device));
  return Status::Ok();
}

std::vector<TransferOpDesc> StagedTransfer::Wire(const Batch& batch, int b) const {
  std::vector<TransferOpDesc> out;
  out.reserve(batch.size());
  for (const Piece& p : batch)
    out.push_back(TransferOpDesc{reinterpret_cast<uintptr_t>(buffers_[b] + p.staged), p.remote_addr, p.len});
  return out;
}

Status StagedTransfer::Run(Transport& transport, uint64_t conn, TransferOp op, const std::vector<DeviceDesc>& descs,
                           Clock::time_point deadline) {
  std::lock_guard<std::mutex> lk(mu_);
  MB_RETURN_IF_ERROR(Allocate());
  const std::vector<Batch> batches = Batches(descs);
  // The transport's side of one batch, on a thread of its own so that the
  // driver's copy of the next (or the last) batch overlaps it.
  std::optional<std::future<Status>> network;
  auto send = [&](size_t i) {
    network = std::async(std::launch::async, [&transport, conn, op, deadline, wire = Wire(batches[i], i % 2)] {
      return transport.Transfer(conn, op, wire, deadline);
    });
  };
  // Every return waits for the batch in flight: its buffer is ours again.
  auto landed = [&]() -> Status {
    if (!network) return Status::Ok();
    Status st = network->get();
    network.reset();
    return st;
  };
  Status st;
  if (op == WRITE) {
    // copy 0, send 0 | copy 1, wait 0, send 1 | copy 2 (into 0's buffer), wait 1, ...
    for (size_t i = 0; i < batches.size() && st.ok(); ++i) {
      st = CopyOut(batches[i], i % 2);
      Status sent = landed();
      if (st.ok()) st = sent;
      if (st.ok()) send(i);
    }
    Status sent = landed();
    return st.ok() ? sent : st;
  }
  // READ: fetch 0 | wait 0, fetch 1, copy 0 in | wait 1, fetch 2 (into 0's buffer), copy 1 in, ...
  if (!batches.empty()) send(0);
  for (size_t i = 0; i < batches.size() && st.ok(); ++i) {
    st = landed();
    if (st.ok() && i + 1 < batches.size()) send(i + 1);
    if (st.ok()) st = CopyIn(batches[i], i % 2);
  }
  Status fetched = landed();
  return st.ok() ? fetched : st;
}

}  // namespace membroker::detail
