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
  mb_unmap(m);
  mb_reservation_release(r);
  mb_handle_free(h);
  mb_client_close(c);
  return 0;
}
