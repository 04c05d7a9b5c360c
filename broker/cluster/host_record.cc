#include "cluster/host_record.h"

#include <arpa/inet.h>

#include <nlohmann/json.hpp>

#include "cluster/etcd_json.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"

namespace membroker::broker {

namespace {

using nlohmann::json;

Status Bad(std::string_view host, const std::string& what) {
  return Status(ErrorCode::kProtocolError,
                "the record of host '" + ipc::EscapeText(host) + "' in etcd is malformed: " + what);
}

bool ValidBootId(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

Status CheckHostName(std::string_view name) {
  const auto ok = [](char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (!first && (c == '.' || c == '_' || c == '-'));
  };
  if (name.empty() || name.size() > kHostNameMax)
    return Status(ErrorCode::kParamInvalid, "a host name is 1 to 64 characters");
  for (size_t i = 0; i < name.size(); ++i)
    if (!ok(name[i], i == 0))
      return Status(ErrorCode::kParamInvalid,
                    "a host name is letters, digits, '.', '_' and '-', and starts with a letter or digit");
  return Status::Ok();
}

bool ValidListenAddress(std::string_view a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= a.size() || a.size() - colon - 1 > 5) return false;
  uint32_t port = 0;
  for (char c : a.substr(colon + 1)) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port == 0 || port > 65535) return false;
  std::string ip(a.substr(0, colon));
  unsigned char buf[16];
  if (ip.size() > 2 && ip.front() == '[' && ip.back() == ']')
    return inet_pton(AF_INET6, ip.substr(1, ip.size() - 2).c_str(), buf) == 1;
  return inet_pton(AF_INET, ip.c_str(), buf) == 1;
}

std::string EncodeHostRecord(const HostRecord& r) {
  json engines = json::array();
  for (const HostEngine& e : r.engines) engines.push_back({{"name", e.name}, {"address", e.address}});
  json names = json::array();
  for (const HostName& n : r.names)
    names.push_back({{"name", n.name},
                     {"size", n.size},
                     {"read_only", n.read_only},
                     {"meta", Base64Encode(n.metadata)},
                     {"allocation", n.allocation}});
  const json doc = {{"v", 1},           {"host", r.host},       {"pid", r.pid},
                    {"boot_id", r.boot_id}, {"pid_ns", r.pid_ns}, {"started", r.started_s},
                    {"engines", engines},   {"names", names}};
  // Engine and object names are checked UTF-8 (ipc::CheckName), so dump cannot throw.
  return doc.dump();
}

Result<HostRecord> DecodeHostRecord(std::string_view host, std::string_view value) {
  MB_RETURN_IF_ERROR(CheckHostName(host));
  if (value.size() > kHostRecordMaxBytes) return Bad(host, std::to_string(value.size()) + " bytes");
  const json doc = json::parse(value.begin(), value.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Bad(host, "not a JSON object");
  const auto field = [&](const char* key) -> const json* {
    auto it = doc.find(key);
    return it == doc.end() ? nullptr : &*it;
  };
  const json* v = field("v");
  if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() != 1) return Bad(host, "not version 1");
  HostRecord r;
  const json* name = field("host");
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>() != host)
    return Bad(host, "its host field differs from its key");
  r.host = std::string(host);
  const json* pid = field("pid");
  if (pid == nullptr || !pid->is_number_integer() || pid->get<int64_t>() <= 0 || pid->get<int64_t>() > INT32_MAX)
    return Bad(host, "no pid");
  r.pid = static_cast<int32_t>(pid->get<int64_t>());
  const json* boot = field("boot_id");
  if (boot == nullptr || !boot->is_string() || !ValidBootId(boot->get_ref<const std::string&>()))
    return Bad(host, "no boot id");
  r.boot_id = boot->get<std::string>();
  const json* ns = field("pid_ns");
  if (ns == nullptr || !ns->is_number_unsigned()) return Bad(host, "no pid namespace");
  r.pid_ns = ns->get<uint64_t>();
  const json* started = field("started");
  if (started == nullptr || !started->is_number_integer() || started->get<int64_t>() < 0)
    return Bad(host, "no start time");
  r.started_s = started->get<int64_t>();
  const json* engines = field("engines");
  if (engines == nullptr || !engines->is_array() || engines->size() > kHostEnginesMax)
    return Bad(host, "no list of engines, or more than 256");
  for (const json& e : *engines) {
    if (!e.is_object()) return Bad(host, "an engine is not an object");
    auto n = e.find("name");
    auto a = e.find("address");
    if (n == e.end() || a == e.end() || !n->is_string() || !a->is_string())
      return Bad(host, "an engine without a name or an address");
    HostEngine he{n->get<std::string>(), a->get<std::string>()};
    if (!ipc::CheckName(he.name, 128, "an engine name").ok()) return Bad(host, "an engine name");
    if (!ValidListenAddress(he.address)) return Bad(host, "an engine address");
    r.engines.push_back(std::move(he));
  }
  const json* names = field("names");
  if (names != nullptr && (!names->is_array() || names->size() > kHostNamesMax))
    return Bad(host, "its names are not a list of at most 128");
  for (const json& n : names != nullptr ? *names : json::array()) {
    if (!n.is_object()) return Bad(host, "a name is not an object");
    auto name = n.find("name");
    auto size = n.find("size");
    auto ro = n.find("read_only");
    auto meta = n.find("meta");
    if (name == n.end() || size == n.end() || ro == n.end() || meta == n.end() || !name->is_string() ||
        !size->is_number_unsigned() || !ro->is_boolean() || !meta->is_string())
      return Bad(host, "a name without its name, size, read_only or meta");
    HostName hn{name->get<std::string>(), size->get<uint64_t>(), ro->get<bool>(), {}, 0};
    if (auto id = n.find("allocation"); id != n.end()) {  // optional: a broker before it wrote none
      if (!id->is_number_unsigned()) return Bad(host, "a name's allocation is not a number");
      hn.allocation = id->get<uint64_t>();
    }
    if (!ipc::CheckName(hn.name, ipc::kMaxObjectNameBytes, "a name").ok()) return Bad(host, "an object name");
    const std::string& text = meta->get_ref<const std::string&>();
    if (text.size() > (ipc::kMaxObjectMetadataBytes + 2) / 3 * 4 || !Base64Decode(text, &hn.metadata) ||
        hn.metadata.size() > ipc::kMaxObjectMetadataBytes)
      return Bad(host, "the metadata of name '" + ipc::EscapeText(hn.name) + "'");
    r.names.push_back(std::move(hn));
  }
  return r;
}

}  // namespace membroker::broker
