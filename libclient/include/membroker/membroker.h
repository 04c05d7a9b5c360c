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
  MB_ADDRESS_IN_USE = 19
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
enum mb_publish_flags { MB_PUBLISH_READ_ONLY = 1, MB_PUBLISH_PERSIST = 2 };
MB_C_API int mb_publish(mb_client* client, const char* name, const mb_handle* handle, uint32_t flags);
/* Waits up to timeout_ms for the name (MB_TIMEOUT); 0: MB_NOT_FOUND at once. */
MB_C_API int mb_lookup(mb_client* client, const char* name, int timeout_ms, mb_handle** out);
MB_C_API int mb_unpublish(mb_client* client, const char* name);

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
MB_C_API int mb_engine_connect(mb_engine* engine, const char* remote, int timeout_ms);
MB_C_API int mb_engine_disconnect(mb_engine* engine, const char* remote, int timeout_ms);
MB_C_API int mb_engine_transfer_sync(mb_engine* engine, const char* remote, int op,
                                     const mb_transfer_desc* descs, size_t count, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* MEMBROKER_MEMBROKER_H */
