// The admin socket: a SOCK_STREAM Unix socket (mode 0600: the broker's own
// uid only) taking one command line per connection and answering with what
// the broker's AdminCommand says (text, or JSON with --json).
#pragma once

#include <uv.h>

#include <functional>
#include <string>

#include "membroker/status.h"

namespace membroker::broker {

class AdminSocket {
 public:
  AdminSocket(uv_loop_t* loop, std::function<std::string(const std::string&)> answer)
      : loop_(loop), answer_(std::move(answer)) {}
  AdminSocket(const AdminSocket&) = delete;
  AdminSocket& operator=(const AdminSocket&) = delete;

  Status Listen(const std::string& path);
  // Closes the listener and every connection (the broker is stopping).
  void Close();

 private:
  struct Connection;
  static void OnConnection(uv_stream_t* server, int status);

  uv_loop_t* loop_;
  std::function<std::string(const std::string&)> answer_;
  uv_pipe_t pipe_{};
  bool listening_ = false;
};

}  // namespace membroker::broker
