// --metrics-listen: GET /metrics over real HTTP, checked by Prometheus's own
// promtool and scraped by a real prometheus server; hostile connections to
// the port change nothing for the broker's clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

#ifdef MEMBROKER_HAVE_MICROHTTPD
#define MB_METRICS_OR_SKIP()
#else
#define MB_METRICS_OR_SKIP() GTEST_SKIP() << "built without libmicrohttpd"
#endif

bool Exists(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0;
}

// A TCP connection to "ip:port", or -1.
int Dial(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sin.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends request and reads the answer to EOF (bounded: 30 s without a byte).
std::string Exchange(const std::string& address, const std::string& request) {
  int fd = Dial(address);
  if (fd < 0) return "";
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30'000) != 1) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string Get(const std::string& address, const std::string& path) {
  return Exchange(address, "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n\r\n");
}

std::string Body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The address the broker serves metrics on (admin `config`).
std::string MetricsAddress(const BrokerProcess& b) {
  const std::string config = b.Admin("config");
  const size_t at = config.find("metrics-listen: ");
  if (at == std::string::npos) return "";
  return config.substr(at + 16, config.find('\n', at) - at - 16);
}

TEST(Metrics, ServedOverHttpInPrometheusFormat) {
  MB_METRICS_OR_SKIP();
  BrokerProcess b({"--metrics-listen", "127.0.0.1:0"});
  const std::string address = MetricsAddress(b);
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  auto c = Client::Connect({b.socket(), "scraped"});
  ASSERT_TRUE(c.ok());

  // A connection that says nothing and one that sent garbage, both held
  // open, hold nobody up (libmicrohttpd closes them after 10 s idle).
  const int silent = Dial(address);
  ASSERT_GE(silent, 0);
  const int garbage = Dial(address);
  ASSERT_GE(garbage, 0);
  const std::string junk = std::string(64, '\0') + "\xff\xfe GET /metrics\r\n\r\n";
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  const std::string r = Get(address, "/metrics");
  ASSERT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  const std::string body = Body(r);
  EXPECT_NE(body.find("\nmembroker_clients_connected 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("# HELP membroker_requests_total "), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE membroker_requests_total counter"), std::string::npos) << body;
  EXPECT_EQ(Get(address, "/").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(address, "POST /metrics HTTP/1.0\r\nContent-Length: 1\r\n\r\nx").rfind("HTTP/1.1 405", 0), 0u);
  ::close(silent);
  ::close(garbage);

  if (Exists("/usr/bin/promtool")) {  // Prometheus's own linter: help and type for every metric, valid names
    const std::string file = b.dir() + "/metrics.txt";
    std::ofstream(file) << body;
    RunResult lint = RunProgram({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + file});
    EXPECT_EQ(lint.exit_code, 0) << lint.output;
  } else {
    ADD_FAILURE() << "promtool is missing (Debian package prometheus; scripts/test installs it)";
  }
  EXPECT_EQ(b.Stat("clients_connected"), 1u);  // the broker served on through all of it
  EXPECT_EQ(b.Stop(), 0);
}

TEST(Metrics, ABadAddressIsAUsageError) {
  RunResult r = RunBrokerExpectingExit({"--socket", "/tmp/never.sock", "--metrics-listen", "localhost:80"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("metrics-listen"), std::string::npos) << r.output;
}

// A real prometheus server scrapes the broker: the value it stores is the broker's.
TEST(Metrics, ScrapedByARealPrometheus) {
  MB_METRICS_OR_SKIP();
  if (!Exists("/usr/bin/prometheus")) {
    ADD_FAILURE() << "prometheus is missing (Debian package prometheus; scripts/test installs it)";
    return;
  }
  BrokerProcess b({"--metrics-listen", "127.0.0.1:0"});
  const std::string target = MetricsAddress(b);
  std::vector<Client> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(*Client::Connect({b.socket(), "c" + std::to_string(i)}));

  // A free port for prometheus's own web listener.
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)), 0);
  socklen_t len = sizeof(sin);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&sin), &len);
  const std::string web = "127.0.0.1:" + std::to_string(ntohs(sin.sin_port));
  ::close(probe);

  const std::string config = b.dir() + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: membroker\n"
                        << "    static_configs:\n      - targets: ['" << target << "']\n";
  const pid_t prometheus = ForkChild([&] {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const std::string data = "--storage.tsdb.path=" + b.dir() + "/tsdb";
    const std::string cfg = "--config.file=" + config;
    const std::string listen = "--web.listen-address=" + web;
    ::execl("/usr/bin/prometheus", "prometheus", cfg.c_str(), data.c_str(), listen.c_str(), nullptr);
    return 127;
  });
  // Its query API, until the scraped value is there (bounded: 120 s).
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    answer = Body(Get(web, "/api/v1/query?query=membroker_clients_connected"));
    if (answer.find("\"value\":[") != std::string::npos) break;
    ::poll(nullptr, 0, 200);
  }
  ::kill(prometheus, SIGTERM);
  EXPECT_EQ(WaitChild(prometheus), 0);
  EXPECT_NE(answer.find("\"job\":\"membroker\""), std::string::npos) << answer;
  EXPECT_NE(answer.find(",\"3\"]"), std::string::npos) << answer;  // the three clients
}

}  // namespace
}  // namespace membroker::testing
