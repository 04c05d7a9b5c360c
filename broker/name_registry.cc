// NameRegistry (name_registry.h).
#include "name_registry.h"

namespace membroker::broker {

namespace {
bool HasPrefix(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

const NamedEntry* NameRegistry::Find(const std::string& name) const {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : &it->second;
}

NamedEntry* NameRegistry::Find(const std::string& name) {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : &it->second;
}

Result<NamedEntry*> NameRegistry::Add(const std::string& name, NamedEntry e) {
  auto [it, added] = names_.emplace(name, std::move(e));
  if (!added) return Status(ErrorCode::kAlreadyExists, "\"" + name + "\" is already published");
  return &it->second;
}

uint64_t NameRegistry::Remove(const std::string& name) {
  auto it = names_.find(name);
  if (it == names_.end()) return 0;
  const uint64_t allocation = it->second.allocation;
  names_.erase(it);
  return allocation;
}

std::vector<HostName> NameRegistry::ForCluster(const std::function<uint64_t(uint64_t)>& size_of) const {
  std::vector<HostName> out;
  for (const auto& [name, e] : names_)
    if (e.cluster) out.push_back({name, size_of(e.allocation), e.read_only, e.metadata, e.allocation});
  return out;
}

size_t NameRegistry::CountForCluster() const {
  size_t n = 0;
  for (const auto& [name, e] : names_) n += e.cluster ? 1 : 0;
  return n;
}

std::vector<std::string> NameRegistry::NamesWhere(const std::function<bool(const NamedEntry&)>& pick) const {
  std::vector<std::string> out;
  for (const auto& [name, e] : names_)
    if (pick(e)) out.push_back(name);
  return out;
}

std::vector<std::pair<std::string, const NamedEntry*>> NameRegistry::List(const std::string& prefix,
                                                                          const std::string& after, size_t limit,
                                                                          bool* truncated) const {
  std::vector<std::pair<std::string, const NamedEntry*>> out;
  *truncated = false;
  auto it = after.empty() || after < prefix ? names_.lower_bound(prefix) : names_.upper_bound(after);
  for (; it != names_.end() && HasPrefix(it->first, prefix); ++it) {
    if (out.size() == limit) {
      *truncated = true;
      break;
    }
    out.emplace_back(it->first, &it->second);
  }
  return out;
}

Status NameRegistry::Subscribe(uint64_t session_id, const std::string& prefix, bool cluster) {
  Subscriber& sub = subscribers_[session_id];
  if (sub.prefixes.size() >= kMaxSubscriptionsPerClient)
    return Status(ErrorCode::kResourceExhausted, "a client subscribes to at most 64 prefixes");
  sub.prefixes.push_back({prefix, cluster});
  return Status::Ok();
}

bool NameRegistry::HasEvents(uint64_t session_id) const {
  auto it = subscribers_.find(session_id);
  return it != subscribers_.end() && !it->second.queue.empty();
}

std::vector<uint64_t> NameRegistry::Post(const ipc::NameEvent& event) {
  std::vector<uint64_t> got;
  for (auto& [sid, sub] : subscribers_) {
    bool wanted = false;
    for (const auto& p : sub.prefixes) wanted |= (p.cluster || event.host.empty()) && HasPrefix(event.name, p.prefix);
    if (!wanted) continue;
    if (sub.queue.size() >= kMaxQueuedEvents) {
      ++sub.dropped;
      continue;
    }
    sub.queue.push_back(event);
    got.push_back(sid);
  }
  return got;
}

ipc::EventsReply NameRegistry::TakeEvents(uint64_t session_id) {
  ipc::EventsReply r;
  auto it = subscribers_.find(session_id);
  if (it == subscribers_.end()) return r;
  Subscriber& sub = it->second;
  r.dropped = sub.dropped;
  while (!sub.queue.empty() && r.events.size() < ipc::kMaxEventsPerReply) {
    r.events.push_back(std::move(sub.queue.front()));
    sub.queue.pop_front();
  }
  return r;
}

std::vector<std::string> NameRegistry::OnSessionEnd(uint64_t session_id) {
  subscribers_.erase(session_id);
  std::vector<std::string> removed;
  for (auto& [name, e] : names_) {
    if (e.publisher_session != session_id) continue;
    if (e.persist)
      e.publisher_session = 0;  // outlives its publisher
    else
      removed.push_back(name);
  }
  return removed;
}

Status NameRegistry::Check(const std::function<bool(uint64_t)>& session_alive) const {
  for (const auto& [sid, sub] : subscribers_)
    if (!session_alive(sid))
      return Status(ErrorCode::kInternal, "tables disagree: client " + std::to_string(sid) +
                                              " left but is still subscribed to name events");
  for (const auto& [name, e] : names_)
    if (e.publisher_session != 0 && !session_alive(e.publisher_session))
      return Status(ErrorCode::kInternal,
                    "tables disagree: \"" + name + "\" names client " + std::to_string(e.publisher_session) +
                        " as its publisher, which left");
  return Status::Ok();
}

}  // namespace membroker::broker
