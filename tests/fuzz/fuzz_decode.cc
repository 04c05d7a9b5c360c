// libFuzzer: arbitrary bytes into the protocol decoder. Anything that decodes
// must re-encode to a frame that decodes to the same message.
#include <cstdint>
#include <cstdlib>

#include "membroker/ipc/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::ipc;
  auto env = Decode({data, size});
  if (!env.ok()) return 0;
  auto again = Decode(Encode(*env));
  if (!again.ok() || !(*again == *env)) std::abort();
  return 0;
}
