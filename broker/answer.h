// What a request handler answers, in one value instead of a flag the
// dispatcher must guess: an error (ErrorReply), a reply to send now (Status::Ok()
// is OkReply, which NO_REPLY_ON_SUCCESS requests do without), or Deferred: the
// handler has sent its reply itself (one that carries fds) or something will
// later (a worker finishing, a waiter's event or timeout).
#pragma once

#include <type_traits>
#include <utility>

#include "membroker/ipc/protocol.h"
#include "membroker/status.h"

namespace membroker::broker {

struct Deferred {};
struct Answer {
  Answer(Status st) : status(std::move(st)) {}  // NOLINT: an error, or OkReply
  template <typename T, typename = std::enable_if_t<std::is_constructible_v<ipc::Message, T>>>
  Answer(T reply) : reply(std::move(reply)) {}  // NOLINT
  Answer(Deferred) : deferred(true) {}          // NOLINT
  Status status;
  ipc::Message reply = ipc::OkReply{};
  bool deferred = false;
};
// For handlers whose callee sends the reply itself on success.
inline Answer SentOnSuccess(Status st) { return st.ok() ? Answer(Deferred{}) : Answer(std::move(st)); }

}  // namespace membroker::broker
