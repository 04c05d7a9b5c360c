#include "membroker/ipc/admin_client.h"

#include <unistd.h>

#include "membroker/ipc/framing.h"
#include "membroker/ipc/syscall.h"

namespace membroker::ipc {

Result<std::string> AskAdmin(const std::string& admin_path, const std::string& command) {
  MB_ASSIGN_OR_RETURN(UniqueFd fd, ConnectUnix(admin_path, SOCK_STREAM));
  const std::string line = command + "\n";
  for (size_t sent = 0; sent < line.size();) {
    ssize_t n = 0;
    MB_RETURN_IF_ERROR(CheckedCall("write", admin_path, &n, [&] {
      return ::write(fd.get(), line.data() + sent, line.size() - sent);
    }));
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[65536];
  for (;;) {
    ssize_t n = 0;
    MB_RETURN_IF_ERROR(CheckedCall("read", admin_path, &n, [&] { return ::read(fd.get(), buf, sizeof(buf)); }));
    if (n == 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  if (reply.empty())
    return Status(ErrorCode::kProtocolError, "the broker closed the connection without a reply");
  return reply;
}

}  // namespace membroker::ipc
