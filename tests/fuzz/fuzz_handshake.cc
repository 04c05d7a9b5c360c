// libFuzzer: arbitrary bytes into the decoder of the handshake's frames
// (libclient/transfer/ucx/handshake.h), the first bytes anyone who reaches a
// listening engine's port controls: as a stream into the frame reader, and as
// a frame's body. The format is canonical: whatever decodes must encode back
// to exactly the same bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transfer/ucx/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::detail::handshake;
  // As a stream: read as the door reads, only what the frame still wants.
  FrameReader r;
  size_t pos = 0;
  for (;;) {
    auto wanted = r.Wanted();
    if (!wanted.ok()) break;
    if (*wanted == 0) {
      if (auto f = Decode(r.body()); f.ok()) {
        const std::string again = Encode(*f);
        if (again.size() != pos || std::memcmp(again.data(), data, pos) != 0) std::abort();
      }
      break;
    }
    if (pos == size) break;
    const size_t n = std::min(*wanted, size - pos);
    r.Append(data + pos, n);
    pos += n;
  }
  // As a body.
  if (auto f = Decode({data, size}); f.ok()) {
    const std::string again = Encode(*f);
    if (again.size() != size + kLengthBytes || std::memcmp(again.data() + kLengthBytes, data, size) != 0) std::abort();
  }
  return 0;
}
