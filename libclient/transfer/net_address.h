// Network addresses for the transfer engine's cross-host path: "ip:port"
// strings as HIXL spells them ("10.0.0.1:5000", "[fd00::1]:5000"), and the
// operator's allow-list of addresses and prefixes ("10.0.0.0/24,fd00::7").
// Names only: nothing here resolves a host name or touches the network.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <string_view>
#include <vector>

#include "membroker/status.h"

namespace membroker::detail {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  uint16_t port() const;
};

// "a.b.c.d:port" or "[v6]:port"; port 1..65535, or 0 too with allow_any_port
// (a listener that lets the kernel choose).
Result<SocketAddress> ParseHostPort(std::string_view text, bool allow_any_port = false);
// Whether text has the shape of an address rather than an engine name.
bool LooksLikeHostPort(std::string_view text);
// "10.0.0.1:5000", "[fd00::1]:5000".
std::string FormatAddress(const sockaddr* addr);

struct AddressPrefix {
  int family = AF_INET;
  uint8_t bytes[16]{};
  int bits = 0;
};
// Comma-separated addresses and prefixes; spaces around items are ignored.
Result<std::vector<AddressPrefix>> ParseAllowList(std::string_view text);
bool AddressAllowed(const std::vector<AddressPrefix>& allow, const sockaddr* addr);

}  // namespace membroker::detail
