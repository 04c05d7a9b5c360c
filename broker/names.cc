// Named objects and their events: Publish, Lookup (waiting in the broker for
// a name that is not there yet), Unpublish, ListNames, Subscribe, WaitEvents.
#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/memfd.h"

namespace membroker::broker {

namespace {
Status CheckName(const std::string& name) {
  return ipc::CheckName(name, ipc::kMaxObjectNameBytes, "a name");
}
bool HasPrefix(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}
}  // namespace

Answer Broker::Handle(Session& s, uint64_t, const ipc::PublishRequest& m) {
  MB_RETURN_IF_ERROR(CheckName(m.name));
  if (m.flags & ~ipc::kPublishKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown publish flags " + std::to_string(m.flags));
  const Allocation* a = table_.Find(m.allocation);
  if (!s.ledger.Holds(m.allocation) || a == nullptr)
    return Status(ErrorCode::kInvalidHandle,
                  "allocation " + std::to_string(m.allocation) + " is not held by this client");
  if (auto it = names_.find(m.name); it != names_.end() && s.reattaching && it->second.publisher_session == 0 &&
                                     it->second.allocation == m.allocation && it->second.uid == s.cred.uid) {
    // Its publisher, reattaching after a take-over (or a persistent object's
    // publisher back): the name is its own again, as it was.
    it->second.publisher_session = s.id;
    it->second.publisher_pid = s.cred.pid;
    it->second.awaiting_publisher = false;
    return Status::Ok();
  }
  if (auto it = names_.find(m.name);
      it != names_.end() && !(it->second.publisher_session != 0 && !it->second.persist &&
                              ReapIfExited(it->second.publisher_session)))
    return Status(ErrorCode::kAlreadyExists, "\"" + m.name + "\" is already published");
  const bool read_only = (m.flags & ipc::kPublishReadOnly) || s.ledger.ReadOnly(m.allocation);
  NamedEntry e;
  if (read_only) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, backend_.ReadOnlyFd(a->memory));
  }
  e.name = m.name;
  e.allocation = m.allocation;
  e.publisher_session = s.id;
  e.publisher_pid = s.cred.pid;
  e.uid = s.cred.uid;
  e.read_only = read_only;
  e.persist = m.flags & ipc::kPublishPersist;
  e.metadata = m.metadata;
  table_.AddHolder(m.allocation);  // the publication's own reference
  NamedEntry& entry = names_.emplace(m.name, std::move(e)).first->second;
  StateChanged();
  MB_DEBUG("publish", "client=%llu name=\"%s\" allocation=%llu persist=%d",
          static_cast<unsigned long long>(s.id), LogText(m.name).c_str(),
          static_cast<unsigned long long>(m.allocation), entry.persist ? 1 : 0);
  PostEvent(ipc::NameEventKind::kPublished, m.name, m.allocation, s.cred.pid);
  AnswerWaiters(Waiter::Kind::kLookup, m.name,
                [&](Session& waiting, uint64_t rid) { return GrantNamed(waiting, rid, entry); });
  return Status::Ok();
}

Status Broker::GrantNamed(Session& s, uint64_t rid, const NamedEntry& e) {
  if (e.uid != s.cred.uid)
    return Status(ErrorCode::kPermissionDenied,
                  "\"" + e.name + "\" was published by another user (uid " + std::to_string(e.uid) + ")");
  const Allocation* a = table_.Find(e.allocation);
  if (a == nullptr) return Status(ErrorCode::kNotFound, "\"" + e.name + "\" is gone");
  return GrantImport(s, rid, *a, e.read_only ? e.read_only_fd.get() : a->memory.fd.get(), e.read_only, s.ledger,
                     e.metadata);
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::LookupRequest& m) {
  MB_RETURN_IF_ERROR(CheckName(m.name));
  if (auto it = names_.find(m.name); it != names_.end())
    return SentOnSuccess(GrantNamed(s, rid, it->second));
  if (m.timeout_ms == 0) return Status(ErrorCode::kNotFound, "nothing is published as \"" + m.name + "\"");
  return SentOnSuccess(AddWaiter(s, rid, Waiter::Kind::kLookup, m.name, m.timeout_ms));
}

void Broker::Unpublish(std::map<std::string, NamedEntry>::iterator it, int32_t pid) {
  const std::string name = it->first;
  const uint64_t allocation = it->second.allocation;
  names_.erase(it);
  StateChanged();
  DropReference(allocation);
  PostEvent(ipc::NameEventKind::kUnpublished, name, allocation, pid);
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::UnpublishRequest& m) {
  auto it = names_.find(m.name);
  if (it == names_.end()) return Status(ErrorCode::kNotFound, "nothing is published as \"" + m.name + "\"");
  if (it->second.uid != s.cred.uid)
    return Status(ErrorCode::kPermissionDenied, "\"" + m.name + "\" belongs to another user");
  Unpublish(it, s.cred.pid);
  return Status::Ok();
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::ListNamesRequest& m) {
  ipc::ListNamesReply r;
  for (auto it = names_.lower_bound(m.prefix); it != names_.end() && HasPrefix(it->first, m.prefix); ++it) {
    if (r.objects.size() == ipc::kMaxNamesPerReply) {
      r.truncated = true;
      break;
    }
    const Allocation* a = table_.Find(it->second.allocation);
    r.objects.push_back({it->first, it->second.allocation, a ? a->size : 0, it->second.read_only,
                         it->second.persist, it->second.publisher_pid});
  }
  return r;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::SubscribeRequest& m) {
  if (s.events.subscriptions.size() >= kMaxSubscriptionsPerClient)
    return Status(ErrorCode::kResourceExhausted, "a client subscribes to at most 64 prefixes");
  s.events.subscriptions.push_back(m.prefix);  // "" subscribes to every name
  return Status::Ok();
}

void Broker::PostEvent(ipc::NameEventKind kind, const std::string& name, uint64_t allocation, int32_t pid) {
  // Targets first: replying can close a session (slow reader), which would
  // change sessions_ under the loop. Closed sessions stay allocated until
  // their uv_close callback, so the pointers stay valid here.
  std::vector<Session*> targets;
  for (auto& [id, s] : sessions_) {
    bool wanted = false;
    for (const auto& p : s->events.subscriptions) wanted |= HasPrefix(name, p);
    if (wanted) targets.push_back(s);
  }
  for (Session* s : targets) {
    if (s->closing) continue;
    if (s->events.queue.size() >= kMaxQueuedEvents) {
      ++s->events.dropped;
      continue;
    }
    s->events.queue.push_back(ipc::NameEvent{kind, name, allocation, pid});
    std::vector<Waiter*> ready;
    for (Waiter* w : waiters_)
      if (w->kind == Waiter::Kind::kEvents && w->session_id == s->id) ready.push_back(w);
    for (Waiter* w : ready) {
      SendEvents(*s, w->request_id);
      CloseWaiter(w);
    }
  }
}

void Broker::SendEvents(Session& s, uint64_t rid) {
  ipc::EventsReply r;
  r.dropped = s.events.dropped;
  while (!s.events.queue.empty() && r.events.size() < ipc::kMaxEventsPerReply) {
    r.events.push_back(std::move(s.events.queue.front()));
    s.events.queue.pop_front();
  }
  Send(s, rid, std::move(r));
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::WaitEventsRequest& m) {
  if (s.events.subscriptions.empty())
    return Status(ErrorCode::kParamInvalid, "this client has no subscriptions (Subscribe first)");
  if (!s.events.queue.empty() || m.timeout_ms == 0) {
    SendEvents(s, rid);
    return Deferred{};
  }
  return SentOnSuccess(AddWaiter(s, rid, Waiter::Kind::kEvents, "", m.timeout_ms));
}

void Broker::EndNamesSession(Session& s, bool crashed) {
  if (crashed)
    for (const auto& [name, e] : names_)
      if (s.ledger.Holds(e.allocation) || e.publisher_session == s.id)
        PostEvent(ipc::NameEventKind::kHolderDied, name, e.allocation, s.cred.pid);
  for (auto it = names_.begin(); it != names_.end();) {
    auto next = std::next(it);
    if (it->second.publisher_session == s.id) {
      if (it->second.persist)
        it->second.publisher_session = 0;  // outlives its publisher
      else
        Unpublish(it, s.cred.pid);
    }
    it = next;
  }
  s.events.subscriptions.clear();
  s.events.queue.clear();
}

}  // namespace membroker::broker
