// What etcd's JSON gateway (its v3 API as POST /v3/...) answers, decoded and
// checked: keys and values travel base64-encoded, 64-bit numbers as decimal
// strings. etcd is shared with other software and the network is between us,
// so every answer is bounded and checked here before anything uses it; the
// fuzzer (tests/fuzz/fuzz_cluster.cc) feeds these functions hostile bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "membroker/status.h"

namespace membroker::broker {

// An answer or a watch line longer than this is refused, unread.
inline constexpr size_t kEtcdMaxAnswerBytes = 4u << 20;

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

struct EtcdEvent {
  bool deleted = false;
  EtcdKv kv;
};

// The parts of one answer membroker reads. error_code is etcd's gRPC code
// (0 when the answer is not an error: 5 NOT_FOUND, 16 UNAUTHENTICATED, ...).
struct EtcdAnswer {
  int error_code = 0;
  std::string error;
  int64_t revision = 0;  // header.revision
  std::vector<EtcdKv> kvs;  // range; a txn's failure branch's range
  int64_t lease_id = 0, ttl = 0;  // lease grant and keep-alive ("TTL" absent: the lease is gone)
  bool succeeded = false;  // txn
  std::string token;  // auth/authenticate
  // Watch stream lines: created, canceled (with a reason), compact_revision, events.
  bool created = false, canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<EtcdEvent> events;
};

// One answer (or one line of a watch stream, {"result": {...}} or {"error": {...}}).
Result<EtcdAnswer> ParseEtcdAnswer(std::string_view text);

std::string Base64Encode(std::string_view bytes);
// Strict: the standard alphabet, '=' padding only at the end; false otherwise.
bool Base64Decode(std::string_view text, std::string* out);

// The end of a prefix range: the prefix with its last byte incremented (etcd's rule).
std::string PrefixEnd(std::string prefix);

}  // namespace membroker::broker
