// libFuzzer: arbitrary bytes as an sd_notify datagram into the keeper's parser
// (broker/keeper/notify_message.h). The keeper reads only its own broker's
// datagrams, but a parser that reads a process's bytes is hardened anyway:
// no crash, and what it accepts keeps the rules it promises.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "keeper/notify_message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::broker::keeper;
  std::string error;
  const auto m = ParseNotifyMessage(std::string_view(reinterpret_cast<const char*>(data), size), &error);
  if (m) {
    if (!IsValidFdName(m->fd_name)) std::abort();
    if (m->fd_store && m->fd_store_remove) std::abort();
  } else if (error.empty()) {
    std::abort();  // a refusal always says why
  }
  return 0;
}
