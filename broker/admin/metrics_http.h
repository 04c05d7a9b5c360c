// --metrics-listen: the `metrics` text (Prometheus exposition format) over
// HTTP at GET /metrics, for a Prometheus server to scrape. The HTTP parsing is
// libmicrohttpd's, run on the broker's loop (its epoll fd polled by libuv, no
// thread of its own), so the handler reads the components as the admin
// socket does. Built where libmicrohttpd is installed; elsewhere Listen says so.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

#include "membroker/status.h"

struct MHD_Daemon;

namespace membroker::broker {

class MetricsHttp {
 public:
  MetricsHttp(uv_loop_t* loop, std::function<std::string()> render) : loop_(loop), render_(std::move(render)) {}
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;
  ~MetricsHttp();

  // "PORT" (on 127.0.0.1) or "IPV4:PORT"; port 0 takes a free one.
  Status Listen(const std::string& address);
  // Stops serving (the broker is stopping); open connections are dropped.
  void Close();
  // "ip:port" it listens on, or "" when it does not.
  const std::string& address() const { return address_; }

  // Parses "PORT" or "IPV4:PORT" (for the option's check); false if malformed.
  static bool ParseAddress(const std::string& text, std::string* ip, uint16_t* port);

 private:
  static void OnReadable(uv_poll_t* h, int status, int events);
  static void OnTimer(uv_timer_t* t);
  void Run();  // MHD_run, then the timer set to what it asks for

  uv_loop_t* loop_;
  std::function<std::string()> render_;
  MHD_Daemon* daemon_ = nullptr;
  uv_poll_t poll_{};
  uv_timer_t timer_{};
  bool handles_open_ = false;
  std::string address_;

  friend struct MetricsHttpAccess;
};

}  // namespace membroker::broker
