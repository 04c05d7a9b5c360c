#include "cluster/etcd_json.h"

#include <nlohmann/json.hpp>

namespace membroker::broker {

namespace {

using nlohmann::json;

Status Malformed(const std::string& what) {
  return Status(ErrorCode::kProtocolError, "etcd answered something malformed: " + what);
}

const json* Member(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

// A 64-bit integer as the gateway writes it: a decimal string (or, from other
// gateways, a plain number). Absent is 0.
Status Int(const json& o, const char* key, int64_t* out) {
  *out = 0;
  const json* v = Member(o, key);
  if (v == nullptr) return Status::Ok();
  if (v->is_number_integer()) {
    *out = v->get<int64_t>();
    return Status::Ok();
  }
  if (!v->is_string()) return Malformed(std::string(key) + " is not a number");
  const std::string& s = v->get_ref<const std::string&>();
  if (s.empty() || s.size() > 20) return Malformed(std::string(key) + " is not a number");
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return Malformed(std::string(key) + " is not a number");
  int64_t n = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return Malformed(std::string(key) + " is not a number");
    const int d = s[i] - '0';
    if (n > (INT64_MAX - d) / 10) return Malformed(std::string(key) + " is out of range");
    n = n * 10 + d;
  }
  *out = s[0] == '-' ? -n : n;
  return Status::Ok();
}

Status Bytes(const json& o, const char* key, std::string* out) {
  out->clear();
  const json* v = Member(o, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string() || !Base64Decode(v->get_ref<const std::string&>(), out))
    return Malformed(std::string(key) + " is not base64");
  return Status::Ok();
}

Status Text(const json& o, const char* key, std::string* out) {
  out->clear();
  const json* v = Member(o, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string()) return Malformed(std::string(key) + " is not a string");
  *out = v->get<std::string>();
  return Status::Ok();
}

Status Flag(const json& o, const char* key, bool* out) {
  *out = false;
  const json* v = Member(o, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_boolean()) return Malformed(std::string(key) + " is not true or false");
  *out = v->get<bool>();
  return Status::Ok();
}

Status Kv(const json& o, EtcdKv* kv) {
  if (!o.is_object()) return Malformed("a key-value is not an object");
  MB_RETURN_IF_ERROR(Bytes(o, "key", &kv->key));
  MB_RETURN_IF_ERROR(Bytes(o, "value", &kv->value));
  MB_RETURN_IF_ERROR(Int(o, "create_revision", &kv->create_revision));
  MB_RETURN_IF_ERROR(Int(o, "mod_revision", &kv->mod_revision));
  return Int(o, "lease", &kv->lease);
}

Status Kvs(const json& o, std::vector<EtcdKv>* out) {
  const json* kvs = Member(o, "kvs");
  if (kvs == nullptr) return Status::Ok();
  if (!kvs->is_array()) return Malformed("kvs is not a list");
  for (const json& k : *kvs) {
    EtcdKv kv;
    MB_RETURN_IF_ERROR(Kv(k, &kv));
    out->push_back(std::move(kv));
  }
  return Status::Ok();
}

Status Body(const json& o, EtcdAnswer* a) {
  if (const json* h = Member(o, "header")) MB_RETURN_IF_ERROR(Int(*h, "revision", &a->revision));
  MB_RETURN_IF_ERROR(Kvs(o, &a->kvs));
  MB_RETURN_IF_ERROR(Int(o, "ID", &a->lease_id));
  MB_RETURN_IF_ERROR(Int(o, "TTL", &a->ttl));
  MB_RETURN_IF_ERROR(Flag(o, "succeeded", &a->succeeded));
  MB_RETURN_IF_ERROR(Text(o, "token", &a->token));
  MB_RETURN_IF_ERROR(Flag(o, "created", &a->created));
  MB_RETURN_IF_ERROR(Flag(o, "canceled", &a->canceled));
  MB_RETURN_IF_ERROR(Int(o, "compact_revision", &a->compact_revision));
  MB_RETURN_IF_ERROR(Text(o, "cancel_reason", &a->cancel_reason));
  // A txn's answers: the ranges it ran (a failed claim reads the key it found).
  if (const json* rs = Member(o, "responses")) {
    if (!rs->is_array()) return Malformed("responses is not a list");
    for (const json& r : *rs)
      if (const json* range = Member(r, "response_range")) MB_RETURN_IF_ERROR(Kvs(*range, &a->kvs));
  }
  if (const json* events = Member(o, "events")) {
    if (!events->is_array()) return Malformed("events is not a list");
    for (const json& e : *events) {
      EtcdEvent ev;
      std::string type;
      MB_RETURN_IF_ERROR(Text(e, "type", &type));
      if (!type.empty() && type != "PUT" && type != "DELETE") return Malformed("an event of type '" + type + "'");
      ev.deleted = type == "DELETE";
      const json* kv = Member(e, "kv");
      if (kv == nullptr) return Malformed("an event without its key");
      MB_RETURN_IF_ERROR(Kv(*kv, &ev.kv));
      a->events.push_back(std::move(ev));
    }
  }
  return Status::Ok();
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

Result<EtcdAnswer> ParseEtcdAnswer(std::string_view text) {
  if (text.size() > kEtcdMaxAnswerBytes) return Malformed("an answer of " + std::to_string(text.size()) + " bytes");
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Malformed("not a JSON object");
  EtcdAnswer a;
  // A gateway error: {"error": "...", "code": N, "message": "..."}; in a stream,
  // {"error": {"grpc_code": N, "message": "..."}}.
  const json* err = Member(doc, "error");
  if (err != nullptr) {
    const json& e = err->is_object() ? *err : doc;
    int64_t code = 0;
    MB_RETURN_IF_ERROR(Int(e, err->is_object() ? "grpc_code" : "code", &code));
    MB_RETURN_IF_ERROR(Text(e, "message", &a.error));
    if (a.error.empty() && err->is_string()) a.error = err->get<std::string>();
    a.error_code = code > 0 && code < 64 ? static_cast<int>(code) : 2;  // 2: gRPC's UNKNOWN
    if (a.error.size() > 512) a.error.resize(512);
    return a;
  }
  const json* result = Member(doc, "result");
  MB_RETURN_IF_ERROR(Body(result != nullptr ? *result : doc, &a));
  return a;
}

std::string Base64Encode(std::string_view in) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const uint32_t n = static_cast<uint8_t>(in[i]) << 16 |
                       (i + 1 < in.size() ? static_cast<uint8_t>(in[i + 1]) << 8 : 0) |
                       (i + 2 < in.size() ? static_cast<uint8_t>(in[i + 2]) : 0);
    out += kAlphabet[n >> 18 & 63];
    out += kAlphabet[n >> 12 & 63];
    out += i + 1 < in.size() ? kAlphabet[n >> 6 & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

bool Base64Decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return false;  // "x=y=" style
    uint32_t n = 0;
    for (int j = 0; j < 4 - pad; ++j) {
      const int v = Base64Value(in[i + j]);
      if (v < 0) return false;
      n |= static_cast<uint32_t>(v) << (18 - 6 * j);
    }
    out->push_back(static_cast<char>(n >> 16));
    if (pad < 2) out->push_back(static_cast<char>(n >> 8 & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(n & 0xff));
  }
  return true;
}

std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // the whole key space
}

}  // namespace membroker::broker
