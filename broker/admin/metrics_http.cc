#include "admin/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>

#include "log.h"

#ifdef MEMBROKER_HAVE_MICROHTTPD
#include <microhttpd.h>
#endif

namespace membroker::broker {

bool MetricsHttp::ParseAddress(const std::string& text, std::string* ip, uint16_t* port) {
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? "127.0.0.1" : text.substr(0, colon);
  const std::string digits = colon == std::string::npos ? text : text.substr(colon + 1);
  in_addr a{};
  if (digits.empty() || digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos ||
      ::inet_pton(AF_INET, host.c_str(), &a) != 1)
    return false;
  const unsigned long p = std::strtoul(digits.c_str(), nullptr, 10);
  if (p > 65535) return false;
  *ip = host;
  *port = static_cast<uint16_t>(p);
  return true;
}

#ifdef MEMBROKER_HAVE_MICROHTTPD

struct MetricsHttpAccess {
  static MHD_Result Answer(void* cls, MHD_Connection* c, const char* url, const char* method, const char*, const char*,
                           size_t*, void**) {
    auto* self = static_cast<MetricsHttp*>(cls);
    const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0,
               head = std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    unsigned int code = MHD_HTTP_OK;
    std::string body;
    const char* type = "text/plain; version=0.0.4; charset=utf-8";
    if (!get && !head) {
      code = MHD_HTTP_METHOD_NOT_ALLOWED;
      body = "only GET /metrics\n";
      type = "text/plain; charset=utf-8";
    } else if (std::strcmp(url, "/metrics") != 0) {
      code = MHD_HTTP_NOT_FOUND;
      body = "membrokerd serves /metrics only\n";
      type = "text/plain; charset=utf-8";
    } else {
      body = self->render_();
    }
    MHD_Response* r = MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    if (r == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
    (void)MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) (void)MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    const MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
  }
  static void Log(void*, const char* fmt, va_list ap) {
    char line[256];
    std::vsnprintf(line, sizeof(line), fmt, ap);
    std::string text(line);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    MB_DEBUG("metrics_http", "detail=\"%s\"", LogText(text).c_str());
  }
};

Status MetricsHttp::Listen(const std::string& address) {
  std::string ip;
  uint16_t port = 0;
  if (!ParseAddress(address, &ip, &port))
    return Status(ErrorCode::kParamInvalid, "--metrics-listen wants PORT or IPV4:PORT, not '" + address + "'");
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &sin.sin_addr);
  // Bounded: at most 32 connections, each closed after 10 s idle, 16 KiB for a
  // request's headers; HTTP parsing is libmicrohttpd's, not ours.
  daemon_ = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, nullptr, nullptr, &MetricsHttpAccess::Answer, this,
                             MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&sin), MHD_OPTION_CONNECTION_LIMIT, 32u,
                             MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                             static_cast<size_t>(16 * 1024), MHD_OPTION_EXTERNAL_LOGGER, &MetricsHttpAccess::Log,
                             nullptr, MHD_OPTION_END);
  if (daemon_ == nullptr)
    return Status(ErrorCode::kAddressInUse, "cannot serve metrics on " + ip + ":" + std::to_string(port) +
                                                " (the address is taken or not this host's)");
  const MHD_DaemonInfo* epoll = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_EPOLL_FD);
  const MHD_DaemonInfo* bound = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  if (epoll == nullptr || bound == nullptr) {
    MHD_stop_daemon(daemon_);
    daemon_ = nullptr;
    return Status(ErrorCode::kInternal, "libmicrohttpd gave no epoll fd or port");
  }
  if (int rc = uv_poll_init(loop_, &poll_, epoll->epoll_fd); rc != 0) {
    MHD_stop_daemon(daemon_);
    daemon_ = nullptr;
    return Status(ErrorCode::kInternal, std::string("uv_poll_init: ") + uv_strerror(rc));
  }
  uv_timer_init(loop_, &timer_);
  poll_.data = this;
  timer_.data = this;
  handles_open_ = true;
  uv_poll_start(&poll_, UV_READABLE, &MetricsHttp::OnReadable);
  address_ = ip + ":" + std::to_string(bound->port);
  if (ip != "127.0.0.1")
    MB_WARN("metrics_listening", "address=%s (not loopback: anyone who reaches it reads the metrics)",
            address_.c_str());
  else
    MB_INFO("metrics_listening", "address=%s", address_.c_str());
  return Status::Ok();
}

void MetricsHttp::OnReadable(uv_poll_t* h, int, int) { static_cast<MetricsHttp*>(h->data)->Run(); }
void MetricsHttp::OnTimer(uv_timer_t* t) { static_cast<MetricsHttp*>(t->data)->Run(); }

void MetricsHttp::Run() {
  if (daemon_ == nullptr) return;
  (void)MHD_run(daemon_);
  MHD_UNSIGNED_LONG_LONG ms = 0;
  if (MHD_get_timeout(daemon_, &ms) == MHD_YES)
    uv_timer_start(&timer_, &MetricsHttp::OnTimer, ms, 0);
  else
    uv_timer_stop(&timer_);
}

void MetricsHttp::Close() {
  if (!handles_open_) return;
  handles_open_ = false;
  address_.clear();
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  // The daemon (and its epoll fd) goes once libuv no longer watches that fd.
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), [](uv_handle_t* h) {
    auto* self = static_cast<MetricsHttp*>(h->data);
    MHD_stop_daemon(self->daemon_);
    self->daemon_ = nullptr;
  });
}

MetricsHttp::~MetricsHttp() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

#else

Status MetricsHttp::Listen(const std::string&) {
  return Status(ErrorCode::kUnsupported,
                "--metrics-listen needs a build with libmicrohttpd (Debian: libmicrohttpd-dev)");
}
void MetricsHttp::Close() {}
MetricsHttp::~MetricsHttp() = default;
void MetricsHttp::OnReadable(uv_poll_t*, int, int) {}
void MetricsHttp::OnTimer(uv_timer_t*) {}
void MetricsHttp::Run() {}

#endif

}  // namespace membroker::broker
