// Sessions: the connected clients - each Session by id, which of them have
// not said hello yet (oldest first), the bytes of replies queued for slow
// readers together, and how many sessions ended for each reason. A Session is
// deleted in libuv's close callback, after its end (session_end.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <unordered_map>

#include "server/session.h"

namespace membroker::broker {

class Sessions {
 public:
  using Map = std::unordered_map<uint64_t, Session*>;

  // Gives s its id and files it as waiting for its hello.
  void Add(Session* s);
  // The live session with this id; nullptr if it is unknown or closing.
  Session* Find(uint64_t id);
  const Session* Find(uint64_t id) const;
  void HelloDone(Session& s);
  // Takes s out at its end (the Session itself is deleted by its close callback).
  void Remove(Session& s);

  size_t size() const { return sessions_.size(); }
  bool empty() const { return sessions_.empty(); }
  const Map& all() const { return sessions_; }
  // Ids of every session, for loops that may close some.
  std::vector<uint64_t> Ids() const;

  size_t Handshaking() const { return handshaking_.size(); }
  size_t Handshaken() const { return sessions_.size() - handshaking_.size(); }
  // The session that has waited longest for its hello, or nullptr.
  Session* OldestHandshaking();

  // Replies queued on a slow reader's session: counted for all of them together.
  void Queued(Session& s, OutFrame out);
  void Dequeued(Session& s);  // the front frame was sent
  void DropQueue(Session& s);
  uint64_t queued_bytes() const { return queued_bytes_; }

  void CountEnd(CloseReason reason) { ++ends_[static_cast<size_t>(reason)]; }
  uint64_t Ends(CloseReason reason) const { return ends_[static_cast<size_t>(reason)]; }

  // The handshake set is exactly the sessions without a hello; queued bytes add up.
  Status Check() const;

 private:
  Map sessions_;
  std::set<uint64_t> handshaking_;  // ids grow with every accept: the first waited longest
  uint64_t next_id_ = 1;
  uint64_t queued_bytes_ = 0;
  uint64_t ends_[kCloseReasonCount] = {};
};

}  // namespace membroker::broker
