// Named-object requests over the NameRegistry: Publish, Lookup (waiting in the
// broker for a name that is not there yet), Unpublish, ListNames, Subscribe,
// WaitEvents; and the events they post.
#include "broker.h"
#include "log.h"
#include "membroker/ipc/escape.h"
#include "memory/memfd.h"

namespace membroker::broker {

namespace {
Status CheckName(const std::string& name) { return ipc::CheckName(name, ipc::kMaxObjectNameBytes, "a name"); }
}  // namespace

std::vector<HostName> Broker::ListedForCluster() const {
  return names_.ForCluster([this](uint64_t allocation) {
    const Allocation* a = holdings_.Find(allocation);
    return a != nullptr ? a->size : 0;
  });
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::PublishRequest& m) {
  MB_RETURN_IF_ERROR(CheckName(m.name));
  if (m.flags & ~ipc::kPublishKnownFlags)
    return Status(ErrorCode::kParamInvalid, "unknown publish flags " + std::to_string(m.flags));
  const bool cluster = m.flags & ipc::kPublishCluster;
  if (cluster && !cluster_.started())
    return Status(ErrorCode::kUnsupported, "this broker is not in a cluster (membrokerd --cluster)");
  const Allocation* a = holdings_.Find(m.allocation);
  if (!s.ledger.Holds(m.allocation) || a == nullptr)
    return Status(ErrorCode::kInvalidHandle,
                  "allocation " + std::to_string(m.allocation) + " is not held by this client");
  if (NamedEntry* e = names_.Find(m.name); e != nullptr && s.reattaching && e->publisher_session == 0 &&
                                           e->allocation == m.allocation && e->uid == s.cred.uid) {
    // Its publisher, reattaching after a take-over (or a persistent object's
    // publisher back): the name is its own again, as it was.
    e->publisher_session = s.id;
    e->publisher_pid = s.cred.pid;
    e->awaiting_publisher = false;
    return Status::Ok();
  }
  const NamedEntry* taken = names_.Find(m.name);
  if (cluster && !(taken != nullptr && taken->cluster) && names_.CountForCluster() >= kHostNamesMax)
    return Status(ErrorCode::kResourceExhausted, "this host already lists " + std::to_string(kHostNamesMax) +
                                                     " names for the cluster (docs/CLUSTER.md)");
  // A name taken: replaced where asked and the user is its own (the old
  // allocation's readers keep their pages), else ALREADY_EXISTS unless its
  // publisher has exited.
  uint64_t replaced = 0;
  if (const NamedEntry* e = names_.Find(m.name)) {
    const uint64_t publisher = e->publisher_session;
    if (m.flags & ipc::kPublishReplace) {
      if (e->uid != s.cred.uid)
        return Status(ErrorCode::kPermissionDenied, "\"" + m.name + "\" belongs to another user");
      replaced = e->allocation;
    } else if (!(publisher != 0 && !e->persist && ReapIfExited(publisher))) {
      return Status(ErrorCode::kAlreadyExists, "\"" + m.name + "\" is already published");
    }
  }
  const bool read_only = (m.flags & ipc::kPublishReadOnly) || s.ledger.ReadOnly(m.allocation);
  NamedEntry e;
  if (read_only) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, BackendOf(a->memory, holdings_.backend()).ReadOnlyFd(a->memory));
  }
  e.allocation = m.allocation;
  e.publisher_session = s.id;
  e.publisher_pid = s.cred.pid;
  e.uid = s.cred.uid;
  e.read_only = read_only;
  e.persist = m.flags & ipc::kPublishPersist;
  e.cluster = cluster;
  e.metadata = m.metadata;
  holdings_.AddReference(m.allocation);  // the publication's own (before the one it replaces goes)
  if (replaced != 0) holdings_.DropReference(names_.Remove(m.name));
  auto added = names_.Add(m.name, std::move(e));
  if (!added.ok()) {
    holdings_.DropReference(m.allocation);
    return added.status();
  }
  NamedEntry* entry = *added;
  fd_store_.StateChanged();
  if (cluster || replaced != 0) cluster_.SetNames(ListedForCluster());
  MB_DEBUG("publish", "client=%llu name=\"%s\" allocation=%llu persist=%d replaced=%llu",
           static_cast<unsigned long long>(s.id), LogText(m.name).c_str(), static_cast<unsigned long long>(m.allocation),
           entry->persist ? 1 : 0, static_cast<unsigned long long>(replaced));
  PostEvent(ipc::NameEventKind::kPublished, m.name, m.allocation, s.cred.pid);
  AnswerWaiters(Waiter::Kind::kLookup, m.name,
                [&](Session& waiting, uint64_t rid) { return GrantNamed(waiting, rid, m.name, *entry); });
  if (cluster) {
    const Allocation* published = holdings_.Find(m.allocation);
    const ipc::ClusterLookupReply here =
        cluster_.Here({m.name, published ? published->size : 0, entry->read_only, entry->metadata, entry->allocation})
            .Reply();
    AnswerWaiters(Waiter::Kind::kClusterLookup, m.name, [&](Session& waiting, uint64_t rid) {
      Send(waiting, rid, here);
      return Status::Ok();
    });
  }
  return Status::Ok();
}

Status Broker::GrantNamed(Session& s, uint64_t rid, const std::string& name, const NamedEntry& e) {
  if (e.uid != s.cred.uid)
    return Status(ErrorCode::kPermissionDenied,
                  "\"" + name + "\" was published by another user (uid " + std::to_string(e.uid) + ")");
  const Allocation* a = holdings_.Find(e.allocation);
  if (a == nullptr) return Status(ErrorCode::kNotFound, "\"" + name + "\" is gone");
  return Grant(s, rid, *a, e.read_only ? e.read_only_fd.get() : a->memory.fd.get(), e.read_only, Holding::kLedger,
               e.metadata);
}

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::LookupRequest& m) {
  MB_RETURN_IF_ERROR(CheckName(m.name));
  if (const NamedEntry* e = names_.Find(m.name)) return SentOnSuccess(GrantNamed(s, rid, m.name, *e));
  if (m.timeout_ms == 0) return Status(ErrorCode::kNotFound, "nothing is published as \"" + m.name + "\"");
  return SentOnSuccess(waiters_.Add({Waiter::Kind::kLookup, s.id, rid, m.name}, m.timeout_ms));
}

void Broker::Unpublish(const std::string& name, int32_t pid) {
  const NamedEntry* e = names_.Find(name);
  const bool cluster = e != nullptr && e->cluster;
  const uint64_t allocation = names_.Remove(name);
  fd_store_.StateChanged();
  if (cluster) cluster_.SetNames(ListedForCluster());
  holdings_.DropReference(allocation);
  PostEvent(ipc::NameEventKind::kUnpublished, name, allocation, pid);
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::UnpublishRequest& m) {
  const NamedEntry* e = names_.Find(m.name);
  if (e == nullptr) return Status(ErrorCode::kNotFound, "nothing is published as \"" + m.name + "\"");
  if (e->uid != s.cred.uid) return Status(ErrorCode::kPermissionDenied, "\"" + m.name + "\" belongs to another user");
  Unpublish(m.name, s.cred.pid);
  return Status::Ok();
}

// Where a name published for the cluster lives: here (answered from this
// broker's own table, not etcd's echo of it), or on another host by its
// record; else it waits for either.
Answer Broker::Handle(Session& s, uint64_t rid, const ipc::ClusterLookupRequest& m) {
  MB_RETURN_IF_ERROR(CheckName(m.name));
  if (!cluster_.started()) return Status(ErrorCode::kUnsupported, "this broker is not in a cluster (membrokerd --cluster)");
  if (const NamedEntry* e = names_.Find(m.name); e != nullptr && e->cluster) {
    const Allocation* a = holdings_.Find(e->allocation);
    return cluster_.Here({m.name, a ? a->size : 0, e->read_only, e->metadata, e->allocation}).Reply();
  }
  if (std::optional<NameLocation> at = cluster_.FindName(m.name))
    return at->Reply();
  if (m.timeout_ms == 0) {
    const ClusterView v = cluster_.View();
    if (!v.watching)
      return Status(ErrorCode::kNotConnected,
                    "\"" + m.name + "\" is not published here, and etcd is out of reach: " + v.error);
    return Status(ErrorCode::kNotFound, "nothing is published as \"" + m.name + "\" on any host of the cluster");
  }
  return SentOnSuccess(waiters_.Add({Waiter::Kind::kClusterLookup, s.id, rid, m.name}, m.timeout_ms));
}

Answer Broker::Handle(Session&, uint64_t, const ipc::ListNamesRequest& m) {
  ipc::ListNamesReply r;
  for (const auto& [name, e] : names_.List(m.prefix, m.after, ipc::kMaxNamesPerReply, &r.truncated)) {
    const Allocation* a = holdings_.Find(e->allocation);
    r.objects.push_back({name, e->allocation, a ? a->size : 0, e->read_only, e->persist, e->publisher_pid});
  }
  return r;
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::SubscribeRequest& m) {
  if (m.cluster && !cluster_.started())
    return Status(ErrorCode::kUnsupported, "this broker is not in a cluster (membrokerd --cluster)");
  return names_.Subscribe(s.id, m.prefix, m.cluster);  // "" subscribes to every name
}

void Broker::PostEvent(ipc::NameEventKind kind, const std::string& name, uint64_t allocation, int32_t pid,
                       const std::string& host) {
  // Every subscriber that got it and waits for events is answered now.
  for (uint64_t id : names_.Post(ipc::NameEvent{kind, name, allocation, pid, host})) {
    Session* s = sessions_.Find(id);
    if (s == nullptr) continue;
    const std::vector<Waiter> waiting = waiters_.TakeEvents(id);
    for (const Waiter& w : waiting) SendEvents(*s, w.request_id);
    if (waiting.empty()) Wake(*s);  // its event loop takes them
  }
}

void Broker::SendEvents(Session& s, uint64_t rid) { Send(s, rid, names_.TakeEvents(s.id)); }

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::WaitEventsRequest& m) {
  if (!names_.Subscribed(s.id))
    return Status(ErrorCode::kParamInvalid, "this client has no subscriptions (Subscribe first)");
  if (names_.HasEvents(s.id) || m.timeout_ms == 0) {
    SendEvents(s, rid);
    return Deferred{};
  }
  return SentOnSuccess(waiters_.Add({Waiter::Kind::kEvents, s.id, rid, ""}, m.timeout_ms));
}

}  // namespace membroker::broker
