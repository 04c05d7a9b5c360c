// libFuzzer: arbitrary bytes into the decoder of what engines on two hosts
// say to each other (libclient/transfer/ucx/engine_wire.h) - the bytes a remote, possibly
// hostile, host controls, and into the decoder of data messages' headers.
// The format is canonical: whatever decodes must
// encode back to exactly the same bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transfer/ucx/engine_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::detail::wire;
  // The same bytes as a data message's header.
  if (auto h = DecodeData({data, size}); h.ok()) {
    const EncodedDataHeader again = EncodeData(*h);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  // And as a batch's segment table, its first 8 bytes the total it claims.
  if (size >= 8) {
    uint64_t total = 0;
    std::memcpy(&total, data, 8);
    const size_t count = (size - 8) / kSegmentBytes;
    if (auto segs = DecodeSegments({data + 8, size - 8}, count, total); segs.ok()) {
      const std::string again = EncodeSegments(*segs);
      if (again.size() != count * kSegmentBytes || std::memcmp(again.data(), data + 8, again.size()) != 0) std::abort();
    }
  }
  auto m = Decode({data, size});
  if (!m.ok()) return 0;
  const std::string again = Encode(*m);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  return 0;
}
