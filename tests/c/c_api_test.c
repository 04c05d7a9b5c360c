/* The C API, compiled as C, between two processes against a real broker:
 * allocation, the VMM path, sharing by token with a pid allow-list, named
 * objects and their events, error codes and messages, transfer-engine
 * WRITEs (sync and async) into the other process's memory and a notify, a
 * channel to a subscriber process, and a tensor ring read by another process.
 *   c_api_test PATH_TO_membrokerd */
#define _GNU_SOURCE
#include <membroker/membroker.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
              #cond, mb_last_error_message());                                        \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)
#define MUST(cond)                                                                   \
  do {                                                                               \
    if (!(cond)) { /* evaluated once: it may have effects */                        \
      fprintf(stderr, "%s:%d: MUST(%s) failed; last error: %s\n", __FILE__, __LINE__, \
              #cond, mb_last_error_message());                                       \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

enum { kSize = 1 << 20 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static pid_t g_broker = 0;
static void stop_broker_on_failure(void) {
  if (g_broker > 0) kill(g_broker, SIGKILL); /* a failed MUST leaves no broker behind */
}

static void send_line(int fd, const char* s) { MUST(write(fd, s, strlen(s) + 1) == (ssize_t)(strlen(s) + 1)); }
static void recv_line(int fd, char* buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, 1);
    MUST(r == 1);
    if (buf[n++] == '\0') return;
  }
  MUST(0);
}

/* A thread waiting for a name event on a client another thread also waits on. */
struct event_waiter {
  mb_client* c;
  int rc;
  mb_name_event ev;
  int started; /* set just before its mb_wait_event */
  int done;    /* set when its mb_wait_event returned */
};
static void* wait_for_event(void* arg) {
  struct event_waiter* w = (struct event_waiter*)arg;
  __atomic_store_n(&w->started, 1, __ATOMIC_SEQ_CST);
  w->rc = mb_wait_event(w->c, 30000, &w->ev);
  __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* Maps all of handle h at the start of a fresh reservation of its size. */
static void map_whole(mb_client* c, const mb_handle* h, mb_reservation** r, mb_mapping** m) {
  MUST(mb_reserve(c, mb_handle_size(h), 0, r) == MB_OK);
  MUST(mb_map(c, *r, 0, 0, 0, h, m) == MB_OK);
}

/* The bytes of publication (or frame) `sequence`, written and checked. */
static unsigned char pattern_byte(uint64_t sequence, size_t i) { return (unsigned char)(sequence * 31 + i); }
static void fill_pattern(void* data, size_t n, uint64_t sequence) {
  for (size_t i = 0; i < n; ++i) ((unsigned char*)data)[i] = pattern_byte(sequence, i);
}
static int holds_pattern(const void* data, size_t n, uint64_t sequence) {
  for (size_t i = 0; i < n; ++i)
    if (((const unsigned char*)data)[i] != pattern_byte(sequence, i)) return 0;
  return 1;
}

/* The child: imports by token, checks the named object, and offers its own
 * memory to the parent's engine. */
static char g_secret[300]; /* the engines' secret_file, written by main */

static int child(const char* sock, int in, int out) {
  mb_client* c = NULL;
  MUST(mb_connect(sock, "c-child", 0, &c) == MB_OK);
  char token[MB_TOKEN_BYTES];
  recv_line(in, token, sizeof(token));
  mb_handle* h = NULL;
  MUST(mb_import(c, token, &h) == MB_OK);
  mb_reservation* r = NULL;
  mb_mapping* m = NULL;
  map_whole(c, h, &r, &m);
  const unsigned char* p = (const unsigned char*)mb_mapping_data(m);
  for (size_t i = 0; i < kSize; i += 4096) CHECK(p[i] == (unsigned char)(i / 4096));
  ((unsigned char*)mb_mapping_data(m))[1] = 0xab; /* seen by the parent: the same pages */

  mb_handle* again = NULL;  /* one import per allocation and client */
  CHECK(mb_import(c, token, &again) == MB_ALREADY_EXISTS && again == NULL);
  mb_handle* named = NULL;
  MUST(mb_lookup(c, "c-api/named", 5000, &named) == MB_OK);
  CHECK(mb_handle_size(named) == 8192);
  CHECK(mb_handle_read_only(named));

  /* It listens on loopback with the shared secret; the parent connects by address. */
  mb_engine* e = NULL;
  const char* keys[] = {"listen_address", "secret_file"};
  const char* values[] = {"127.0.0.1:0", g_secret};
  int rc = mb_engine_create_with_options(c, "c-child", keys, values, 2, &e);
  if (rc == MB_UNSUPPORTED) MUST(mb_engine_create(c, "c-child", &e) == MB_OK); /* built without UCX */
  else MUST(rc == MB_OK);
  char listen[80] = "";
  MUST(mb_engine_listen_address(e, listen, sizeof(listen)) == MB_OK);
  const char* bad_keys[] = {"listen_address"};
  const char* bad_values[] = {"127.0.0.1:0"};
  mb_engine* open_door = NULL;
  rc = mb_engine_create_with_options(c, "c-open", bad_keys, bad_values, 1, &open_door);
  CHECK((rc == MB_PARAM_INVALID || rc == MB_UNSUPPORTED) && open_door == NULL); /* admits nobody: refused */
  mb_handle* own = NULL;
  MUST(mb_malloc_physical(c, 65536, MB_NORMAL_ONLY, 0, &own) == MB_OK);
  mb_reservation* orr = NULL;
  mb_mapping* om = NULL;
  MUST(mb_reserve(c, 65536, 0, &orr) == MB_OK && mb_map(c, orr, 0, 0, 0, own, &om) == MB_OK);
  uint64_t reg = 0;
  MUST(mb_engine_register_named(e, (uintptr_t)mb_mapping_data(om), 65536, "kv", &reg) == MB_OK);
  char addr[64];
  snprintf(addr, sizeof(addr), "%lu", (unsigned long)(uintptr_t)mb_mapping_data(om));
  send_line(out, addr);
  send_line(out, listen[0] ? listen : "c-child");
  char done[16];
  recv_line(in, done, sizeof(done)); /* the parent wrote into our memory */
  CHECK(strcmp(done, "written") == 0);
  CHECK(memcmp(mb_mapping_data(om), "hello from C", 12) == 0);
  CHECK(memcmp((char*)mb_mapping_data(om) + 4096, "async from C", 12) == 0);
  /* The parent's notify, queued before it said "written". */
  mb_notify n;
  CHECK(mb_engine_wait_notify(e, 30000, &n) == MB_OK);
  CHECK(strcmp(n.remote_engine, "c-parent") == 0 && strcmp(n.name, "kv-ready") == 0);
  CHECK(n.msg_len == 7 && memcmp(n.msg, "layer 7", 7) == 0);
  CHECK(mb_engine_get_notify(e, &n) == MB_NOT_FOUND);
  CHECK(mb_engine_wait_notify(e, 10, &n) == MB_TIMEOUT);
  CHECK(mb_engine_wait_notify(e, -1, &n) == MB_PARAM_INVALID);

  MUST(mb_engine_deregister(e, reg) == MB_OK);
  mb_engine_destroy(e);
  mb_unmap(om);
  mb_reservation_release(orr);
  mb_handle_free(own);
  mb_handle_free(named);
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
  mb_client_close(c);
  return failures == 0 ? 0 : 1;
}

/* KV-cache stores: a block's bytes follow from its key's number. */
static void kv_key(mb_kv_key* k, char* buf, int i) {
  k->size = (size_t)snprintf(buf, 32, "c-key-%d", i);
  k->data = buf;
}
static unsigned char kv_byte(int key, size_t i) { return (unsigned char)(key * 13 + i); }

/* A reader process: opens the store by name and checks every byte it leases. */
static int kv_reader(const char* sock) {
  mb_client* c = NULL;
  MUST(mb_connect(sock, "c-kv-reader", 0, &c) == MB_OK);
  mb_kv_store* s = NULL;
  MUST(mb_kv_store_open(c, "c-api/kv", &s) == MB_OK);
  char bufs[10][32];
  mb_kv_key keys[10];
  for (int i = 0; i < 10; ++i) kv_key(&keys[i], bufs[i], i);
  size_t hits = 0;
  CHECK(mb_kv_prefix_hits(s, keys, 10, &hits) == MB_OK && hits == 8);
  mb_kv_leases* got = NULL;
  MUST(mb_kv_get(s, keys, 10, &got) == MB_OK);
  CHECK(mb_kv_leases_count(got) == 10 && mb_kv_leases_leading(got) == 8);
  for (int i = 0; i < 8; ++i) {
    size_t len = 0;
    const unsigned char* b = mb_kv_leases_block(got, (size_t)i, &len);
    CHECK(b != NULL && len == (i == 7 ? 100 : 4096));
    for (size_t j = 0; b != NULL && j < len; ++j)
      if (b[j] != kv_byte(i, j)) {
        CHECK(!"a leased block holds its key's bytes");
        break;
      }
  }
  size_t len = 1;
  CHECK(mb_kv_leases_block(got, 8, &len) == NULL && len == 0);
  CHECK(mb_kv_leases_block(got, 99, NULL) == NULL);
  mb_kv_leases_release(got);
  mb_kv_store_close(s);
  mb_client_close(c);
  return failures;
}

static void kv_checks(const char* sock, mb_client* c) {
  mb_kv_store_options o;
  mb_kv_store_options_init(&o);
  mb_kv_store* s = NULL;
  CHECK(mb_kv_store_create(c, "c-api/kv", &o, &s) == MB_PARAM_INVALID && s == NULL); /* no block size */
  o.block_size = 4096;
  o.capacity = 64 * 4096;
  o.eviction = 9;
  CHECK(mb_kv_store_create(c, "c-api/kv", &o, &s) == MB_PARAM_INVALID);
  o.eviction = MB_KV_LRU;
  MUST(mb_kv_store_create(c, "c-api/kv", &o, &s) == MB_OK);
  CHECK(mb_kv_store_block_size(s) == 4096 && mb_kv_store_blocks(s) == 64);
  mb_kv_store* none = NULL;
  CHECK(mb_kv_store_open(c, "c-api/no-such-store", &none) == MB_NOT_FOUND && none == NULL);

  /* Six blocks in one call, two in two phases (one shorter). */
  char bufs[10][32];
  mb_kv_key keys[10];
  unsigned char values[6][4096];
  const void* vp[6];
  size_t lens[6];
  int statuses[6];
  for (int i = 0; i < 10; ++i) kv_key(&keys[i], bufs[i], i);
  for (int i = 0; i < 6; ++i) {
    for (size_t j = 0; j < 4096; ++j) values[i][j] = kv_byte(i, j);
    vp[i] = values[i];
    lens[i] = 4096;
  }
  MUST(mb_kv_put_batch(s, keys, vp, lens, 6, statuses) == MB_OK);
  for (int i = 0; i < 6; ++i) CHECK(statuses[i] == MB_OK);
  MUST(mb_kv_put_batch(s, keys, vp, lens, 1, statuses) == MB_OK);
  CHECK(statuses[0] == MB_ALREADY_EXISTS);
  mb_kv_put* put = NULL;
  MUST(mb_kv_reserve(s, keys + 5, 3, &put) == MB_OK);
  CHECK(mb_kv_put_count(put) == 3 && mb_kv_put_status(put, 0) == MB_ALREADY_EXISTS);
  CHECK(mb_kv_put_block(put, 0) == NULL && mb_kv_put_block(put, 3) == NULL);
  for (int k = 1; k < 3; ++k) {
    unsigned char* b = mb_kv_put_block(put, (size_t)k);
    MUST(b != NULL && mb_kv_put_status(put, (size_t)k) == MB_OK);
    for (size_t j = 0; j < 4096; ++j) b[j] = kv_byte(5 + k, j);
  }
  CHECK(mb_kv_put_set_length(put, 2, 0) == MB_PARAM_INVALID);
  CHECK(mb_kv_put_set_length(put, 2, 4097) == MB_PARAM_INVALID);
  MUST(mb_kv_put_set_length(put, 2, 100) == MB_OK);
  uint8_t found[10];
  CHECK(mb_kv_exists(s, keys, 10, found) == MB_OK && found[6] == 0); /* invisible until sealed */
  MUST(mb_kv_seal(put) == MB_OK);
  CHECK(mb_kv_put_status(put, 1) == MB_OK && mb_kv_put_block(put, 1) == NULL);
  mb_kv_put_free(put);
  CHECK(mb_kv_exists(s, keys, 10, found) == MB_OK && found[7] == 1 && found[8] == 0);

  /* Bad keys get a clear error. */
  char long_key[65];
  memset(long_key, 'k', sizeof(long_key));
  mb_kv_key bad[2] = {{long_key, sizeof(long_key)}, {NULL, 3}};
  mb_kv_leases* got = NULL;
  CHECK(mb_kv_get(s, bad, 1, &got) == MB_PARAM_INVALID && got == NULL);
  CHECK(mb_kv_get(s, bad + 1, 1, &got) == MB_PARAM_INVALID);
  CHECK(mb_kv_get(s, NULL, 2, &got) == MB_PARAM_INVALID);

  /* Another process reads it; a lease held here keeps the store from being dropped. */
  pid_t kid = fork();
  if (kid == 0) {
    g_broker = 0;
    _exit(kv_reader(sock) == 0 ? 0 : 1);
  }
  int status = 0;
  MUST(waitpid(kid, &status, 0) == kid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  MUST(mb_kv_get(s, keys, 1, &got) == MB_OK);
  CHECK(mb_kv_store_drop(c, "c-api/kv") == MB_BUSY);
  mb_kv_leases_release(got);
  mb_kv_leases_release(NULL);
  mb_kv_put_free(NULL);
  mb_kv_store_close(s);
  /* (the release is sent without waiting: the drop waits for it, bounded) */
  int rc = MB_BUSY;
  for (double until = now_s() + 10; rc == MB_BUSY && now_s() < until;) rc = mb_kv_store_drop(c, "c-api/kv");
  CHECK(rc == MB_OK);
}

/* A channel subscriber process: every byte of kChunks chunks, in order. */
enum { kChunks = 50, kChunkBytes = 8192 };

static int channel_subscriber(const char* sock, int out) {
  failures = 0; /* this process's own checks only */
  mb_client* c = NULL;
  MUST(mb_connect(sock, "c-subscriber", 0, &c) == MB_OK);
  mb_channel_subscriber* sub = NULL;
  MUST(mb_channel_join(c, "c-api/chan", MB_WAKE_FUTEX, 5000, &sub) == MB_OK);
  int wake = -1;
  CHECK(mb_channel_wake_fd(sub, &wake) == MB_OK && wake >= 0);
  send_line(out, "joined");
  for (uint64_t n = 1; n <= kChunks; ++n) {
    mb_chunk ch;
    MUST(mb_channel_receive(sub, 10000, &ch) == MB_OK);
    CHECK(ch.sequence == n && ch.size == kChunkBytes);
    CHECK(holds_pattern(ch.data, ch.size, n));
    CHECK(mb_channel_release(sub, &ch) == MB_OK);
    CHECK(mb_channel_release(sub, &ch) == MB_PARAM_INVALID); /* once */
  }
  mb_chunk none;
  CHECK(mb_channel_receive(sub, 10000, &none) == MB_NOT_CONNECTED); /* the publisher closed it */
  mb_channel_leave(sub);
  mb_client_close(c);
  return failures == 0 ? 0 : 1;
}

static void channel_checks(const char* sock, mb_client* c) {
  mb_channel_options o;
  mb_channel_options_init(&o);
  CHECK(o.chunks == 64 && o.chunk_bytes == (1u << 20) && o.queue_depth == 16 && o.read_only_chunks == 1);
  mb_channel_publisher* pub = NULL;
  o.mode = 7;
  CHECK(mb_channel_create(c, "c-api/chan", &o, &pub) == MB_PARAM_INVALID && pub == NULL);
  o.mode = MB_CHANNEL_BROADCAST;
  o.queue_depth = 3; /* not a power of two */
  CHECK(mb_channel_create(c, "c-api/chan", &o, &pub) == MB_PARAM_INVALID);
  o.chunks = 4;
  o.chunk_bytes = kChunkBytes;
  o.queue_depth = 2;
  MUST(mb_channel_create(c, "c-api/chan", &o, &pub) == MB_OK);
  mb_channel_publisher* twice = NULL;
  CHECK(mb_channel_create(c, "c-api/chan", &o, &twice) == MB_ALREADY_EXISTS);
  mb_channel_subscriber* nobody = NULL;
  CHECK(mb_channel_join(c, "c-api/no-such-channel", MB_WAKE_FUTEX, 0, &nobody) == MB_NOT_FOUND);
  mb_chunk big;
  CHECK(mb_channel_loan(pub, kChunkBytes + 1, 0, &big) == MB_PARAM_INVALID);

  int to_parent[2];
  MUST(pipe(to_parent) == 0);
  pid_t kid = fork();
  if (kid == 0) {
    g_broker = 0;
    close(to_parent[0]);
    _exit(channel_subscriber(sock, to_parent[1]));
  }
  close(to_parent[1]);
  char line[16];
  recv_line(to_parent[0], line, sizeof(line));
  CHECK(strcmp(line, "joined") == 0);
  MUST(mb_channel_wait_for_subscribers(pub, 1, 5000) == MB_OK);
  for (uint64_t n = 1; n <= kChunks; ++n) {
    mb_chunk ch;
    MUST(mb_channel_loan(pub, kChunkBytes, 10000, &ch) == MB_OK);
    fill_pattern(ch.data, kChunkBytes, n);
    ch.size = kChunkBytes;
    MUST(mb_channel_publish(pub, &ch, 10000) == MB_OK);
    CHECK(ch.sequence == n);
  }
  mb_chunk spare;
  MUST(mb_channel_loan(pub, 16, 10000, &spare) == MB_OK);
  CHECK(mb_channel_discard(pub, &spare) == MB_OK);
  CHECK(mb_channel_discard(pub, &spare) == MB_PARAM_INVALID);
  mb_channel_stats st;
  MUST(mb_channel_stats_get(pub, &st) == MB_OK);
  CHECK(st.published == kChunks && st.dropped == 0 && st.subscribers == 1);
  mb_channel_close(pub); /* the subscriber drains, then sees NOT_CONNECTED */
  int status = 0;
  MUST(waitpid(kid, &status, 0) == kid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(to_parent[0]);
}

/* A tensor ring's consumer process: imports the ring's memory by token and
 * reads kFrames frames, every byte checked. */
enum { kFrames = 40, kSlots = 4, kSlotBytes = 4096 };
static int ring_consumer(const char* sock, const char* token) {
  failures = 0; /* this process's own checks only */
  mb_client* c = NULL;
  MUST(mb_connect(sock, "c-ring-consumer", 0, &c) == MB_OK);
  mb_handle* h = NULL;
  MUST(mb_import(c, token, &h) == MB_OK);
  mb_reservation* r = NULL;
  mb_mapping* m = NULL;
  map_whole(c, h, &r, &m);
  mb_tensor_ring* ring = NULL;
  MUST(mb_tensor_ring_attach(mb_mapping_data(m), mb_mapping_size(m), &ring) == MB_OK);
  for (uint64_t n = 1; n <= kFrames; ++n) {
    mb_ring_slot slot;
    MUST(mb_tensor_ring_acquire_for_read(ring, 10000, &slot) == MB_OK);
    CHECK(slot.frame_id == n * 10 && slot.bytes == kSlotBytes);
    CHECK(holds_pattern(slot.data, slot.bytes, n));
    CHECK(mb_tensor_ring_release(ring, &slot) == MB_OK);
    CHECK(mb_tensor_ring_release(ring, &slot) == MB_PARAM_INVALID); /* not the oldest any more */
  }
  mb_tensor_ring_free(ring);
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
  mb_client_close(c);
  return failures == 0 ? 0 : 1;
}

static void ring_checks(const char* sock, mb_client* c) {
  const size_t bytes = mb_tensor_ring_bytes_for(kSlots, kSlotBytes);
  CHECK(bytes >= kSlots * kSlotBytes);
  mb_handle* h = NULL;
  MUST(mb_malloc_physical(c, bytes, MB_NORMAL_ONLY, 0, &h) == MB_OK);
  mb_reservation* r = NULL;
  mb_mapping* m = NULL;
  map_whole(c, h, &r, &m);
  mb_tensor_ring* ring = NULL;
  memset(mb_mapping_data(m), 0xff, mb_mapping_size(m)); /* not a ring */
  CHECK(mb_tensor_ring_attach(mb_mapping_data(m), mb_mapping_size(m), &ring) == MB_PARAM_INVALID && ring == NULL);
  CHECK(mb_tensor_ring_create(mb_mapping_data(m), 64, kSlots, kSlotBytes, &ring) != MB_OK); /* too small */
  MUST(mb_tensor_ring_create(mb_mapping_data(m), mb_mapping_size(m), kSlots, kSlotBytes, &ring) == MB_OK);
  CHECK(mb_tensor_ring_last_published_frame(ring) == 0);
  char token[MB_TOKEN_BYTES];
  MUST(mb_export(c, h, MB_EXPORT_NO_PID_CHECK, token, sizeof(token)) == MB_OK);
  pid_t kid = fork();
  if (kid == 0) {
    g_broker = 0;
    _exit(ring_consumer(sock, token));
  }
  for (uint64_t n = 1; n <= kFrames; ++n) {
    mb_ring_slot slot;
    MUST(mb_tensor_ring_acquire_for_write(ring, 10000, &slot) == MB_OK);
    fill_pattern(slot.data, kSlotBytes, n);
    mb_ring_slot stale = slot;
    stale.sequence += 1;
    CHECK(mb_tensor_ring_publish(ring, &stale, n * 10, kSlotBytes) == MB_PARAM_INVALID);
    MUST(mb_tensor_ring_publish(ring, &slot, n * 10, kSlotBytes) == MB_OK);
  }
  int status = 0;
  MUST(waitpid(kid, &status, 0) == kid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(mb_tensor_ring_last_published_frame(ring) == kFrames * 10);
  mb_tensor_ring_free(ring);
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_test PATH_TO_membrokerd\n");
    return 2;
  }
  char dir[] = "/tmp/membroker-c.XXXXXX";
  MUST(mkdtemp(dir) != NULL);
  snprintf(g_secret, sizeof(g_secret), "%s/engine.secret", dir);
  FILE* sf = fopen(g_secret, "w");
  MUST(sf != NULL && fputs("c-api-secret\n", sf) >= 0 && fclose(sf) == 0);
  MUST(chmod(g_secret, 0600) == 0);
  char sock[256], admin[256];
  snprintf(sock, sizeof(sock), "%s/broker.sock", dir);
  snprintf(admin, sizeof(admin), "%s/admin.sock", dir);
  int ready[2];
  MUST(pipe(ready) == 0);
  pid_t broker = fork();
  if (broker == 0) {
    dup2(ready[1], 3);
    execl(argv[1], argv[1], "--socket", sock, "--admin-socket", admin, "--ready-fd", "3", (char*)NULL);
    _exit(127);
  }
  g_broker = broker;
  atexit(stop_broker_on_failure);
  close(ready[1]);
  char line[64] = {0};
  MUST(read(ready[0], line, sizeof(line) - 1) > 0 && strncmp(line, "READY ", 6) == 0);
  close(ready[0]);

  mb_client* c = NULL;
  MUST(mb_connect(sock, "c-parent", 0, &c) == MB_OK);
  CHECK(mb_client_id(c) != 0);
  CHECK(mb_ping(c) == MB_OK);

  /* Errors: codes and messages. */
  mb_handle* bad = NULL;
  CHECK(mb_malloc_physical(c, 0, MB_NORMAL_ONLY, 0, &bad) == MB_PARAM_INVALID && bad == NULL);
  CHECK(strlen(mb_last_error_message()) > 0);
  CHECK(mb_malloc_physical(c, 4096, 9, 0, &bad) == MB_PARAM_INVALID);
  CHECK(mb_import(c, "00000000000000000000000000000000", &bad) == MB_NOT_FOUND);
  CHECK(mb_lookup(c, "c-api/absent", 50, &bad) == MB_TIMEOUT);
  mb_cluster_name where;
  CHECK(mb_lookup_cluster(c, "c-api/absent", 0, &where) == MB_UNSUPPORTED); /* a broker without --cluster */
  CHECK(mb_lookup_cluster(c, "c-api/absent", 0, NULL) == MB_PARAM_INVALID);
  CHECK(mb_subscribe_cluster(c, "c-api/") == MB_UNSUPPORTED);
  mb_engine* fetcher = NULL;
  MUST(mb_engine_create(c, "c-api-fetcher", &fetcher) == MB_OK);
  CHECK(mb_fetch_named(c, fetcher, "c-api/absent", 0, &bad, &where) == MB_UNSUPPORTED);
  CHECK(mb_fetch_named(c, fetcher, "c-api/absent", 0, NULL, &where) == MB_PARAM_INVALID);
  CHECK(strcmp(mb_error_name(MB_DATA_LOSS), "DATA_LOSS") == 0);
  mb_engine_destroy(fetcher);
  CHECK(strcmp(mb_error_name(MB_TIMEOUT), "TIMEOUT") == 0);
  mb_client* none = NULL;
  CHECK(mb_connect("/nonexistent/membroker.sock", "x", 0, &none) == MB_NOT_CONNECTED);

  /* Host memory: pinned broker memory, and this process's own pages pinned. */
  void* pinned = NULL;
  MUST(mb_malloc_host(c, 100000, &pinned) == MB_OK && pinned != NULL);
  memset(pinned, 0x5a, 100000);
  CHECK(((unsigned char*)pinned)[99999] == 0x5a);
  CHECK(mb_free_host(c, pinned) == MB_OK);
  CHECK(mb_free_host(c, pinned) == MB_INVALID_HANDLE);
  void* own = NULL;
  MUST(posix_memalign(&own, 4096, 16 * 4096) == 0);
  memset(own, 0, 16 * 4096);
  CHECK(mb_host_register(c, own, 16 * 4096, 0) == MB_OK);
  CHECK(mb_host_register(c, (char*)own + 4096, 4096, 0) == MB_OVERLAP);
  CHECK(mb_host_register(c, (char*)own + 1, 4096, 0) == MB_PARAM_INVALID);
  CHECK(mb_host_unregister(c, own) == MB_OK);
  CHECK(mb_host_unregister(c, own) == MB_NOT_FOUND);
  free(own);

  mb_handle* h = NULL;
  MUST(mb_malloc_physical(c, kSize, MB_NORMAL_ONLY, 0, &h) == MB_OK);
  CHECK(mb_handle_size(h) == kSize && mb_handle_page_size(h) == 4096);
  mb_reservation* r = NULL;
  MUST(mb_reserve(c, kSize, 0, &r) == MB_OK);
  mb_mapping* m = NULL;
  MUST(mb_map(c, r, 0, 0, 0, h, &m) == MB_OK);
  unsigned char* p = (unsigned char*)mb_mapping_data(m);
  for (size_t i = 0; i < kSize; i += 4096) p[i] = (unsigned char)(i / 4096);
  char token[MB_TOKEN_BYTES];
  MUST(mb_export(c, h, 0, token, sizeof(token)) == MB_OK);
  /* Name events: published and unpublished, then nothing. */
  MUST(mb_subscribe(c, "c-api/ev/") == MB_OK);
  int wake = -1;
  MUST(mb_client_wake_fd(c, &wake) == MB_OK && wake >= 0);
  mb_client_drain_wake_fd(c);
  struct pollfd pfd = {wake, POLLIN, 0};
  CHECK(poll(&pfd, 1, 0) == 0); /* nothing queued */
  mb_handle* evh = NULL;
  MUST(mb_malloc_physical(c, 4096, MB_NORMAL_ONLY, 0, &evh) == MB_OK);
  MUST(mb_publish(c, "c-api/ev/x", evh, 0) == MB_OK);
  CHECK(poll(&pfd, 1, 30000) == 1); /* the event woke the fd */
  mb_client_drain_wake_fd(c);
  mb_name_event ev;
  MUST(mb_wait_event(c, 0, &ev) == MB_OK);
  CHECK(ev.kind == MB_EVENT_PUBLISHED && strcmp(ev.name, "c-api/ev/x") == 0 && ev.pid == getpid());
  CHECK(ev.allocation == mb_handle_id(evh) && ev.dropped == 0);
  CHECK(mb_unpublish(c, "c-api/ev/x") == MB_OK);
  MUST(mb_wait_event(c, 5000, &ev) == MB_OK);
  CHECK(ev.kind == MB_EVENT_UNPUBLISHED && strcmp(ev.name, "c-api/ev/x") == 0);
  CHECK(mb_wait_event(c, 50, &ev) == MB_TIMEOUT);
  /* One thread's long wait does not hold up another's short one: the short
   * one times out while the long one still waits, which the next event ends. */
  struct event_waiter w = {c, -1, {0}, 0, 0};
  pthread_t waiter;
  MUST(pthread_create(&waiter, NULL, wait_for_event, &w) == 0);
  /* Let it get into its call first where it can (yields, not a sleep: when
   * this thread gets there first anyway, the checks below still hold, they
   * only stop telling the two behaviours apart). */
  while (!__atomic_load_n(&w.started, __ATOMIC_SEQ_CST)) sched_yield();
  for (int i = 0; i < 1000; ++i) sched_yield();
  CHECK(mb_wait_event(c, 50, &ev) == MB_TIMEOUT);
  CHECK(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST) == 0);
  MUST(mb_publish(c, "c-api/ev/y", evh, 0) == MB_OK);
  MUST(pthread_join(waiter, NULL) == 0);
  CHECK(w.rc == MB_OK && w.ev.kind == MB_EVENT_PUBLISHED && strcmp(w.ev.name, "c-api/ev/y") == 0);
  CHECK(mb_unpublish(c, "c-api/ev/y") == MB_OK);
  mb_handle_free(evh);

  mb_handle* small = NULL;
  MUST(mb_malloc_physical(c, 8192, MB_NORMAL_ONLY, 0, &small) == MB_OK);
  CHECK(mb_publish(c, "c-api/named", small, MB_PUBLISH_CLUSTER) == MB_UNSUPPORTED); /* no --cluster here */
  MUST(mb_publish(c, "c-api/named", small, MB_PUBLISH_READ_ONLY) == MB_OK);

  int to_child[2], to_parent[2];
  MUST(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t kid = fork();
  if (kid == 0) {
    g_broker = 0; /* the parent's to stop, not ours */
    close(to_child[1]);
    close(to_parent[0]);
    _exit(child(sock, to_child[0], to_parent[1]));
  }
  close(to_child[0]);
  close(to_parent[1]);
  MUST(mb_set_pids(c, token, &kid, 1) == MB_OK); /* only the child may import */
  send_line(to_child[1], token);

  mb_engine* e = NULL;
  const char* keys[] = {"secret_file"};
  const char* values[] = {g_secret};
  int erc = mb_engine_create_with_options(c, "c-parent", keys, values, 1, &e);
  if (erc == MB_UNSUPPORTED) MUST(mb_engine_create(c, "c-parent", &e) == MB_OK);
  else MUST(erc == MB_OK);
  uint64_t reg = 0;
  MUST(mb_engine_register(e, (uintptr_t)p, kSize, &reg) == MB_OK);
  char addr[64], remote[80];
  recv_line(to_parent[0], addr, sizeof(addr));
  recv_line(to_parent[0], remote, sizeof(remote)); /* "127.0.0.1:PORT", or its name without UCX */
  MUST(mb_engine_connect(e, remote, 5000) == MB_OK);
  char path[32], transports[128];
  MUST(mb_engine_connection_path(e, remote, path, sizeof(path), transports, sizeof(transports)) == MB_OK);
  CHECK(strcmp(path, "same-host") == 0); /* one broker: the address's engine is this host's */
  /* The child's range, found by its name. */
  uintptr_t kv = 0;
  size_t kv_len = 0;
  CHECK(mb_engine_remote_region(e, remote, "kv", 5000, &kv, &kv_len) == MB_OK);
  CHECK(kv == (uintptr_t)strtoul(addr, NULL, 10) && kv_len == 65536);
  CHECK(mb_engine_remote_region(e, remote, "nope", 5000, &kv, &kv_len) == MB_NOT_FOUND);
  memcpy(p + 4096, "hello from C", 12);
  mb_transfer_desc d = {(uintptr_t)(p + 4096), (uintptr_t)strtoul(addr, NULL, 10), 4096};
  CHECK(mb_engine_transfer_sync(e, remote, MB_WRITE, &d, 1, 5000) == MB_OK);
  mb_transfer_desc outside = {(uintptr_t)p, 4096, 4096};
  CHECK(mb_engine_transfer_sync(e, remote, MB_WRITE, &outside, 1, 5000) == MB_PARAM_INVALID);
  /* An async WRITE, polled to its end (reported once), and a notify. */
  memcpy(p + 8192, "async from C", 12);
  mb_transfer_desc ad = {(uintptr_t)(p + 8192), (uintptr_t)strtoul(addr, NULL, 10) + 4096, 4096};
  uint64_t req = 0;
  MUST(mb_engine_transfer_async(e, remote, MB_WRITE, &ad, 1, 5000, &req) == MB_OK);
  int ts = MB_TRANSFER_WAITING;
  for (double until = now_s() + 10; ts == MB_TRANSFER_WAITING && now_s() < until;) {
    MUST(mb_engine_transfer_status(e, req, &ts) == MB_OK);
    if (ts == MB_TRANSFER_WAITING) sched_yield();
  }
  CHECK(ts == MB_TRANSFER_COMPLETED);
  CHECK(mb_engine_transfer_status(e, req, &ts) == MB_PARAM_INVALID);
  CHECK(mb_engine_transfer_async(e, remote, 7, &ad, 1, 5000, &req) == MB_PARAM_INVALID);
  CHECK(mb_engine_send_notify(e, remote, "kv-ready", "layer 7", 7, 1000) == MB_OK);
  send_line(to_child[1], "written");
  int status = 0;
  MUST(waitpid(kid, &status, 0) == kid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(p[1] == 0xab);

  channel_checks(sock, c);
  ring_checks(sock, c);
  kv_checks(sock, c);

  CHECK(mb_engine_disconnect(e, remote, 1000) == MB_OK || 1); /* it may have gone already */
  MUST(mb_engine_deregister(e, reg) == MB_OK);
  mb_engine_destroy(e);
  CHECK(mb_unpublish(c, "c-api/named") == MB_OK);
  mb_handle_free(small);
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
  mb_client_close(c);

  kill(broker, SIGTERM);
  MUST(waitpid(broker, &status, 0) == broker);
  g_broker = 0;
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unlink(g_secret);
  char state[sizeof(sock) + 8];
  snprintf(state, sizeof(state), "%s.state", sock); /* the broker keeps its state file: ours to remove */
  unlink(state);
  CHECK(rmdir(dir) == 0);
  printf("c_api_test: %s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
