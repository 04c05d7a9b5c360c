// The admin socket (admin_socket.h).
#include "admin/admin_socket.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>

#include "server/socket_path.h"

namespace membroker::broker {

namespace {
constexpr size_t kMaxAdminCommandBytes = 4096;
}  // namespace

struct AdminSocket::Connection {
  uv_pipe_t pipe{};
  uv_write_t write{};
  AdminSocket* owner = nullptr;
  std::string in;
  std::string out;

  static void Close(Connection* c) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->pipe), [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
  }
};

Status AdminSocket::Listen(const std::string& path) {
  MB_RETURN_IF_ERROR(PrepareSocketPath(path));
  uv_pipe_init(loop_, &pipe_, 0);
  pipe_.data = this;
  listening_ = true;
  mode_t old = ::umask(0177);  // 0600: the broker's own uid only
  int rc = uv_pipe_bind(&pipe_, path.c_str());
  ::umask(old);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&pipe_), 16, &AdminSocket::OnConnection);
  if (rc != 0) return Status(ErrorCode::kInternal, "admin socket " + path + ": " + uv_strerror(rc));
  return Status::Ok();
}

void AdminSocket::OnConnection(uv_stream_t* server, int status) {
  if (status < 0) return;
  auto* c = new Connection();
  c->owner = static_cast<AdminSocket*>(server->data);
  uv_pipe_init(server->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->pipe)) != 0) {
    Connection::Close(c);
    return;
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->pipe),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = suggested;
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Connection*>(stream->data);
        std::unique_ptr<char[]> owned(buf->base);
        if (n < 0) {
          Connection::Close(c);
          return;
        }
        c->in.append(buf->base, static_cast<size_t>(n));
        size_t nl = c->in.find('\n');
        if (nl == std::string::npos && c->in.size() < kMaxAdminCommandBytes) return;
        uv_read_stop(stream);
        c->out = c->owner->answer_(c->in.substr(0, std::min(nl, kMaxAdminCommandBytes)));
        uv_buf_t reply = uv_buf_init(c->out.data(), static_cast<unsigned>(c->out.size()));
        c->write.data = c;
        uv_write(&c->write, stream, &reply, 1,
                 [](uv_write_t* w, int) { Connection::Close(static_cast<Connection*>(w->data)); });
      });
}

void AdminSocket::Close() {
  if (!listening_) return;
  listening_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), nullptr);
  // Its connections: every other pipe on the loop is one.
  uv_walk(
      loop_,
      [](uv_handle_t* h, void* listener) {
        if (h->type == UV_NAMED_PIPE && h != listener && !uv_is_closing(h))
          Connection::Close(static_cast<Connection*>(h->data));
      },
      &pipe_);
}

}  // namespace membroker::broker
