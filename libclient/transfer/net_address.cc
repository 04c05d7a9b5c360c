#include "transfer/net_address.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace membroker::detail {

namespace {

Status Bad(std::string_view text, std::string_view why) {
  return Status(ErrorCode::kParamInvalid, "address \"" + std::string(text) + "\": " + std::string(why));
}

// Fills out with the IPv4 or IPv6 address in host (no port); false if it is neither.
bool ParseIp(const std::string& host, int* family, uint8_t out[16]) {
  if (::inet_pton(AF_INET, host.c_str(), out) == 1) return *family = AF_INET, true;
  if (::inet_pton(AF_INET6, host.c_str(), out) == 1) return *family = AF_INET6, true;
  return false;
}

// The address bytes of addr, v4-mapped v6 addresses as v4.
int AddressBytes(const sockaddr* addr, uint8_t out[16]) {
  if (addr->sa_family == AF_INET) {
    std::memcpy(out, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, 4);
    return AF_INET;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a6)) {
      std::memcpy(out, a6->s6_addr + 12, 4);
      return AF_INET;
    }
    std::memcpy(out, a6->s6_addr, 16);
    return AF_INET6;
  }
  return AF_UNSPEC;
}

}  // namespace

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

Result<SocketAddress> ParseHostPort(std::string_view text, bool allow_any_port) {
  std::string host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return Bad(text, "an IPv6 address is written [address]:port");
    host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return Bad(text, "expected ip:port");
    host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535 ||
      (value == 0 && !allow_any_port))
    return Bad(text, allow_any_port ? "the port must be 0 to 65535" : "the port must be 1 to 65535");
  int family = AF_UNSPEC;
  uint8_t bytes[16];
  if (!ParseIp(host, &family, bytes))
    return Bad(text, "the host must be a numeric IPv4 or IPv6 address (names are not resolved)");
  if (family == AF_INET6 && text.front() != '[') return Bad(text, "an IPv6 address is written [address]:port");
  SocketAddress out;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(value));
    std::memcpy(&a->sin_addr, bytes, 4);
    out.length = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(value));
    std::memcpy(&a->sin6_addr, bytes, 16);
    out.length = sizeof(sockaddr_in6);
  }
  return out;
}

bool LooksLikeHostPort(std::string_view text) { return ParseHostPort(text).ok(); }

std::string FormatAddress(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "(address family " + std::to_string(addr->sa_family) + ")";
}

Result<std::vector<AddressPrefix>> ParseAllowList(std::string_view text) {
  std::vector<AddressPrefix> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    AddressPrefix p;
    const size_t slash = item.find('/');
    if (!ParseIp(std::string(item.substr(0, slash)), &p.family, p.bytes))
      return Bad(item, "allow_from takes numeric addresses or prefixes (10.0.0.0/24, fd00::/64)");
    const int max_bits = p.family == AF_INET ? 32 : 128;
    p.bits = max_bits;
    if (slash != std::string_view::npos) {
      std::string_view bits = item.substr(slash + 1);
      auto [end, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), p.bits);
      if (bits.empty() || ec != std::errc() || end != bits.data() + bits.size() || p.bits < 0 || p.bits > max_bits)
        return Bad(item, "the prefix length must be 0 to " + std::to_string(max_bits));
    }
    out.push_back(p);
  }
  return out;
}

bool AddressAllowed(const std::vector<AddressPrefix>& allow, const sockaddr* addr) {
  uint8_t bytes[16];
  const int family = AddressBytes(addr, bytes);
  for (const AddressPrefix& p : allow) {
    if (p.family != family) continue;
    const int full = p.bits / 8, rest = p.bits % 8;
    if (std::memcmp(bytes, p.bytes, full) != 0) continue;
    if (rest != 0) {
      const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
      if ((bytes[full] & mask) != (p.bytes[full] & mask)) continue;
    }
    return true;
  }
  return false;
}

}  // namespace membroker::detail
