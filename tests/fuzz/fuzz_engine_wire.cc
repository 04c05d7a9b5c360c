// libFuzzer: arbitrary bytes into the decoder of what engines on two hosts
// say to each other (libclient/transfer/ucx/engine_wire.h) - the bytes a remote, possibly
// hostile, host controls, and into the decoder of data messages' headers.
// The format is canonical: whatever decodes must
// encode back to exactly the same bytes. The same bytes are also read as a
// name card, which FetchNamed reads from another host's share.
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>

#include <vector>

#include "transfer/share/name_card.h"
#include "transfer/ucx/engine_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::detail::wire;
  // As a name card (a short page reads as zero-padded): what decodes is
  // within its bounds and encodes back to a card that decodes the same.
  {
    namespace share = membroker::share;
    std::vector<uint8_t> page(share::kCardBytes, 0);
    std::memcpy(page.data(), data, std::min(size, page.size()));
    if (auto c = share::DecodeCard(page); c.ok()) {
      if (c->name.empty() || c->name.size() > share::kCardNameMax || c->size == 0 || c->object_address % 4096 != 0)
        std::abort();
      std::vector<uint8_t> again(share::kCardBytes);
      if (!share::EncodeCard(*c, again).ok() || !(*share::DecodeCard(again) == *c)) std::abort();
    }
  }
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
