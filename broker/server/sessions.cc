// Sessions (sessions.h).
#include "server/sessions.h"

namespace membroker::broker {

void Sessions::Add(Session* s) {
  s->id = next_id_++;
  sessions_[s->id] = s;
  handshaking_.insert(s->id);
}

Session* Sessions::Find(uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() || it->second->closing ? nullptr : it->second;
}

const Session* Sessions::Find(uint64_t id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() || it->second->closing ? nullptr : it->second;
}

void Sessions::HelloDone(Session& s) {
  s.hello_done = true;
  handshaking_.erase(s.id);
}

void Sessions::Remove(Session& s) {
  DropQueue(s);
  sessions_.erase(s.id);
  handshaking_.erase(s.id);
}

std::vector<uint64_t> Sessions::Ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

Session* Sessions::OldestHandshaking() {
  return handshaking_.empty() ? nullptr : sessions_.at(*handshaking_.begin());
}

void Sessions::Queued(Session& s, OutFrame out) {
  s.outbound_bytes += out.bytes.size();
  queued_bytes_ += out.bytes.size();
  s.outbound.push_back(std::move(out));
}

void Sessions::Dequeued(Session& s) {
  const uint64_t n = s.outbound.front().bytes.size();
  s.outbound_bytes -= n;
  queued_bytes_ -= n;
  s.outbound.pop_front();
}

void Sessions::DropQueue(Session& s) {
  queued_bytes_ -= s.outbound_bytes;
  s.outbound_bytes = 0;
  s.outbound.clear();
}

Status Sessions::Check() const {
  auto broken = [](const std::string& what) { return Status(ErrorCode::kInternal, "tables disagree: " + what); };
  uint64_t queued = 0;
  for (const auto& [sid, s] : sessions_) {
    if (s->hello_done == (handshaking_.count(sid) == 1))
      return broken("client " + std::to_string(sid) + " is misfiled as " + (s->hello_done ? "waiting for" : "past") +
                    " its hello");
    queued += s->outbound_bytes;
  }
  if (handshaking_.size() > sessions_.size()) return broken("the handshake set names closed sessions");
  if (queued != queued_bytes_)
    return broken(std::to_string(queued_bytes_) + " bytes counted as queued, the sessions queue " +
                  std::to_string(queued));
  return Status::Ok();
}

}  // namespace membroker::broker
