// The raw TCP floor for bench/net_transfer.py: one connection, the sender
// writes N bytes from a 1 MiB buffer, the receiver reads them into one and
// answers a byte at the end; the sender prints the seconds it took.
//   bench_tcp_stream serve IP PORT        (prints "ready", then the bytes received)
//   bench_tcp_stream send IP PORT BYTES   (prints seconds)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: bench_tcp_stream serve IP PORT | send IP PORT BYTES\n");
    return 2;
  }
  const std::string mode = argv[1];
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[3])));
  if (::inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) return 2;
  std::vector<char> buf(1 << 20, 1);  // the fastest of 64 KiB to 4 MiB here
  if (mode == "serve") {
    int l = ::socket(AF_INET, SOCK_STREAM, 0), one = 1;
    ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(l, 1) != 0) return 1;
    std::printf("ready\n");
    std::fflush(stdout);
    int c = ::accept(l, nullptr, nullptr);
    unsigned long long total = 0;
    for (ssize_t n; (n = ::recv(c, buf.data(), buf.size(), 0)) > 0;) total += static_cast<size_t>(n);
    (void)!::send(c, "k", 1, MSG_NOSIGNAL);
    std::printf("%llu\n", total);
    return 0;
  }
  const unsigned long long total = std::strtoull(argv[4], nullptr, 10);
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned long long sent = 0; sent < total;) {
    ssize_t n = ::send(c, buf.data(), std::min<unsigned long long>(buf.size(), total - sent), MSG_NOSIGNAL);
    if (n <= 0) return 1;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(c, SHUT_WR);
  char k;
  if (::recv(c, &k, 1, 0) != 1) return 1;
  std::printf("%.6f\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}
