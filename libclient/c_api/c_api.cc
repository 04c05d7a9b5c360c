// The C API (membroker/membroker.h) over the C++ client: each opaque struct
// owns its C++ object; errors become codes plus a thread-local message.
#include "membroker/membroker.h"
#include "membroker/name_share.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "membroker/client.h"
#include "membroker/ipc/protocol.h"
#include "membroker/transfer_engine.h"

using namespace membroker;
using membroker::c_api::Done;
using membroker::c_api::Fail;
using membroker::c_api::Guard;

struct mb_handle {
  PhysicalHandle handle;
};
struct mb_reservation {
  Reservation reservation;
};
struct mb_mapping {
  Mapping mapping;
};
struct mb_engine {
  std::unique_ptr<TransferEngine> engine;
  // Notifies taken from the engine and not yet handed out (one per mb_engine_get_notify).
  std::mutex notifies_mu;
  std::deque<Notify> notifies;
};

// membroker.h's mb_error is status.h's list, code by code.
#define MB_C_ERROR_MATCHES(value, enumerator, wire, py) \
  static_assert(MB_##wire == value, "membroker.h's MB_" #wire " is not wire code " #value);
MEMBROKER_ERROR_CODES(MB_C_ERROR_MATCHES)
#undef MB_C_ERROR_MATCHES
static_assert(MB_EXPORT_NO_PID_CHECK == kExportNoPidCheck && MB_EXPORT_READ_ONLY == kExportReadOnly);
static_assert(MB_PUBLISH_READ_ONLY == kPublishReadOnly && MB_PUBLISH_PERSIST == kPublishPersist &&
              MB_PUBLISH_REPLACE == kPublishReplace && MB_PUBLISH_CLUSTER == kPublishCluster);
static_assert(sizeof(mb_cluster_name::host) == ipc::kMaxHostNameBytes + 1);
static_assert(MB_HUGE1G_ONLY == static_cast<int>(PagePolicy::kHuge1GOnly));
static_assert(static_cast<int>(MB_READ) == static_cast<int>(READ) && static_cast<int>(MB_WRITE) == static_cast<int>(WRITE));
static_assert(MB_TRANSFER_FAILED == static_cast<int>(TransferStatus::FAILED) &&
              MB_TRANSFER_WAITING == static_cast<int>(TransferStatus::WAITING));
static_assert(MB_EVENT_HOLDER_DIED == static_cast<int>(NameEventKind::kHolderDied) &&
              MB_EVENT_HOST_GONE == static_cast<int>(NameEventKind::kHostGone));
static_assert(MB_MAX_ENGINE_NAME_BYTES >= ipc::kMaxEngineNameBytes && MB_MAX_NOTIFY_NAME_BYTES == ipc::kMaxNotifyNameBytes &&
              MB_MAX_NOTIFY_MESSAGE_BYTES == ipc::kMaxNotifyMessageBytes && MB_MAX_OBJECT_NAME_BYTES == ipc::kMaxObjectNameBytes);

namespace {
// A string into a caller's buffer of len bytes, NUL-terminated, truncated to fit.
void CopyOut(const std::string& s, char* out, size_t len) {
  if (out == nullptr || len == 0) return;
  const size_t n = std::min(s.size(), len - 1);
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
}
}  // namespace

extern "C" {

const char* mb_last_error_message(void) { return membroker::c_api::t_last_error.c_str(); }

const char* mb_error_name(int code) {
  static thread_local std::string name;
  name = std::string(ErrorCodeName(static_cast<ErrorCode>(code)));
  return name.c_str();
}

int mb_connect(const char* socket_path, const char* client_name, uint32_t call_timeout_ms, mb_client** out) {
  return Guard([&]() -> int {
    MB_NEED(socket_path != nullptr && out != nullptr, "socket_path and out must not be NULL");
    ConnectOptions o{socket_path, client_name ? client_name : ""};
    if (call_timeout_ms != 0) o.call_timeout_ms = call_timeout_ms;
    auto c = Client::Connect(o);
    if (!c.ok()) return Fail(c.status());
    auto* made = new mb_client;
    made->client = std::move(*c);
    *out = made;
    return MB_OK;
  });
}

void mb_client_close(mb_client* client) { delete client; }
uint64_t mb_client_id(const mb_client* client) { return client ? client->client.client_id() : 0; }
int mb_ping(mb_client* client) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr, "client is NULL");
    return Done(client->client.Ping());
  });
}

int mb_malloc_physical(mb_client* client, size_t size, int page_policy, uint32_t flags, mb_handle** out) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr && out != nullptr, "client and out must not be NULL");
    MB_NEED(page_policy >= MB_NORMAL_ONLY && page_policy <= MB_HUGE1G_ONLY, "unknown page policy");
    MB_NEED((flags & ~uint32_t{MB_MALLOC_PINNED | MB_MALLOC_SAME_ADDRESS}) == 0, "unknown malloc flags");
    AllocationProp p;
    p.page_policy = static_cast<PagePolicy>(page_policy);
    p.pinned = flags & MB_MALLOC_PINNED;
    p.same_address = flags & MB_MALLOC_SAME_ADDRESS;
    auto h = client->client.MallocPhysical(size, p);
    if (!h.ok()) return Fail(h.status());
    *out = new mb_handle{std::move(*h)};
    return MB_OK;
  });
}

void mb_handle_free(mb_handle* handle) { delete handle; }
uint64_t mb_handle_id(const mb_handle* h) { return h ? h->handle.id() : 0; }
size_t mb_handle_size(const mb_handle* h) { return h ? h->handle.size() : 0; }
size_t mb_handle_page_size(const mb_handle* h) { return h ? h->handle.page_size() : 0; }
int mb_handle_read_only(const mb_handle* h) { return h && h->handle.read_only() ? 1 : 0; }

int mb_reserve(mb_client* client, size_t size, size_t alignment, mb_reservation** out) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr && out != nullptr, "client and out must not be NULL");
    auto r = client->client.ReserveMemAddress(size, alignment);
    if (!r.ok()) return Fail(r.status());
    *out = new mb_reservation{std::move(*r)};
    return MB_OK;
  });
}
void* mb_reservation_base(const mb_reservation* r) { return r ? r->reservation.base() : nullptr; }
size_t mb_reservation_size(const mb_reservation* r) { return r ? r->reservation.size() : 0; }
void mb_reservation_release(mb_reservation* r) { delete r; }

int mb_map(mb_client* client, const mb_reservation* reservation, size_t at, size_t size, size_t offset,
           const mb_handle* handle, mb_mapping** out) {
  return Guard([&]() -> int {
    MB_NEED(client && reservation && handle && out, "client, reservation, handle and out must not be NULL");
    MB_NEED(at <= reservation->reservation.size(), "at lies past the reservation");
    if (size == 0) size = offset < handle->handle.size() ? handle->handle.size() - offset : 0;
    auto m = client->client.MapMem(reservation->reservation.at(at), size, offset, handle->handle);
    if (!m.ok()) return Fail(m.status());
    *out = new mb_mapping{std::move(*m)};
    return MB_OK;
  });
}
void* mb_mapping_data(const mb_mapping* m) { return m ? m->mapping.data() : nullptr; }
size_t mb_mapping_size(const mb_mapping* m) { return m ? m->mapping.size() : 0; }
void mb_unmap(mb_mapping* m) { delete m; }

int mb_set_access(mb_client* client, const mb_mapping* mapping, int access) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr && mapping != nullptr, "client and mapping must not be NULL");
    MB_NEED(access >= MB_ACCESS_NONE && access <= MB_ACCESS_READ_WRITE, "unknown access value");
    return Done(client->client.MemSetAccess(mapping->mapping.data(), mapping->mapping.size(),
                                            static_cast<Access>(access)));
  });
}

int mb_export(mb_client* client, const mb_handle* handle, uint32_t flags, char* token, size_t capacity) {
  return Guard([&]() -> int {
    MB_NEED(client && handle && token, "client, handle and token must not be NULL");
    auto t = client->client.ExportToShareableHandle(handle->handle, flags);
    if (!t.ok()) return Fail(t.status());
    if (t->size() + 1 > capacity) return Fail(MB_PARAM_INVALID, "token buffer too small (MB_TOKEN_BYTES)");
    std::memcpy(token, t->c_str(), t->size() + 1);
    return MB_OK;
  });
}

int mb_set_pids(mb_client* client, const char* token, const pid_t* pids, size_t count) {
  return Guard([&]() -> int {
    MB_NEED(client && token && (pids || count == 0), "client, token and pids must not be NULL");
    return Done(client->client.SetPidToShareableHandle(token, std::span<const pid_t>(pids, count)));
  });
}

int mb_import(mb_client* client, const char* token, mb_handle** out) {
  return Guard([&]() -> int {
    MB_NEED(client && token && out, "client, token and out must not be NULL");
    auto h = client->client.ImportFromShareableHandle(token);
    if (!h.ok()) return Fail(h.status());
    *out = new mb_handle{std::move(*h)};
    return MB_OK;
  });
}

int mb_malloc_host(mb_client* client, size_t size, void** out) {
  return Guard([&]() -> int {
    MB_NEED(client && out, "client and out must not be NULL");
    auto p = client->client.MallocHost(size);
    if (!p.ok()) return Fail(p.status());
    *out = *p;
    return MB_OK;
  });
}

int mb_free_host(mb_client* client, void* ptr) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr, "client is NULL");
    return Done(client->client.FreeHost(ptr));
  });
}

int mb_host_register(mb_client* client, void* ptr, size_t size, uint32_t flags) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr, "client is NULL");
    return Done(client->client.HostRegister(ptr, size, flags));
  });
}

int mb_host_unregister(mb_client* client, void* ptr) {
  return Guard([&]() -> int {
    MB_NEED(client != nullptr, "client is NULL");
    return Done(client->client.HostUnregister(ptr));
  });
}

int mb_publish(mb_client* client, const char* name, const mb_handle* handle, uint32_t flags) {
  return Guard([&]() -> int {
    MB_NEED(client && name && handle, "client, name and handle must not be NULL");
    return Done(client->client.Publish(name, handle->handle, flags));
  });
}

int mb_lookup(mb_client* client, const char* name, int timeout_ms, mb_handle** out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && out, "client, name and out must not be NULL");
    auto h = client->client.Lookup(name, timeout_ms);
    if (!h.ok()) return Fail(h.status());
    *out = new mb_handle{std::move(*h)};
    return MB_OK;
  });
}

int mb_lookup_cluster(mb_client* client, const char* name, int timeout_ms, mb_cluster_name* out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && out, "client, name and out must not be NULL");
    auto at = client->client.LookupCluster(name, timeout_ms);
    if (!at.ok()) return Fail(at.status());
    CopyOut(at->host, out->host, sizeof(out->host));
    out->generation = at->generation;
    out->size = at->size;
    out->read_only = at->read_only ? 1 : 0;
    return MB_OK;
  });
}

int mb_fetch_named(mb_client* client, mb_engine* engine, const char* name, int timeout_ms, mb_handle** out,
                   mb_cluster_name* where) {
  return Guard([&]() -> int {
    MB_NEED(client && engine && name && out, "client, engine, name and out must not be NULL");
    auto f = FetchNamed(client->client, *engine->engine, name, timeout_ms);
    if (!f.ok()) return Fail(f.status());
    if (where != nullptr) {
      CopyOut(f->host, where->host, sizeof(where->host));
      where->generation = f->generation;
      where->size = f->size;
      where->read_only = f->handle.read_only() ? 1 : 0;
    }
    *out = new mb_handle{std::move(f->handle)};
    return MB_OK;
  });
}

int mb_subscribe(mb_client* client, const char* prefix) {
  return Guard([&]() -> int {
    MB_NEED(client && prefix, "client and prefix must not be NULL");
    return Done(client->client.Subscribe(prefix));
  });
}

int mb_subscribe_cluster(mb_client* client, const char* prefix) {
  return Guard([&]() -> int {
    MB_NEED(client && prefix, "client and prefix must not be NULL");
    return Done(client->client.SubscribeCluster(prefix));
  });
}

int mb_client_wake_fd(mb_client* client, int* fd) {
  return Guard([&]() -> int {
    MB_NEED(client && fd, "client and fd must not be NULL");
    auto got = client->client.WakeFd();
    if (!got.ok()) return Fail(got.status());
    *fd = *got;
    return MB_OK;
  });
}

void mb_client_drain_wake_fd(mb_client* client) {
  if (client) client->client.DrainWakeFd();
}

int mb_wait_event(mb_client* client, int timeout_ms, mb_name_event* out) {
  return Guard([&]() -> int {
    MB_NEED(client && out, "client and out must not be NULL");
    std::unique_lock<std::mutex> lk(client->events_mu);
    if (client->events.empty()) {
      // Not under the lock: another thread's call must not wait out this one's timeout.
      lk.unlock();
      auto got = client->client.WaitEvents(timeout_ms);
      if (!got.ok()) return Fail(got.status());
      lk.lock();
      client->events_dropped = std::max(client->events_dropped, got->dropped);  // the broker counts since Subscribe
      for (auto& e : got->events) client->events.push_back(std::move(e));
      if (client->events.empty()) return Fail(MB_TIMEOUT, "no event within the timeout");
    }
    const NameEvent& e = client->events.front();
    *out = mb_name_event{};
    out->kind = static_cast<int>(e.kind);
    CopyOut(e.name, out->name, sizeof(out->name));
    out->allocation = e.allocation;
    out->pid = e.pid;
    out->dropped = client->events_dropped;
    CopyOut(e.host, out->host, sizeof(out->host));
    client->events.pop_front();
    return MB_OK;
  });
}

int mb_unpublish(mb_client* client, const char* name) {
  return Guard([&]() -> int {
    MB_NEED(client && name, "client and name must not be NULL");
    return Done(client->client.Unpublish(name));
  });
}

int mb_engine_create(mb_client* client, const char* local_name, mb_engine** out) {
  return Guard([&]() -> int {
    MB_NEED(client && local_name && out, "client, local_name and out must not be NULL");
    auto e = std::make_unique<mb_engine>();
    e->engine = std::make_unique<TransferEngine>(client->client);
    if (Status st = e->engine->Initialize(local_name); !st.ok()) return Fail(st);
    *out = e.release();
    return MB_OK;
  });
}

int mb_engine_create_with_options(mb_client* client, const char* local_name, const char* const* keys,
                                  const char* const* values, size_t count, mb_engine** out) {
  return Guard([&]() -> int {
    MB_NEED(client && local_name && out && (count == 0 || (keys && values)),
            "client, local_name, out, keys and values must not be NULL");
    std::map<std::string, std::string> options;
    for (size_t i = 0; i < count; ++i) {
      MB_NEED(keys[i] && values[i], "an option key or value is NULL");
      options[keys[i]] = values[i];
    }
    auto e = std::make_unique<mb_engine>();
    e->engine = std::make_unique<TransferEngine>(client->client);
    if (Status st = e->engine->Initialize(local_name, options); !st.ok()) return Fail(st);
    *out = e.release();
    return MB_OK;
  });
}

int mb_engine_connection_path(mb_engine* engine, const char* remote, char* path, size_t path_len,
                              char* transports, size_t transports_len) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote, "engine and remote must not be NULL");
    ConnectionInfo info;
    if (Status st = engine->engine->GetConnectionInfo(remote, info); !st.ok()) return Fail(st);
    CopyOut(info.path, path, path_len);
    CopyOut(info.transports, transports, transports_len);
    return MB_OK;
  });
}

int mb_engine_listen_address(mb_engine* engine, char* address, size_t len) {
  return Guard([&]() -> int {
    MB_NEED(engine && address && len > 0, "engine and address must not be NULL, len > 0");
    NetworkStats ns;
    if (Status st = engine->engine->GetNetworkStats(ns); !st.ok()) return Fail(st);
    CopyOut(ns.listen_address, address, len);
    return MB_OK;
  });
}

void mb_engine_destroy(mb_engine* engine) { delete engine; }

int mb_engine_register(mb_engine* engine, uintptr_t addr, size_t len, uint64_t* mem_handle) {
  return mb_engine_register_named(engine, addr, len, "", mem_handle);
}

int mb_engine_register_named(mb_engine* engine, uintptr_t addr, size_t len, const char* name, uint64_t* mem_handle) {
  return Guard([&]() -> int {
    MB_NEED(engine && name && mem_handle, "engine, name and mem_handle must not be NULL");
    MemHandle h = nullptr;
    if (Status st = engine->engine->RegisterMem({addr, len}, MEM_HOST, h, name); !st.ok()) return Fail(st);
    *mem_handle = reinterpret_cast<uintptr_t>(h);
    return MB_OK;
  });
}

int mb_engine_remote_region(mb_engine* engine, const char* remote, const char* name, int timeout_ms, uintptr_t* addr,
                            size_t* len) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote && name && addr && len, "engine, remote, name, addr and len must not be NULL");
    std::vector<RegionInfo> regions;
    if (Status st = engine->engine->GetRemoteRegions(remote, regions, timeout_ms); !st.ok()) return Fail(st);
    for (const RegionInfo& r : regions)
      if (r.name == name) {
        *addr = r.address;
        *len = r.length;
        return MB_OK;
      }
    return Fail(Status(ErrorCode::kNotFound, std::string("engine \"") + remote + "\" has no range named \"" + name + "\""));
  });
}

int mb_engine_deregister(mb_engine* engine, uint64_t mem_handle) {
  return Guard([&]() -> int {
    MB_NEED(engine != nullptr, "engine is NULL");
    return Done(engine->engine->DeregisterMem(reinterpret_cast<MemHandle>(static_cast<uintptr_t>(mem_handle))));
  });
}

int mb_engine_connect(mb_engine* engine, const char* remote, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote, "engine and remote must not be NULL");
    return Done(engine->engine->Connect(remote, timeout_ms));
  });
}

int mb_engine_disconnect(mb_engine* engine, const char* remote, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote, "engine and remote must not be NULL");
    return Done(engine->engine->Disconnect(remote, timeout_ms));
  });
}

namespace {
// The descriptors of a C call, checked.
int ToDescs(int op, const mb_transfer_desc* descs, size_t count, std::vector<TransferOpDesc>* out) {
  MB_NEED(descs || count == 0, "descs must not be NULL");
  MB_NEED(op == MB_READ || op == MB_WRITE, "op is MB_READ or MB_WRITE");
  out->resize(count);
  for (size_t i = 0; i < count; ++i) (*out)[i] = {descs[i].local_addr, descs[i].remote_addr, descs[i].len};
  return MB_OK;
}
}  // namespace

int mb_engine_transfer_async(mb_engine* engine, const char* remote, int op, const mb_transfer_desc* descs,
                             size_t count, int timeout_ms, uint64_t* req) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote && req, "engine, remote and req must not be NULL");
    std::vector<TransferOpDesc> d;
    if (int rc = ToDescs(op, descs, count, &d); rc != MB_OK) return rc;
    TransferReq r = 0;
    if (Status st = engine->engine->TransferAsync(remote, static_cast<TransferOp>(op), d, r, timeout_ms); !st.ok())
      return Fail(st);
    *req = r;
    return MB_OK;
  });
}

int mb_engine_transfer_status(mb_engine* engine, uint64_t req, int* status) {
  return Guard([&]() -> int {
    MB_NEED(engine && status, "engine and status must not be NULL");
    TransferStatus s = TransferStatus::WAITING;
    if (Status st = engine->engine->GetTransferStatus(req, s); !st.ok()) return Fail(st);
    *status = static_cast<int>(s);
    if (s == TransferStatus::FAILED || s == TransferStatus::TIMEOUT)
      c_api::t_last_error = engine->engine->last_error().message();  // why, for the caller
    return MB_OK;
  });
}

int mb_engine_send_notify(mb_engine* engine, const char* remote, const char* name, const void* msg,
                          size_t msg_len, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote && name && (msg || msg_len == 0), "engine, remote, name and msg must not be NULL");
    NotifyDesc n{name, std::string(static_cast<const char*>(msg), msg_len)};
    return Done(engine->engine->SendNotify(remote, n, timeout_ms));
  });
}

namespace {
// Hands out the oldest notify taken from the engine (notifies_mu held); false if none.
bool PopNotify(mb_engine* engine, mb_notify* out) {
  if (engine->notifies.empty()) return false;
  const Notify& n = engine->notifies.front();
  *out = mb_notify{};
  CopyOut(n.remote_engine, out->remote_engine, sizeof(out->remote_engine));
  CopyOut(n.name, out->name, sizeof(out->name));
  out->msg_len = std::min(n.notify_msg.size(), sizeof(out->msg));
  std::memcpy(out->msg, n.notify_msg.data(), out->msg_len);
  engine->notifies.pop_front();
  return true;
}
}  // namespace

int mb_engine_get_notify(mb_engine* engine, mb_notify* out) {
  return Guard([&]() -> int {
    MB_NEED(engine && out, "engine and out must not be NULL");
    std::lock_guard<std::mutex> lk(engine->notifies_mu);
    if (engine->notifies.empty()) {
      std::vector<Notify> got;
      if (Status st = engine->engine->GetNotifies(got); !st.ok()) return Fail(st);
      for (auto& n : got) engine->notifies.push_back(std::move(n));
    }
    return PopNotify(engine, out) ? MB_OK : Fail(MB_NOT_FOUND, "no notify is queued for this engine");
  });
}

int mb_engine_wait_notify(mb_engine* engine, int timeout_ms, mb_notify* out) {
  return Guard([&]() -> int {
    MB_NEED(engine && out, "engine and out must not be NULL");
    {
      std::lock_guard<std::mutex> lk(engine->notifies_mu);
      if (PopNotify(engine, out)) return MB_OK;
    }
    // Not under the lock: another thread's call must not wait out this one's timeout.
    std::vector<Notify> got;
    if (Status st = engine->engine->WaitNotifies(got, timeout_ms); !st.ok()) return Fail(st);
    std::lock_guard<std::mutex> lk(engine->notifies_mu);
    for (auto& n : got) engine->notifies.push_back(std::move(n));
    return PopNotify(engine, out) ? MB_OK : Fail(MB_TIMEOUT, "no notify within the timeout");
  });
}

int mb_engine_transfer_sync(mb_engine* engine, const char* remote, int op, const mb_transfer_desc* descs,
                            size_t count, int timeout_ms) {
  return Guard([&]() -> int {
    MB_NEED(engine && remote, "engine and remote must not be NULL");
    std::vector<TransferOpDesc> d;
    if (int rc = ToDescs(op, descs, count, &d); rc != MB_OK) return rc;
    return Done(engine->engine->TransferSync(remote, static_cast<TransferOp>(op), d, timeout_ms));
  });
}

}  // extern "C"
