// StateFile: what a broker leaves for the next broker on the same socket,
// in a small state file (--state-file; default: the socket path + ".state",
// mode 0600, never removed by the broker):
//  - a 128-bit key. Every memfd the broker creates is named
//    "<what>:<nonce>.<tag>", tag = SipHash-2-4(key, nonce), so after a crash a
//    new broker can tell memory a broker handed out (reattach) from memory a
//    client made itself. Only the broker's uid can read the key; a process of
//    that uid could read the broker's memory anyway.
//  - how far allocation ids have gone: ids are reserved in blocks of 2^20 and
//    the file records the end of the block in use, so a new broker starts
//    above every id a predecessor could have given, and reattaching clients
//    keep their ids.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"
#include "restart/siphash.h"

namespace membroker::broker {

class StateFile {
 public:
  static constexpr uint64_t kIdBlock = 1u << 20;

  // Reads the state file at path, or creates it. Refuses one that is not a
  // regular file owned by this uid with mode 0600 (or stricter).
  static Result<std::unique_ptr<StateFile>> Open(const std::string& path);
  // A throwaway identity with a random key and no file (unit tests, fuzzing).
  static std::unique_ptr<StateFile> Ephemeral();

  // The first id this broker hands out; every smaller id may have been given
  // out by a predecessor.
  uint64_t first_id() const { return first_id_; }
  // Ids up to limit() may be handed out. Reserve moves it past next (a write
  // to the state file); without a file it only moves.
  uint64_t limit() const { return limit_; }
  Status Reserve(uint64_t next);

  // A tagged memfd name for new memory: "<what>:<nonce>.<tag>" (thread-safe).
  std::string NameFor(std::string_view what);
  // Whether a memfd name ends in a tag made with this key.
  bool Tagged(std::string_view memfd_name) const;

  const std::string& path() const { return path_; }

 private:
  StateFile() = default;
  Status WriteLimit();

  std::string path_;
  ipc::UniqueFd fd_;
  SipKey key_{};
  uint64_t first_id_ = 1;
  uint64_t limit_ = 0;
  std::atomic<uint64_t> next_nonce_{0};
};

}  // namespace membroker::broker
