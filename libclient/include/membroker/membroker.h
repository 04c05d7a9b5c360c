/* membroker's C API: a plain C ABI over the client library, for C programs
 * and for the FFI bindings of other languages (Rust, Go, ...).
 *
 * Every function that can fail returns an int: 0 (MB_OK) or a wire error
 * code (MB_TIMEOUT, MB_NOT_CONNECTED, ...: the numbers of docs/PROTOCOL.md).
 * mb_last_error_message() then says why, for the calling thread.
 *
 * Objects are opaque and owned by the caller, who destroys each exactly once
 * with its _close/_free/_release function (NULL is accepted and ignored).
 * Lifetime rules are the C++ API's (docs/API.md): a mapping may outlive its
 * handle (the release waits for the unmap); releasing a reservation unmaps
 * what is still mapped in it, and mappings left over become empty; a client
 * may be closed while its handles, reservations and mappings live. When the
 * process dies, the broker releases everything it held.
 *
 * Thread safety: a client and the objects made from it may be used from
 * several threads; one object is not destroyed while another thread uses it.
 */
#ifndef MEMBROKER_MEMBROKER_H
#define MEMBROKER_MEMBROKER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MB_C_API __attribute__((visibility("default")))

enum mb_error {
  MB_OK = 0,
  MB_PARAM_INVALID = 1,
  MB_INVALID_HANDLE = 2,
  MB_NOT_FOUND = 3,
  MB_PERMISSION_DENIED = 4,
  MB_RESOURCE_EXHAUSTED = 5,
  MB_PROTOCOL_ERROR = 6,
  MB_VERSION_MISMATCH = 7,
  MB_ALREADY_EXISTS = 8,
  MB_TIMEOUT = 9,
  MB_NOT_CONNECTED = 10,
  MB_ALREADY_CONNECTED = 11,
  MB_UNSUPPORTED = 12,
  MB_INTERNAL = 13,
  MB_BUSY = 14,
  MB_NOT_MAPPED = 15,
  MB_OVERLAP = 16,
  MB_OUT_OF_RANGE = 17,
  MB_QUOTA_EXCEEDED = 18,
  MB_ADDRESS_IN_USE = 19,
  MB_STALE = 20,
  MB_DATA_LOSS = 21
};

/* The calling thread's message for the last call that failed ("" if none). */
MB_C_API const char* mb_last_error_message(void);
/* "TIMEOUT", "NOT_CONNECTED", ...; "UNKNOWN" for other numbers. */
MB_C_API const char* mb_error_name(int code);

typedef struct mb_client mb_client;
typedef struct mb_handle mb_handle;
typedef struct mb_reservation mb_reservation;
typedef struct mb_mapping mb_mapping;
typedef struct mb_engine mb_engine;

/* --- the connection ----------------------------------------------------- */
/* call_timeout_ms: how long any call waits for the broker (0: 30000). */
MB_C_API int mb_connect(const char* socket_path, const char* client_name, uint32_t call_timeout_ms,
                        mb_client** out);
MB_C_API void mb_client_close(mb_client* client);
MB_C_API uint64_t mb_client_id(const mb_client* client);
MB_C_API int mb_ping(mb_client* client);

/* --- physical memory ---------------------------------------------------- */
enum mb_page_policy { MB_NORMAL_ONLY = 0, MB_HUGE_FIRST = 1, MB_HUGE_ONLY = 2, MB_HUGE1G_ONLY = 3 };
enum mb_malloc_flags { MB_MALLOC_PINNED = 1, MB_MALLOC_SAME_ADDRESS = 2 };
MB_C_API int mb_malloc_physical(mb_client* client, size_t size, int page_policy, uint32_t flags,
                                mb_handle** out);
/* Releases this process's reference (no round trip). */
MB_C_API void mb_handle_free(mb_handle* handle);
MB_C_API uint64_t mb_handle_id(const mb_handle* handle);
MB_C_API size_t mb_handle_size(const mb_handle* handle);
MB_C_API size_t mb_handle_page_size(const mb_handle* handle);
MB_C_API int mb_handle_read_only(const mb_handle* handle);

/* --- host memory -------------------------------------------------------- */
/* Pinned host memory (aclrtMallocHost): a pinned broker allocation, mapped
 * read-write and pre-faulted. mb_free_host unmaps and releases it. */
MB_C_API int mb_malloc_host(mb_client* client, size_t size, void** out);
MB_C_API int mb_free_host(mb_client* client, void* ptr);
/* Pins this process's own memory (aclrtHostRegister): ptr and size multiples
 * of 4096, the range mapped; MB_OVERLAP over another registration. */
MB_C_API int mb_host_register(mb_client* client, void* ptr, size_t size, uint32_t flags);
/* Forgets the registration made at exactly ptr (MB_NOT_FOUND if none). */
MB_C_API int mb_host_unregister(mb_client* client, void* ptr);

/* --- the VMM path -------------------------------------------------------- */
MB_C_API int mb_reserve(mb_client* client, size_t size, size_t alignment, mb_reservation** out);
MB_C_API void* mb_reservation_base(const mb_reservation* reservation);
MB_C_API size_t mb_reservation_size(const mb_reservation* reservation);
MB_C_API void mb_reservation_release(mb_reservation* reservation);
/* Maps size bytes of handle from offset at reservation base + at (size 0: the rest of the handle). */
MB_C_API int mb_map(mb_client* client, const mb_reservation* reservation, size_t at, size_t size,
                    size_t offset, const mb_handle* handle, mb_mapping** out);
MB_C_API void* mb_mapping_data(const mb_mapping* mapping);
MB_C_API size_t mb_mapping_size(const mb_mapping* mapping);
MB_C_API void mb_unmap(mb_mapping* mapping);
enum mb_access { MB_ACCESS_NONE = 0, MB_ACCESS_READ = 1, MB_ACCESS_READ_WRITE = 2 };
MB_C_API int mb_set_access(mb_client* client, const mb_mapping* mapping, int access);

/* --- sharing --------------------------------------------------------------- */
enum mb_export_flags { MB_EXPORT_NO_PID_CHECK = 1, MB_EXPORT_READ_ONLY = 2 };
#define MB_TOKEN_BYTES 129 /* a token and its NUL fit in this many bytes */
MB_C_API int mb_export(mb_client* client, const mb_handle* handle, uint32_t flags, char* token,
                       size_t token_capacity);
MB_C_API int mb_set_pids(mb_client* client, const char* token, const pid_t* pids, size_t count);
MB_C_API int mb_import(mb_client* client, const char* token, mb_handle** out);

/* --- named objects ------------------------------------------------------------ */
/* MB_PUBLISH_CLUSTER: listed for the whole cluster (membrokerd --cluster; docs/CLUSTER.md). */
enum mb_publish_flags { MB_PUBLISH_READ_ONLY = 1, MB_PUBLISH_PERSIST = 2, MB_PUBLISH_REPLACE = 4, MB_PUBLISH_CLUSTER = 8 };
MB_C_API int mb_publish(mb_client* client, const char* name, const mb_handle* handle, uint32_t flags);
/* Waits up to timeout_ms for the name (MB_TIMEOUT); 0: MB_NOT_FOUND at once. */
MB_C_API int mb_lookup(mb_client* client, const char* name, int timeout_ms, mb_handle** out);
MB_C_API int mb_unpublish(mb_client* client, const char* name);
/* Where a name published with MB_PUBLISH_CLUSTER lives, on any host of the
 * cluster. Waits up to timeout_ms (MB_TIMEOUT); 0: MB_NOT_FOUND at once.
 * MB_UNSUPPORTED without a cluster; MB_NOT_CONNECTED while etcd is out of reach. */
typedef struct mb_cluster_name {
  char host[65];       /* NUL-terminated */
  uint64_t generation; /* the host's registration: larger for a host that came back */
  uint64_t size;
  int read_only;
} mb_cluster_name;
MB_C_API int mb_lookup_cluster(mb_client* client, const char* name, int timeout_ms, mb_cluster_name* out);
/* A name published read-only for the cluster (MB_PUBLISH_CLUSTER | MB_PUBLISH_READ_ONLY) on
 * another host, copied into new broker memory here through engine and that host's
 * membroker-share, every byte checked against the share's checksum (docs/CLUSTER.md). *out:
 * the new handle (on this host already: the object itself); where, if not NULL: where it came
 * from. Waits up to timeout_ms in all. MB_UNSUPPORTED for a name not published read-only;
 * MB_DATA_LOSS for bytes that do not match their checksum. */
MB_C_API int mb_fetch_named(mb_client* client, mb_engine* engine, const char* name, int timeout_ms,
                            mb_handle** out, mb_cluster_name* where);
/* Events for names starting with prefix ("" for all), queued in the broker
 * (1024 at most per client). */
#define MB_MAX_OBJECT_NAME_BYTES 256
enum mb_event_kind { MB_EVENT_PUBLISHED = 0, MB_EVENT_UNPUBLISHED = 1, MB_EVENT_HOLDER_DIED = 2, MB_EVENT_HOST_GONE = 3 };
typedef struct mb_name_event {
  int kind;                                /* enum mb_event_kind */
  char name[MB_MAX_OBJECT_NAME_BYTES + 1]; /* NUL-terminated */
  uint64_t allocation;
  pid_t pid;        /* the publisher, or the process that died holding the object */
  uint64_t dropped; /* events lost to a full queue since mb_subscribe */
  char host[65];    /* another host's name for the cluster (mb_subscribe_cluster); "" for this host's */
} mb_name_event;
MB_C_API int mb_subscribe(mb_client* client, const char* prefix);
/* The same, and other hosts' events for names published with MB_PUBLISH_CLUSTER
 * (MB_EVENT_HOST_GONE when their host goes). MB_UNSUPPORTED without a cluster. */
MB_C_API int mb_subscribe_cluster(mb_client* client, const char* prefix);
/* The oldest event; waits up to timeout_ms for one (MB_TIMEOUT). */
MB_C_API int mb_wait_event(mb_client* client, int timeout_ms, mb_name_event* out);
/* An fd for an event loop (epoll, libuv): readable when a name event or a notify
 * for this client's engine may be queued. Its one reader calls
 * mb_client_drain_wake_fd, then takes what is queued (mb_wait_event with timeout
 * 0, mb_engine_get_notify), in that order. Made on the first call; the same fd for
 * the client's life, broker restarts included; owned by the client. */
MB_C_API int mb_client_wake_fd(mb_client* client, int* fd);
MB_C_API void mb_client_drain_wake_fd(mb_client* client);

/* --- the transfer engine (HIXL's shape; docs/TRANSFER.md) -------------------- */
enum mb_transfer_op { MB_READ = 0, MB_WRITE = 1 };
typedef struct mb_transfer_desc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
} mb_transfer_desc;
MB_C_API int mb_engine_create(mb_client* client, const char* local_name, mb_engine** out);
/* With Initialize's options as count key/value pairs (docs/TRANSFER.md): "copy_threads",
 * "listen_address" ("ip:port"), "secret_file", "allow_from", ... Engines on other hosts are
 * then reached with mb_engine_connect(engine, "ip:port", timeout_ms). */
MB_C_API int mb_engine_create_with_options(mb_client* client, const char* local_name, const char* const* keys,
                                           const char* const* values, size_t count, mb_engine** out);
/* How a connection reaches its peer: path "ucx" or "same-host", and the transports
 * ("tcp/eth0.0", "memcpy"); each NUL-terminated, truncated to its buffer. */
MB_C_API int mb_engine_connection_path(mb_engine* engine, const char* remote, char* path, size_t path_len,
                                       char* transports, size_t transports_len);
/* The address this engine listens on ("" when it does not); NUL-terminated, truncated. */
MB_C_API int mb_engine_listen_address(mb_engine* engine, char* address, size_t len);
MB_C_API void mb_engine_destroy(mb_engine* engine); /* Finalize, then free */
MB_C_API int mb_engine_register(mb_engine* engine, uintptr_t addr, size_t len, uint64_t* mem_handle);
MB_C_API int mb_engine_deregister(mb_engine* engine, uint64_t mem_handle);
/* Registers under a name (1 to 32 bytes, unique in the engine: MB_ALREADY_EXISTS)
 * that connected peers find the range by, with mb_engine_remote_region. */
MB_C_API int mb_engine_register_named(mb_engine* engine, uintptr_t addr, size_t len, const char* name,
                                      uint64_t* mem_handle);
/* Where a connected remote engine's range called name is in its process (*addr, *len):
 * a descriptor's remote_addr is *addr plus an offset. MB_NOT_FOUND when it has none. */
MB_C_API int mb_engine_remote_region(mb_engine* engine, const char* remote, const char* name, int timeout_ms,
                                     uintptr_t* addr, size_t* len);
MB_C_API int mb_engine_connect(mb_engine* engine, const char* remote, int timeout_ms);
MB_C_API int mb_engine_disconnect(mb_engine* engine, const char* remote, int timeout_ms);
MB_C_API int mb_engine_transfer_sync(mb_engine* engine, const char* remote, int op,
                                     const mb_transfer_desc* descs, size_t count, int timeout_ms);
/* Queues the transfer; *req names it for mb_engine_transfer_status. */
MB_C_API int mb_engine_transfer_async(mb_engine* engine, const char* remote, int op,
                                      const mb_transfer_desc* descs, size_t count, int timeout_ms, uint64_t* req);
enum mb_transfer_status { MB_TRANSFER_WAITING = 0, MB_TRANSFER_COMPLETED = 1, MB_TRANSFER_TIMEOUT = 2,
                          MB_TRANSFER_FAILED = 3 };
/* *status: WAITING, or a final status, reported once (then req is unknown:
 * MB_PARAM_INVALID). After FAILED or TIMEOUT, mb_last_error_message() says why. */
MB_C_API int mb_engine_transfer_status(mb_engine* engine, uint64_t req, int* status);
/* Notifies: small messages between connected engines (HIXL's SendNotify). */
#define MB_MAX_ENGINE_NAME_BYTES 256
#define MB_MAX_NOTIFY_NAME_BYTES 128
#define MB_MAX_NOTIFY_MESSAGE_BYTES 1024
typedef struct mb_notify {
  char remote_engine[MB_MAX_ENGINE_NAME_BYTES + 1]; /* the sender, NUL-terminated */
  char name[MB_MAX_NOTIFY_NAME_BYTES + 1];          /* NUL-terminated */
  char msg[MB_MAX_NOTIFY_MESSAGE_BYTES];            /* msg_len bytes, not terminated */
  size_t msg_len;
} mb_notify;
/* MB_RESOURCE_EXHAUSTED when the remote's queue (256) is full. */
MB_C_API int mb_engine_send_notify(mb_engine* engine, const char* remote, const char* name, const void* msg,
                                   size_t msg_len, int timeout_ms);
/* The oldest notify queued for this engine; MB_NOT_FOUND when there is none. */
MB_C_API int mb_engine_get_notify(mb_engine* engine, mb_notify* out);
/* The same, waiting up to timeout_ms (0 to 600000) for one: MB_TIMEOUT when none
 * came. It reads the client's wake fd: not while an event loop reads it too. */
MB_C_API int mb_engine_wait_notify(mb_engine* engine, int timeout_ms, mb_notify* out);

/* --- channels: zero-copy publish/subscribe (docs/PIPELINE.md) ----------------
 * One publisher and up to 63 subscribers over a pool of chunks in broker
 * memory that each side maps once. A publisher or subscriber is used by one
 * thread at a time. */
typedef struct mb_channel_publisher mb_channel_publisher;
typedef struct mb_channel_subscriber mb_channel_subscriber;
enum mb_channel_mode { MB_CHANNEL_BROADCAST = 0, MB_CHANNEL_WORK_SHARING = 1 };
enum mb_when_full { MB_WHEN_FULL_WAIT = 0, MB_WHEN_FULL_DROP_OLDEST = 1 };
enum mb_wake { MB_WAKE_FUTEX = 0, MB_WAKE_POLL = 1 };
typedef struct mb_channel_options {
  uint32_t chunks;       /* in the pool, 1 to 65536 */
  size_t chunk_bytes;    /* each chunk's capacity */
  uint32_t queue_depth;  /* per subscriber: a power of two, 1 to 4096 */
  int mode;              /* enum mb_channel_mode */
  int when_full;         /* enum mb_when_full: a full queue makes Publish wait, or drops its oldest */
  int wake;              /* enum mb_wake: how the publisher waits for chunks or room */
  int read_only_chunks;  /* nonzero: subscribers map the chunks read-only */
  int page_policy;       /* enum mb_page_policy, for the chunks */
} mb_channel_options;
/* A loaned (publisher) or received (subscriber) chunk; data is valid until it
 * is published, discarded or released. */
typedef struct mb_chunk {
  uint32_t index;
  void* data;
  size_t capacity;
  size_t size;       /* publisher: set before mb_channel_publish; subscriber: what was published */
  uint64_t sequence; /* publication number, from 1 */
} mb_chunk;
typedef struct mb_channel_stats {
  uint64_t published, dropped, unreceived, reaped, reclaimed, redelivered;
  uint32_t subscribers;
} mb_channel_stats;
/* The C++ defaults: 64 chunks of 1 MiB, queue depth 16, broadcast, wait, futex,
 * read-only chunks, normal pages. */
MB_C_API void mb_channel_options_init(mb_channel_options* options);
/* Creates the channel and publishes it as name (options NULL: the defaults);
 * MB_ALREADY_EXISTS when the name is taken. */
MB_C_API int mb_channel_create(mb_client* client, const char* name, const mb_channel_options* options,
                               mb_channel_publisher** out);
/* Closes the channel: subscribers drain what is queued, then get MB_NOT_CONNECTED. */
MB_C_API void mb_channel_close(mb_channel_publisher* publisher);
MB_C_API int mb_channel_loan(mb_channel_publisher* publisher, size_t bytes, int timeout_ms, mb_chunk* out);
MB_C_API int mb_channel_publish(mb_channel_publisher* publisher, mb_chunk* chunk, int timeout_ms);
MB_C_API int mb_channel_discard(mb_channel_publisher* publisher, mb_chunk* chunk);
MB_C_API int mb_channel_wait_for_subscribers(mb_channel_publisher* publisher, uint32_t n, int timeout_ms);
/* Cleans up after subscribers whose process died; how many. */
MB_C_API size_t mb_channel_reap(mb_channel_publisher* publisher);
MB_C_API int mb_channel_stats_get(const mb_channel_publisher* publisher, mb_channel_stats* out);
/* Waits up to lookup_timeout_ms for the name (0: MB_NOT_FOUND at once). */
MB_C_API int mb_channel_join(mb_client* client, const char* name, int wake, int lookup_timeout_ms,
                             mb_channel_subscriber** out);
/* Releases what it holds, gives its slot back, frees it. */
MB_C_API void mb_channel_leave(mb_channel_subscriber* subscriber);
/* MB_TIMEOUT when nothing came; MB_NOT_CONNECTED once the publisher is gone and nothing is queued. */
MB_C_API int mb_channel_receive(mb_channel_subscriber* subscriber, int timeout_ms, mb_chunk* out);
MB_C_API int mb_channel_release(mb_channel_subscriber* subscriber, const mb_chunk* chunk);
/* An fd for an event loop: readable when a chunk may be queued or the publisher
 * has gone. Poll it after mb_channel_receive answered MB_TIMEOUT, then call
 * mb_channel_drain_wake_fd and mb_channel_receive with timeout 0. Owned by the
 * subscriber. */
MB_C_API int mb_channel_wake_fd(mb_channel_subscriber* subscriber, int* fd);
MB_C_API void mb_channel_drain_wake_fd(mb_channel_subscriber* subscriber);

/* --- the tensor ring: one producer, one consumer, in a mapped region -------
 * (docs/PIPELINE.md). The ring lives in memory both processes mapped (any
 * addresses); a dead consumer's slot stays for its replacement. */
typedef struct mb_tensor_ring mb_tensor_ring;
typedef struct mb_ring_slot {
  uint64_t sequence; /* position in the ring's history */
  void* data;
  size_t capacity;
  uint64_t frame_id; /* set by mb_tensor_ring_publish */
  size_t bytes;      /* set by mb_tensor_ring_publish */
} mb_ring_slot;
/* Bytes a ring of slots slots of slot_bytes each needs. */
MB_C_API size_t mb_tensor_ring_bytes_for(uint32_t slots, size_t slot_bytes);
/* Formats [base, base+size) as an empty ring. */
MB_C_API int mb_tensor_ring_create(void* base, size_t size, uint32_t slots, size_t slot_bytes, mb_tensor_ring** out);
/* Attaches to a ring another process formatted: MB_PARAM_INVALID when there is
 * none, MB_PROTOCOL_ERROR when what it wrote is impossible. */
MB_C_API int mb_tensor_ring_attach(void* base, size_t size, mb_tensor_ring** out);
MB_C_API void mb_tensor_ring_free(mb_tensor_ring* ring); /* the memory stays as it is */
MB_C_API int mb_tensor_ring_acquire_for_write(mb_tensor_ring* ring, int timeout_ms, mb_ring_slot* out);
MB_C_API int mb_tensor_ring_publish(mb_tensor_ring* ring, const mb_ring_slot* slot, uint64_t frame_id, size_t bytes);
MB_C_API int mb_tensor_ring_acquire_for_read(mb_tensor_ring* ring, int timeout_ms, mb_ring_slot* out);
MB_C_API int mb_tensor_ring_release(mb_tensor_ring* ring, const mb_ring_slot* slot);
/* 0 while nothing was published: a restarted producer resumes after it. */
MB_C_API uint64_t mb_tensor_ring_last_published_frame(const mb_tensor_ring* ring);

/* --- KV-cache stores (docs/KV.md) -------------------------------------------
 * A node-wide cache of fixed-size blocks found by opaque keys (1 to 64 bytes),
 * shared by every process of the host. Blocks are put in two phases (reserve,
 * write in place, seal) and read under leases; both end with their process,
 * however it ends. Batches of any length (the library splits them). */
typedef struct mb_kv_store mb_kv_store;
typedef struct mb_kv_leases mb_kv_leases;
typedef struct mb_kv_put mb_kv_put;
typedef struct mb_kv_key {
  const void* data;
  size_t size;
} mb_kv_key;
enum mb_kv_eviction { MB_KV_S3FIFO = 0, MB_KV_LRU = 1 };
typedef struct mb_kv_store_options {
  size_t block_size; /* a multiple of 64 bytes, at most 256 MiB */
  size_t capacity;   /* bytes: rounded down to whole blocks, all reserved at creation */
  int page_policy;   /* enum mb_page_policy */
  int eviction;      /* enum mb_kv_eviction */
} mb_kv_store_options;
MB_C_API void mb_kv_store_options_init(mb_kv_store_options* options);
/* Creates the store, or opens it if it exists with the same block size
 * (MB_ALREADY_EXISTS with another). */
MB_C_API int mb_kv_store_create(mb_client* client, const char* name, const mb_kv_store_options* options,
                                mb_kv_store** out);
MB_C_API int mb_kv_store_open(mb_client* client, const char* name, mb_kv_store** out);
/* Frees this handle of the store (the store stays in the broker). Leases and
 * puts taken through it stay valid until they are released or freed. */
MB_C_API void mb_kv_store_close(mb_kv_store* store);
/* Removes a store nobody leases from or writes to (MB_BUSY otherwise). */
MB_C_API int mb_kv_store_drop(mb_client* client, const char* name);
MB_C_API size_t mb_kv_store_block_size(const mb_kv_store* store);
MB_C_API size_t mb_kv_store_blocks(const mb_kv_store* store);
/* found[i] = 1 where keys[i] is sealed in the store, 0 otherwise. */
MB_C_API int mb_kv_exists(mb_kv_store* store, const mb_kv_key* keys, size_t n, uint8_t* found);
/* How many keys, from the first, the store has. */
MB_C_API int mb_kv_prefix_hits(mb_kv_store* store, const mb_kv_key* keys, size_t n, size_t* hits);
/* Leases on the blocks of keys found; mb_kv_leases_release ends them. */
MB_C_API int mb_kv_get(mb_kv_store* store, const mb_kv_key* keys, size_t n, mb_kv_leases** out);
MB_C_API size_t mb_kv_leases_count(const mb_kv_leases* leases);
MB_C_API size_t mb_kv_leases_leading(const mb_kv_leases* leases); /* found from the first key on */
/* Block i's sealed bytes (read-only memory) and their length; NULL where the
 * key was not found or i is past the batch. */
MB_C_API const void* mb_kv_leases_block(const mb_kv_leases* leases, size_t i, size_t* length);
/* Ends the leases and frees leases (NULL is fine); its blocks are no longer to be read. */
MB_C_API void mb_kv_leases_release(mb_kv_leases* leases);
/* Reserves a block per key; mb_kv_put_status says which to write. */
MB_C_API int mb_kv_reserve(mb_kv_store* store, const mb_kv_key* keys, size_t n, mb_kv_put** out);
MB_C_API size_t mb_kv_put_count(const mb_kv_put* put);
/* MB_OK: reserved, to fill and seal; MB_ALREADY_EXISTS, MB_BUSY (another
 * process writes it), MB_RESOURCE_EXHAUSTED. After mb_kv_seal: MB_OK, or why it
 * was not sealed (MB_STALE: the broker restarted since the reservation). */
MB_C_API int mb_kv_put_status(const mb_kv_put* put, size_t i);
/* Where to write block i (block_size bytes), or NULL unless it is reserved and not sealed. */
MB_C_API void* mb_kv_put_block(const mb_kv_put* put, size_t i);
/* The block's length (default: block_size), 1 to block_size. */
MB_C_API int mb_kv_put_set_length(mb_kv_put* put, size_t i, size_t length);
/* Seals every reserved block: visible to every process, immutable. MB_OK, or
 * the first block's failure (each block's in mb_kv_put_status). */
MB_C_API int mb_kv_seal(mb_kv_put* put);
/* Aborts what was neither sealed nor aborted, and frees put (NULL is fine). */
MB_C_API void mb_kv_put_free(mb_kv_put* put);
/* Reserve, copy values[i] (lengths[i] bytes) in, seal: statuses[i] per key
 * (MB_OK, MB_ALREADY_EXISTS, ...). */
MB_C_API int mb_kv_put_batch(mb_kv_store* store, const mb_kv_key* keys, const void* const* values,
                             const size_t* lengths, size_t n, int* statuses);

#ifdef __cplusplus
}
#endif

#endif /* MEMBROKER_MEMBROKER_H */
