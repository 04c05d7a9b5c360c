/* A C program against the installed C API (pkg-config membroker-c). */
#include <membroker/membroker.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  mb_client* c = NULL;
  if (argc != 2 || mb_connect(argv[1], "c-consumer", 0, &c) != MB_OK) {
    fprintf(stderr, "connect: %s\n", mb_last_error_message());
    return 1;
  }
  mb_handle* h = NULL;
  mb_reservation* r = NULL;
  mb_mapping* m = NULL;
  if (mb_malloc_physical(c, 4096, MB_NORMAL_ONLY, 0, &h) != MB_OK || mb_reserve(c, 4096, 0, &r) != MB_OK ||
      mb_map(c, r, 0, 0, 0, h, &m) != MB_OK) {
    fprintf(stderr, "%s\n", mb_last_error_message());
    return 1;
  }
  memset(mb_mapping_data(m), 7, 4096);
  /* A channel, as the installed header and library have them: one chunk out, to nobody. */
  mb_channel_options o;
  mb_channel_options_init(&o);
  o.chunks = 2;
  o.chunk_bytes = 4096;
  mb_channel_publisher* pub = NULL;
  mb_chunk chunk;
  if (mb_channel_create(c, "consumer/chan", &o, &pub) != MB_OK || mb_channel_loan(pub, 64, 1000, &chunk) != MB_OK) {
    fprintf(stderr, "channel: %s\n", mb_last_error_message());
    return 1;
  }
  chunk.size = 64;
  if (mb_channel_publish(pub, &chunk, 1000) != MB_OK || chunk.sequence != 1) {
    fprintf(stderr, "publish: %s\n", mb_last_error_message());
    return 1;
  }
  mb_channel_close(pub);
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
  mb_client_close(c);
  return 0;
}
