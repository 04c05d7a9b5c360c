// libFuzzer: arbitrary bytes as what etcd answers (cluster/etcd_json.h) and as
// a host's record stored there (cluster/host_record.h). etcd is shared with
// other software and the network lies between: no crash, and whatever is
// accepted holds to the checks (a valid host name, at most 256 engines each
// with a valid address, at most 128 names with at most 4 KiB of metadata) and
// encodes back to itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cluster/etcd_json.h"
#include "cluster/host_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace membroker::broker;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto answer = ParseEtcdAnswer(bytes);
  if (answer.ok())
    for (const EtcdEvent& e : answer->events) (void)DecodeHostRecord(e.kv.key, e.kv.value);
  std::string decoded;
  if (Base64Decode(bytes, &decoded) && Base64Encode(decoded).size() != bytes.size()) std::abort();
  auto record = DecodeHostRecord("host-1", bytes);
  if (record.ok()) {
    if (!CheckHostName(record->host).ok() || record->engines.size() > kHostEnginesMax) std::abort();
    for (const HostEngine& e : record->engines)
      if (!ValidListenAddress(e.address)) std::abort();
    if (record->names.size() > kHostNamesMax) std::abort();
    for (const HostName& n : record->names)
      if (n.name.empty() || n.metadata.size() > 4096) std::abort();
    auto again = DecodeHostRecord("host-1", EncodeHostRecord(*record));
    if (!again.ok() || EncodeHostRecord(*again) != EncodeHostRecord(*record)) std::abort();
  }
  return 0;
}
