// libmembroker-ucx.so's one export: the entry libmembroker's loader looks up
// (transfer/net_transport.h). Everything else in the module is hidden.
#include "transfer/net_transport.h"
#include "transfer/ucx/ucx_transport.h"

extern "C" __attribute__((visibility("default"))) void membroker_net_transport_start_v1(
    membroker::detail::NetOptions options,
    membroker::Result<std::unique_ptr<membroker::detail::NetTransport>>* out) {
  auto started = membroker::detail::UcxTransport::Start(std::move(options));
  if (!started.ok()) {
    *out = started.status();
    return;
  }
  *out = std::unique_ptr<membroker::detail::NetTransport>(std::move(*started));
}
