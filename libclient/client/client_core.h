// ClientCore: the state behind a Client and every handle, reservation and
// mapping made through it - the broker connection, the fds of held
// allocations, and this process's reservations and mappings. One mutex guards
// the local state, and nothing is sent to the broker while it is held; map,
// unmap and set-access are system calls here, never round trips.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <atomic>

#include "client/process_id.h"
#include "client/connection.h"
#include "client/reattach_journal.h"
#include "client/wake_socket.h"
#include "membroker/client.h"
#include "membroker/ipc/protocol.h"

namespace membroker::detail {

struct HeldAllocation {
  ipc::UniqueFd fd;
  uint64_t size = 0;
  uint64_t page_size = 0;
  bool read_only = false;
  uint64_t fixed_address = 0;  // same-address allocations map only here
  bool pinned = false;
  bool created = false;        // made by this client (MallocPhysical), not imported
  bool detached = false;       // a new broker refused it at reattach: local only
  bool user_released = false;  // the PhysicalHandle was freed
  uint32_t mappings = 0;       // live mappings keep the broker reference
  int device = -1;             // CUDA device memory (device_vmm.h), or host memory
  uint64_t cu_handle = 0;      // its driver handle, imported at the first MapMem
};

struct MappingState {
  uint64_t size = 0;
  uint64_t handle = 0;
  uint64_t map_id = 0;
  uint64_t offset = 0;  // into the allocation
};

// Where a range registered with a transfer engine lives: handle 0 means this
// process's own memory inside a HostRegister range.
struct EngineRange {
  uint64_t handle = 0;
  uint64_t offset = 0;
  bool read_only = false;
  int device = -1;  // the CUDA device of device memory (MEM_DEVICE), or -1
};

// A range registered with this client's transfer engine, as a reattach
// registers it again: region is its id at the current broker (0 while it is
// not registered there: being registered, or deregistered and draining).
struct EngineRegistration {
  size_t size = 0;
  EngineRange where;
  uint64_t region = 0;
  std::string name;  // "" when unnamed
};

struct ReservationState {
  uint64_t size = 0;
  bool device = false;                         // device virtual addresses (kReserveDevice)
  std::map<uintptr_t, MappingState> mappings;  // by start address
};

// What every Client call returns on a default-constructed (never connected) Client.
inline Status NotConnectedClient() { return Status(ErrorCode::kNotConnected, "client is not connected"); }

class ClientCore {
 public:
  ClientCore(ipc::UniqueFd sock, const ConnectOptions& options)
      : options_(options), conn_(std::move(sock), std::chrono::milliseconds(options.call_timeout_ms)) {
    conn_.set_resend_after_hand_over(options.reattach);
  }
  ~ClientCore();

  // The first request on a connection: learns the client id and granularities.
  Status Handshake();

  // Reattach (reattach.cc): a thread that notices the broker going away and
  // reattaches to the next one on the socket.
  Status StartWatcher();
  // Called by the process's HangupWatcher when the broker hangs up: starts
  // the reattach on a thread of this client's.
  void OnHangup();
  uint64_t reattaches() const;
  ReattachReport last_reattach() const;
  Status WaitForReattach(uint64_t count, std::chrono::milliseconds timeout) const;
  // What a reattach presents again besides the handles.
  ReattachJournal& journal() { return journal_; }
  // Client::WakeFd's socket pair; presented again at each reattach.
  WakeSocket& wake() { return wake_; }
  Result<int> WakeFd();  // Client::WakeFd: the pair, made and given to the broker on first use

  Connection& conn() { return conn_; }
  uint64_t client_id() const { return client_id_; }
  const std::string& cluster_host() const { return cluster_host_; }
  Result<size_t> Granularity(PagePolicy policy, GranularityOption option) const;

  // Records a handle the broker just gave this client.
  void AddHandle(uint64_t id, ipc::UniqueFd fd, uint64_t size, uint64_t page_size, bool read_only,
                 uint64_t fixed_address, bool pinned, bool created, int device = -1);
  Status FreeHandle(uint64_t id);
  bool HoldsUnfreed(uint64_t id);

  Result<void*> Reserve(size_t size, size_t alignment, void* expected, uint32_t flags);
  Result<void*> ReserveDevice(size_t size, size_t alignment, void* expected, uint32_t flags);
  // force: unmap what is still mapped instead of failing with BUSY. Memory a
  // transfer engine has registered is never released underneath it (BUSY).
  Status Release(void* base, bool force);
  Result<uint64_t> Map(void* va, size_t size, size_t offset, uint64_t handle, uint32_t flags);
  // map_id 0 matches any mapping that starts at va.
  Status Unmap(void* va, uint64_t map_id);
  Status SetAccess(void* va, size_t size, Access access);

  // MallocHost bookkeeping: host pointer -> handle id.
  void AddHostAlloc(void* ptr, uint64_t handle);
  Status FreeHostAlloc(void* ptr);
  // HostRegister bookkeeping: address -> size, locked here.
  Status AddHostRegistration(void* ptr, size_t size);
  Result<size_t> TakeHostRegistration(void* ptr);
  // Host ranges this library registered with the CUDA driver (device_vmm.h).
  void NoteCudaRegistered(void* ptr);
  bool TakeCudaRegistered(void* ptr);

  // Transfer engine: finds what backs [va, va+size) - one mapping of a broker
  // allocation, or one HostRegister range - and keeps the range from being
  // unmapped, protected below read-write or unregistered until ForgetEngineRange.
  // device: the range must be device memory (MEM_DEVICE), else host memory.
  Result<EngineRange> PinForEngine(uintptr_t va, size_t size, const std::string& name, bool device);
  void ForgetEngineRange(uintptr_t va);
  // The range's region id at the current broker (0: none), and setting it.
  uint64_t EngineRegion(uintptr_t va);
  void SetEngineRegion(uintptr_t va, uint64_t region);

 private:
  void ReattachLoop();
  // Waits for the broker's socket to accept again; invalid when stopping.
  ipc::UniqueFd ConnectAgain(ipc::UniqueFd* watch);
  // Presents everything on a fresh connection, then makes it this client's.
  Status Reattach(ipc::UniqueFd sock, std::chrono::steady_clock::time_point lost, ReattachReport* report);
  // Registers the transfer engine and its ranges again on `fresh`; the
  // ranges' new region ids by address.
  std::map<uintptr_t, uint64_t> ReattachEngine(Connection& fresh, const std::set<uint64_t>& taken,
                                               ReattachReport* report);
  // Sends a Free for handles freed while no broker was there.
  void SendLostFrees(const std::set<uint64_t>& taken);

  // Handles whose Free is sent once mu_ is released: no broker I/O happens
  // under the lock, so a broker that reads slowly never holds up this
  // process's local calls (Map, Unmap, SetAccess are system calls only).
  using Frees = std::vector<uint64_t>;
  Status SendFrees(const Frees& frees);
  // Release without the Frees: takes mu_ itself and adds them to *frees.
  Status ReleaseReservation(uintptr_t base, bool force, Frees* frees);
  // Called with mu_ held.
  // Erases a freed handle; its Free joins *frees (unless the broker never knew it).
  void ForgetHandle(std::unordered_map<uint64_t, HeldAllocation>::iterator it, Frees* frees);
  ReservationState* FindReservation(uintptr_t va, size_t size);
  void DropMappingRef(uint64_t handle, Frees* frees);
  Status CheckNotEngineRange(uintptr_t va, size_t size, const char* what) const;

  const ConnectOptions options_;
  const pid_t owner_pid_ = CurrentPid();  // the process that connected
  Connection conn_;
  std::atomic<uint64_t> client_id_{0};  // set by Handshake (again at each reattach)
  std::thread reattacher_;  // while reattaching (HangupWatcher starts it)
  ipc::UniqueFd stop_fd_;  // eventfd: a reattach in progress stops when it is written
  mutable std::mutex reattach_mu_;
  mutable std::condition_variable reattach_cv_;  // notified at each reattach
  uint64_t reattaches_ = 0;
  ReattachReport last_reattach_;
  ReattachJournal journal_;
  WakeSocket wake_;
  std::vector<ipc::Granularity> granularities_;
  std::string cluster_host_;  // the broker's host name in its cluster (HelloReply), set once at connect
  std::mutex mu_;
  std::unordered_map<uint64_t, HeldAllocation> handles_;
  std::map<uintptr_t, ReservationState> reservations_;  // by base address
  std::map<uintptr_t, uint64_t> host_allocs_;           // MallocHost pointers
  std::map<uintptr_t, size_t> host_regs_;               // HostRegister ranges
  std::set<uintptr_t> cuda_registered_;                 // of those and MallocHost's: registered with CUDA
  std::map<uintptr_t, EngineRegistration> engine_ranges_;  // registered with the transfer engine
  uint64_t next_map_id_ = 1;
};

}  // namespace membroker::detail
