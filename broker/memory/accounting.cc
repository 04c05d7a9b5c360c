#include "memory/accounting.h"

#include "size_text.h"

#include <cstdlib>
#include <optional>
#include <sstream>

namespace membroker::broker {

namespace {
uint64_t SatSub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// "in use + request > limit" without overflow.
bool Exceeds(uint64_t used, uint64_t add, uint64_t limit) {
  return add > limit || used > limit - add;
}

Status Over(ErrorCode code, const std::string& who, const char* what, uint64_t limit, uint64_t used,
            uint64_t add) {
  return Status(code, who + " " + what + " limit " + std::to_string(limit) + ": in use " +
                          std::to_string(used) + ", this request needs " + std::to_string(add));
}

// who: "client", or (with uid) that uid's limits; its text is made only for
// an error (a check runs for every charge).
Status CheckLimits(ErrorCode code, const char* who, const Usage& used, const QuotaLimits& l, const Usage& d,
                   std::optional<uid_t> uid = std::nullopt) {
  auto over = [&](const char* what, uint64_t limit, uint64_t in_use, uint64_t add) {
    return Over(code, uid ? "uid " + std::to_string(*uid) : std::string(who), what, limit, in_use, add);
  };
  if (d.bytes && Exceeds(used.bytes, d.bytes, l.bytes)) return over("bytes", l.bytes, used.bytes, d.bytes);
  if (d.pinned_bytes && Exceeds(used.pinned_bytes, d.pinned_bytes, l.pinned_bytes))
    return over("pinned bytes", l.pinned_bytes, used.pinned_bytes, d.pinned_bytes);
  if (d.allocations && Exceeds(used.allocations, d.allocations, l.allocations))
    return over("allocations", l.allocations, used.allocations, d.allocations);
  if (d.imports && Exceeds(used.imports, d.imports, l.imports))
    return over("imports", l.imports, used.imports, d.imports);
  if (d.device_bytes && Exceeds(used.device_bytes, d.device_bytes, l.device_bytes))
    return over("device bytes", l.device_bytes, used.device_bytes, d.device_bytes);
  if (d.kv_bytes && Exceeds(used.kv_bytes, d.kv_bytes, l.kv_bytes))
    return over("KV bytes (kv=, blocks leased or reserved)", l.kv_bytes, used.kv_bytes, d.kv_bytes);
  return Status::Ok();
}

}  // namespace

Usage Usage::For(uint64_t size, bool pinned, int on_device) {
  if (on_device >= 0) return Usage{.allocations = 1, .device_bytes = size, .device = on_device};
  return Usage{.bytes = size, .pinned_bytes = pinned ? size : 0, .allocations = 1};
}

Usage& Usage::operator+=(const Usage& o) {
  device_bytes += o.device_bytes;
  kv_bytes += o.kv_bytes;
  bytes += o.bytes;
  pinned_bytes += o.pinned_bytes;
  allocations += o.allocations;
  imports += o.imports;
  return *this;
}

Usage& Usage::operator-=(const Usage& o) {
  device_bytes = SatSub(device_bytes, o.device_bytes);
  kv_bytes = SatSub(kv_bytes, o.kv_bytes);
  bytes = SatSub(bytes, o.bytes);
  pinned_bytes = SatSub(pinned_bytes, o.pinned_bytes);
  allocations = SatSub(allocations, o.allocations);
  imports = SatSub(imports, o.imports);
  return *this;
}

Status QuotaLimits::Parse(const std::string& spec) {
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    size_t eq = item.find('=');
    std::string text = eq == std::string::npos ? "" : item.substr(eq + 1);
    uint64_t v = kUnlimited;
    if (text != "unlimited" && !ParseSize(text, &v))
      return Status(ErrorCode::kParamInvalid,
                    "bad quota item '" + item + "' (want key=SIZE or key=unlimited)");
    std::string key = item.substr(0, eq);
    if (key == "bytes") bytes = v;
    else if (key == "pinned") pinned_bytes = v;
    else if (key == "allocations") allocations = v;
    else if (key == "imports") imports = v;
    else if (key == "device")
      device_bytes = v;
    else if (key == "kv")
      kv_bytes = v;
    else
      return Status(ErrorCode::kParamInvalid,
                    "unknown quota key '" + key + "' (bytes, pinned, allocations, imports, device, kv)");
  }
  return Status::Ok();
}

std::string QuotaLimits::ToString() const {
  auto f = [](uint64_t v) { return v == kUnlimited ? std::string("unlimited") : std::to_string(v); };
  return "bytes=" + f(bytes) + ",pinned=" + f(pinned_bytes) + ",allocations=" + f(allocations) +
         ",imports=" + f(imports) + ",device=" + f(device_bytes) + ",kv=" + f(kv_bytes);
}

const QuotaLimits& Accounting::LimitsFor(uid_t uid) const {
  auto it = uid_limits.find(uid);
  return it == uid_limits.end() ? uid_default : it->second;
}

Status Accounting::Check(const Usage& client, uid_t uid, const Usage& d) const {
  if (d.bytes && Exceeds(total_.bytes, d.bytes, max_bytes))
    return Over(ErrorCode::kResourceExhausted, "broker", "byte budget (--max-bytes)", max_bytes,
                total_.bytes, d.bytes);
  if (d.pinned_bytes && Exceeds(total_.pinned_bytes, d.pinned_bytes, max_pinned_bytes))
    return Over(ErrorCode::kResourceExhausted, "broker", "pinned budget (--max-pinned-bytes)",
                max_pinned_bytes, total_.pinned_bytes, d.pinned_bytes);
  if (d.device_bytes) {
    auto budget = max_device_bytes.find(d.device);
    if (budget != max_device_bytes.end() && Exceeds(device_total(d.device), d.device_bytes, budget->second))
      return Over(ErrorCode::kResourceExhausted, "broker",
                  ("device " + std::to_string(d.device) + " budget (--max-device-bytes)").c_str(), budget->second,
                  device_total(d.device), d.device_bytes);
  }
  MB_RETURN_IF_ERROR(CheckLimits(ErrorCode::kQuotaExceeded, "client", client, client_limits, d));
  auto it = by_uid_.find(uid);
  Usage none;
  return CheckLimits(ErrorCode::kQuotaExceeded, "uid", it == by_uid_.end() ? none : it->second, LimitsFor(uid), d,
                     uid);
}

uint64_t Accounting::device_total(int device) const {
  auto it = device_total_.find(device);
  return it == device_total_.end() ? 0 : it->second;
}

void Accounting::ChargeUid(uid_t uid, const Usage& delta) {
  by_uid_[uid] += delta;
  total_ += delta;
  if (delta.device_bytes) device_total_[delta.device] += delta.device_bytes;
}

void Accounting::ReleaseUid(uid_t uid, const Usage& delta) {
  auto it = by_uid_.find(uid);
  if (it != by_uid_.end()) {
    it->second -= delta;
    const Usage& u = it->second;
    if (!u.bytes && !u.pinned_bytes && !u.allocations && !u.imports && !u.device_bytes && !u.kv_bytes)
      by_uid_.erase(it);
  }
  total_ -= delta;
  if (auto d = device_total_.find(delta.device); delta.device_bytes && d != device_total_.end()) {
    d->second = SatSub(d->second, delta.device_bytes);
    if (d->second == 0) device_total_.erase(d);
  }
}

}  // namespace membroker::broker
