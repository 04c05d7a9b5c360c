// Tokens (token.h).
#include "memory/token.h"

#include <sys/random.h>

#include <array>

#include "membroker/ipc/syscall.h"

namespace membroker::broker {

Result<std::string> RandomToken() {
  std::array<unsigned char, 16> bytes{};
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = 0;
    MB_RETURN_IF_ERROR(ipc::CheckedCall("getrandom", "16 bytes", &n, [&] {
      return ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    }));
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(32);
  for (unsigned char b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace membroker::broker
