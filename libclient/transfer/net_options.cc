// The engine's network options (net_transport.h), checked before anything
// starts: the addresses parsed, the secret read from a file only its owner can read.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/private_file.h"
#include "membroker/ipc/unique_fd.h"
#include "transfer/net_transport.h"

namespace membroker::detail {

Result<NetOptions> ParseNetOptions(const std::string& engine_name, const std::array<uint8_t, 16>& identity,
                                   const std::map<std::string, std::string>& options) {
  auto get = [&](const char* key) {
    auto it = options.find(key);
    return it == options.end() ? std::string() : it->second;
  };
  const std::string listen = get("listen_address"), secret_file = get("secret_file"), allow = get("allow_from");
  if (listen.empty() && secret_file.empty() && allow.empty()) return NetOptions{};
  NetOptions o;
  o.engine_name = engine_name;
  o.identity = identity;
  if (!listen.empty()) {
    MB_RETURN_IF_ERROR(ParseHostPort(listen, /*allow_any_port=*/true).status());
    if (secret_file.empty() && allow.empty())
      return Status(ErrorCode::kParamInvalid,
                    "listen_address needs secret_file or allow_from: an engine that "
                    "listens admits nobody by default");
    o.listen = listen;
  }
  if (!allow.empty()) {
    MB_ASSIGN_OR_RETURN(o.allow_from, ParseAllowList(allow));
  }
  if (!secret_file.empty()) {
    ipc::UniqueFd fd(::open(secret_file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid())
      return Status(ErrorCode::kParamInvalid,
                    "secret_file \"" + ipc::EscapeText(secret_file) + "\": " + std::strerror(errno));
    if (std::string problem = ipc::PrivateFileProblem(fd.get()); !problem.empty())
      return Status(ErrorCode::kPermissionDenied, "secret_file \"" + ipc::EscapeText(secret_file) + "\" " + problem);
    char buf[kMaxNetSecretBytes + 2];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) return Status(ErrorCode::kParamInvalid, "secret_file: " + std::string(std::strerror(errno)));
    std::string secret(buf, static_cast<size_t>(n));
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty() || secret.size() > kMaxNetSecretBytes)
      return Status(ErrorCode::kParamInvalid, "secret_file must hold 1 to 4096 bytes of secret");
    o.secret = std::move(secret);
  }
  return o;
}

}  // namespace membroker::detail
