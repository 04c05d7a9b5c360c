// membroker client library: connect to membrokerd, allocate broker-owned
// physical memory, map it into address ranges this process reserved, and share
// it with other processes by token. Names follow the CANN runtime's virtual
// memory API (aclrtMallocPhysical, aclrtReserveMemAddress, aclrtMapMem, ...).
//
// No function throws; fallible calls return Status or Result<T>. One Client
// may be shared by threads (its calls are thread-safe); a PhysicalHandle,
// Reservation or Mapping object is one thread's at a time (it may move between
// threads), like any value.
//
// Lifetime rules:
//  1. A PhysicalHandle holds one broker reference to an allocation. Destroying
//     it, or FreePhysical(), releases that reference without waiting for the
//     broker. While a Mapping of the handle exists the release is deferred to
//     the moment the last such Mapping goes.
//  2. An allocation lives while any process holds a reference: the creator may
//     free its handle while importers keep using the memory.
//  3. A Mapping unmaps when destroyed (the range goes back to PROT_NONE and stays
//     reserved). A Reservation releases its range when destroyed, unmapping
//     whatever is still mapped in it; Mapping objects that outlive it become
//     empty.
//  4. When this process exits or dies, the broker releases everything it held.
//     The broker cannot revoke a mapping: pages mapped here stay valid until
//     this process unmaps them or exits.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "membroker/status.h"

namespace membroker {

namespace detail {
class ClientCore;
struct KvStoreState;
}
namespace ipc {
class UniqueFd;
}

enum class PagePolicy : uint8_t {
  kNormalOnly = 0,  // 4 KiB pages
  kHugeFirst = 1,   // <= 1 MiB: normal pages; larger: 2 MiB pages, falling back to normal
  kHugeOnly = 2,    // 2 MiB pages or RESOURCE_EXHAUSTED
  kHuge1GOnly = 3,  // 1 GiB pages or RESOURCE_EXHAUSTED
};

enum class GranularityOption { kMinimum, kRecommended };

enum class Access { kNone, kRead, kReadWrite };

// Where an allocation's memory lives (the location of CANN's and CUDA's
// allocation properties): host memory, or the memory of CUDA device `id`.
struct MemLocation {
  enum Type : uint8_t { kHost = 0, kDevice = 1 };
  Type type = kHost;
  int id = 0;  // the device ordinal, for kDevice
};

struct AllocationProp {
  PagePolicy page_policy = PagePolicy::kNormalOnly;
  // The broker populates and locks the pages: never swapped, never faulted in
  // later. Charged to the broker's pinned budget (--max-pinned-bytes).
  bool pinned = false;
  // Every process maps the allocation at the same virtual address
  // (handle.fixed_address()), so raw pointers stored inside it stay valid
  // everywhere (CANN's VA-consistency attribute).
  bool same_address = false;
  // Export it in the same round trip, with these ExportToShareableHandle
  // flags: handle.export_token() holds the token, and ExportToShareableHandle
  // with the same flags returns it without asking the broker (like CUDA's
  // requestedHandleTypes). For producers that share every buffer they make.
  bool exported = false;
  uint32_t export_flags = 0;
  // Last, so that existing brace initialisers keep their meaning. Device
  // memory is made by the broker's CUDA driver and mapped through this
  // process's (kReserveDevice reservations); without a driver or the device a
  // device location answers UNSUPPORTED, saying why.
  MemLocation location{};
};

// ReserveMemAddress flags.
inline constexpr uint32_t kReserveFixed = 1u << 0;  // expected_addr or ADDRESS_IN_USE, never elsewhere
// Device virtual addresses (cuMemAddressReserve), for device memory's MapMem.
inline constexpr uint32_t kReserveDevice = 1u << 1;

// MapMem flags.
inline constexpr uint32_t kMapPopulate = 1u << 0;  // pre-fault every page now (MAP_POPULATE)

// ExportToShareableHandle flags.
inline constexpr uint32_t kExportNoPidCheck = 1u << 0;  // any same-uid process may import
inline constexpr uint32_t kExportReadOnly = 1u << 1;    // importers get a read-only fd

// Publish flags.
inline constexpr uint32_t kPublishReadOnly = 1u << 0;  // lookups get a read-only handle
inline constexpr uint32_t kPublishPersist = 1u << 1;   // outlives this process until unpublished
// A name this user already published is swapped to this handle's allocation
// in one step: lookups from then on get the new one, holders of the old keep it.
inline constexpr uint32_t kPublishReplace = 1u << 2;
// The name is listed in this host's record of the cluster (membrokerd
// --cluster): LookupCluster on any host finds it. UNSUPPORTED without a
// cluster; at most 128 such names per host (docs/CLUSTER.md).
inline constexpr uint32_t kPublishCluster = 1u << 3;

// Where a name published with kPublishCluster lives (LookupCluster).
struct ClusterNameInfo {
  std::string host;         // the host whose broker has it (this host's own name included)
  uint64_t generation = 0;  // that host's registration: a host that came back has a larger one
  size_t size = 0;
  bool read_only = false;
  std::string metadata;     // the publisher's (Publish)
  uint64_t allocation = 0;  // the object's id at that host's broker: a replace (kPublishReplace) changes it
};

struct NamedObjectInfo {
  std::string name;
  uint64_t allocation = 0;
  size_t size = 0;
  bool read_only = false;
  bool persist = false;
  pid_t publisher_pid = 0;
};

// kHostGone: the host that listed the name for the cluster is gone (its
// broker died, was cut off past its lease, or another broker registered there).
enum class NameEventKind : uint8_t { kPublished = 0, kUnpublished = 1, kHolderDied = 2, kHostGone = 3 };
struct NameEvent {
  NameEventKind kind = NameEventKind::kPublished;
  std::string name;
  uint64_t allocation = 0;
  pid_t pid = 0;  // the publisher, or the process that died holding the object
  std::string host;  // another host's name for the cluster (SubscribeCluster; allocation and pid 0); empty: this host's
};
struct NameEvents {
  std::vector<NameEvent> events;
  uint64_t dropped = 0;  // lost to a full queue (1024 per client), since Subscribe
};

// What a client found when it reattached to a new broker on its socket
// (ConnectOptions::on_reattach, Client::last_reattach; docs/RESTART.md).
struct ReattachReport {
  uint64_t client_id = 0;       // this client's id at the new broker
  size_t handles = 0;           // handles the new broker holds for it again
  size_t handles_refused = 0;   // still mapped here, but unknown to the broker
  size_t restored = 0;          // exports, names, subscriptions, host registrations
  size_t failed = 0;            // of those, what the new broker refused
  Status first_error;           // why the first refusal happened
  uint64_t waited_ms = 0;       // from the broker going away to reattached
};

struct ConnectOptions {
  std::string socket_path;
  std::string client_name;  // shown by `membrokerctl list clients`
  // How long any call waits for the broker's reply, beyond the time the call
  // itself asks the broker to wait (LookupNamed's, Connect's, WaitEvents'
  // timeout): then it returns TIMEOUT. A broker that is stopped (SIGSTOP) or
  // wedged but keeps its socket open cannot hang a caller for longer. Whatever
  // a reply that still comes later granted is released at once.
  uint32_t call_timeout_ms = 30000;
  // When the broker goes away (crash, kill, upgrade), calls that need it fail
  // at once with NOT_CONNECTED while mappings stay valid; a thread of this
  // client then connects again, with a backoff of at most
  // reattach_max_backoff_ms (and at once when the socket file reappears), and
  // presents what it holds: handles (ids unchanged), exports, names,
  // subscriptions, host registrations. on_reattach, if set, is called on that
  // thread after each reattach. Off: a lost broker stays lost (as when kicked).
  bool reattach = true;
  uint32_t reattach_max_backoff_ms = 200;
  std::function<void(const ReattachReport&)> on_reattach = nullptr;
};

class MEMBROKER_API PhysicalHandle {
 public:
  PhysicalHandle() = default;
  ~PhysicalHandle();
  PhysicalHandle(PhysicalHandle&& other) noexcept;
  PhysicalHandle& operator=(PhysicalHandle&& other) noexcept;
  PhysicalHandle(const PhysicalHandle&) = delete;
  PhysicalHandle& operator=(const PhysicalHandle&) = delete;

  bool valid() const { return core_ != nullptr; }
  uint64_t id() const { return id_; }            // the broker's allocation id
  size_t size() const { return size_; }          // rounded to the page size
  size_t page_size() const { return page_size_; }  // the page size it actually got
  bool read_only() const { return read_only_; }
  bool pinned() const { return pinned_; }
  bool fell_back() const { return fell_back_; }  // HUGE_FIRST that got normal pages
  bool from_pool() const { return from_pool_; }  // served from a broker pool
  // The CUDA device whose memory this is, or -1 for host memory.
  int device() const { return device_; }
  // Where every process must map a same-address allocation; nullptr otherwise.
  void* fixed_address() const { return reinterpret_cast<void*>(fixed_address_); }
  // The token of an allocation made with prop.exported; empty otherwise.
  const std::string& export_token() const { return export_token_; }
  // For a handle from Lookup: the metadata its publisher gave (Publish);
  // empty otherwise.
  const std::string& metadata() const { return metadata_; }

 private:
  friend class Client;
  std::shared_ptr<detail::ClientCore> core_;
  uint64_t id_ = 0;
  size_t size_ = 0;
  size_t page_size_ = 0;
  bool read_only_ = false;
  bool pinned_ = false;
  bool fell_back_ = false;
  bool from_pool_ = false;
  int device_ = -1;
  uint64_t fixed_address_ = 0;
  std::string export_token_;
  uint32_t export_flags_ = 0;  // the flags export_token_ was made with
  std::string metadata_;
};

class MEMBROKER_API Reservation {
 public:
  Reservation() = default;
  ~Reservation();
  Reservation(Reservation&& other) noexcept;
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  bool valid() const { return core_ != nullptr; }
  void* base() const { return base_; }
  size_t size() const { return size_; }
  // base() + offset, for MapMem.
  void* at(size_t offset) const { return static_cast<char*>(base_) + offset; }

 private:
  friend class Client;
  std::shared_ptr<detail::ClientCore> core_;
  void* base_ = nullptr;
  size_t size_ = 0;
};

class MEMBROKER_API Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  bool valid() const { return core_ != nullptr; }
  void* data() const { return va_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return static_cast<T*>(va_); }

 private:
  friend class Client;
  std::shared_ptr<detail::ClientCore> core_;
  void* va_ = nullptr;
  size_t size_ = 0;
  uint64_t map_id_ = 0;
};

class MEMBROKER_API Client {
 public:
  // Connects and completes the handshake: one round trip.
  static Result<Client> Connect(const ConnectOptions& options);

  Client() = default;
  bool connected() const { return core_ != nullptr; }
  uint64_t client_id() const;
  // This host's name in its broker's cluster (membrokerd --host-name), as
  // LookupCluster's answers name hosts; "" when the broker is in no cluster.
  std::string cluster_host() const;

  // Local: the granularities came with the handshake.
  Result<size_t> GetAllocationGranularity(const AllocationProp& prop,
                                          GranularityOption option) const;

  // One round trip. The size is rounded up to the policy's page size; the
  // pages are reserved in the broker before this returns.
  Result<PhysicalHandle> MallocPhysical(size_t size, const AllocationProp& prop = {});
  // Releases the handle's reference (no round trip). INVALID_HANDLE if the
  // handle is empty or was already freed.
  Status FreePhysical(PhysicalHandle& handle);

  // Local: reserves an address range with no access. alignment: a power of
  // two of at least 4096, or 0 for the largest page size (1 GiB, 2 MiB, 4 KiB)
  // that divides size, so huge-page allocations can be mapped at base().
  // expected_addr is a hint, or a must with kReserveFixed (ADDRESS_IN_USE).
  Result<Reservation> ReserveMemAddress(size_t size, size_t alignment = 0,
                                        void* expected_addr = nullptr, uint32_t flags = 0);
  // BUSY while anything is still mapped in it.
  Status ReleaseMemAddress(Reservation& reservation);

  // Local: maps [offset, offset+size) of the handle at va, which must lie in a
  // reservation of this client and not overlap another mapping. va, size and
  // offset must be multiples of the handle's page size; a same-address
  // allocation maps only at fixed_address() + offset. Access starts as
  // read-write (read for read-only imports). kMapPopulate pre-faults the pages.
  Result<Mapping> MapMem(void* va, size_t size, size_t offset, const PhysicalHandle& handle,
                         uint32_t flags = 0);
  // Local: the range goes back to PROT_NONE and stays reserved.
  Status UnmapMem(Mapping& mapping);
  // Local: [va, va+size) must be covered by mappings of this client.
  Status MemSetAccess(void* va, size_t size, Access access);

  // One round trip: a printable token with 128 random bits.
  Result<std::string> ExportToShareableHandle(const PhysicalHandle& handle, uint32_t flags = 0);
  // One round trip: only these processes may import (checked against the
  // kernel's peer credentials). Not needed with kExportNoPidCheck.
  Status SetPidToShareableHandle(const std::string& token, std::span<const pid_t> pids);
  // One round trip: a handle to the exported allocation, usable with MapMem.
  Result<PhysicalHandle> ImportFromShareableHandle(const std::string& token);

  // Pinned host memory (aclrtMallocHost): a pinned broker allocation, mapped
  // read-write and pre-faulted; one round trip. FreeHost(ptr) unmaps it and
  // releases it (no wait). To share pinned memory, use MallocPhysical with
  // prop.pinned and export the handle.
  Result<void*> MallocHost(size_t size);
  Status FreeHost(void* ptr);

  // Pins this process's own memory (aclrtHostRegister): ptr and size must be
  // multiples of 4096 and the range mapped. The broker records it (charged to
  // the pinned budget and quotas) and the pages are locked here. One round trip.
  Status HostRegister(void* ptr, size_t size, uint32_t flags = 0);
  // Unlocks and forgets a registration made at exactly ptr (no wait).
  Status HostUnregister(void* ptr);

  // Named objects (docs/PIPELINE.md, "Named objects"). Publish: one round trip; the name refers to
  // the handle's allocation (the publication holds its own reference). Names
  // are unique per broker (ALREADY_EXISTS; with kPublishReplace the name is
  // swapped atomically, PERMISSION_DENIED when another user's). Without
  // kPublishPersist the name goes when this process exits.
  // metadata (at most 4 KiB, e.g. a tensor's dtype and shape) is kept with the
  // name and given to every Lookup (PhysicalHandle::metadata()).
  Status Publish(const std::string& name, const PhysicalHandle& handle, uint32_t flags = 0,
                 std::string_view metadata = {});
  // A handle to the named allocation, as an import. Waits in the broker up to
  // timeout_ms for the name to be published (TIMEOUT); 0: NOT_FOUND at once.
  Result<PhysicalHandle> Lookup(const std::string& name, int timeout_ms = 0);
  // Where a name published with kPublishCluster lives, on this host or any
  // other of the cluster (docs/CLUSTER.md). Waits in the broker up to
  // timeout_ms for it to appear (TIMEOUT); 0: NOT_FOUND at once. UNSUPPORTED
  // where the broker has no --cluster; NOT_CONNECTED, with the reason, while
  // etcd is out of reach and the name is not this host's.
  Result<ClusterNameInfo> LookupCluster(const std::string& name, int timeout_ms = 0);
  // Removes the name (and its reference); holders keep their handles.
  Status Unpublish(const std::string& name);
  // Every name starting with prefix, sorted (asked for in pages of 128).
  Result<std::vector<NamedObjectInfo>> ListNames(const std::string& prefix = "");
  // Events for names starting with prefix ("" for all): published,
  // unpublished, holder died (a process holding the object ended without
  // closing its client). Queued in the broker, 1024 at most per client.
  Status Subscribe(const std::string& prefix);
  // The same, and the events of names other hosts publish for the cluster
  // (kPublishCluster): published, unpublished, host gone, each with its host
  // (docs/CLUSTER.md). UNSUPPORTED where the broker has no --cluster.
  Status SubscribeCluster(const std::string& prefix);
  // Waits up to timeout_ms for at least one event; an empty list on timeout.
  Result<NameEvents> WaitEvents(int timeout_ms);
  // An fd for an event loop (epoll, asyncio's add_reader): readable when
  // something may be queued for this client - a name event (WaitEvents(0)
  // takes it) or a notify for its transfer engine (GetNotifies). Its one
  // reader calls DrainWakeFd and then takes what is queued, in that order, so
  // a wake that comes after is never lost; a wake may find nothing. Made on
  // the first call (one round trip); the same fd for the life of the Client,
  // reattaches included. The Client owns it: do not close it.
  Result<int> WakeFd();
  void DrainWakeFd();

  // One round trip with no effect: a liveness check.
  Status Ping();
  // How often this client reattached to a new broker, and what it found last time.
  uint64_t reattaches() const;
  ReattachReport last_reattach() const;
  // Waits up to timeout_ms until reattaches() >= count: TIMEOUT otherwise.
  Status WaitForReattach(uint64_t count, int timeout_ms) const;
  // Releases sent without waiting that the broker refused (see last_async_error).
  uint64_t async_errors() const;
  Status last_async_error() const;

 private:
  friend class TransferEngine;
  friend class KvStore;
  friend struct detail::KvStoreState;
  explicit Client(std::shared_ptr<detail::ClientCore> core) : core_(std::move(core)) {}
  Status Subscribe(const std::string& prefix, bool cluster);
  // Records an fd the broker sent and wraps it in a handle.
  PhysicalHandle AdoptHandle(uint64_t id, ipc::UniqueFd fd, uint64_t size, uint64_t page_size, bool read_only,
                             bool pinned, uint64_t fixed_address, bool created, int device);
  std::shared_ptr<detail::ClientCore> core_;
};

}  // namespace membroker
