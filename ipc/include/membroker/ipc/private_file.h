// Files that hold a secret (the broker's state file with its key, a transfer
// engine's shared secret): a regular file, owned by this process's uid, that
// nobody else can read or write. One check for every such file.
#pragma once

#include <string>

namespace membroker::ipc {

// What is wrong with the open file fd as a private file ("has mode 0644: ...
// (chmod 600)"), or "" when nothing is.
std::string PrivateFileProblem(int fd);

}  // namespace membroker::ipc
