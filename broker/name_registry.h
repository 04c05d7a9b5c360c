// NameRegistry: named objects (an allocation published under a name, found
// by Lookup) and the subscriptions to their events (published, unpublished,
// a holder died), with each subscriber's queue of events. A publication holds
// its own reference to the allocation (the broker adds and drops it), so a
// persistent one outlives its publisher and stays charged to its uid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cluster/host_record.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

inline constexpr size_t kMaxQueuedEvents = 1024;  // per subscriber
inline constexpr size_t kMaxSubscriptionsPerClient = 64;

struct NamedEntry {
  uint64_t allocation = 0;
  uint64_t publisher_session = 0;  // 0 once a persistent object's publisher left
  pid_t publisher_pid = 0;
  uid_t uid = 0;
  bool read_only = false;
  bool persist = false;
  bool cluster = false;  // listed in this host's cluster record (kPublishCluster)
  ipc::UniqueFd read_only_fd;  // what lookups of a read-only object get
  std::string metadata;        // the publisher's, given to every lookup
  // Handed over, not persistent: goes when the reattach grace ends unless its
  // publisher reattaches and publishes it again.
  bool awaiting_publisher = false;
};

class NameRegistry {
 public:
  using Names = std::map<std::string, NamedEntry>;

  const NamedEntry* Find(const std::string& name) const;
  NamedEntry* Find(const std::string& name);
  // ALREADY_EXISTS if the name is taken.
  Result<NamedEntry*> Add(const std::string& name, NamedEntry e);
  // Removes a name; returns its allocation (whose reference the caller drops).
  uint64_t Remove(const std::string& name);
  // Names whose entry matches, in order (to remove or report them).
  std::vector<std::string> NamesWhere(const std::function<bool(const NamedEntry&)>& pick) const;
  // At most `limit` names under prefix (after `after`, when given: the next
  // page); *truncated when more were there.
  std::vector<std::pair<std::string, const NamedEntry*>> List(const std::string& prefix, const std::string& after,
                                                              size_t limit, bool* truncated) const;
  const Names& all() const { return names_; }
  // The names published for the cluster, as this host's record lists them
  // (size_of gives an allocation's bytes), and how many.
  std::vector<HostName> ForCluster(const std::function<uint64_t(uint64_t)>& size_of) const;
  size_t CountForCluster() const;
  size_t size() const { return names_.size(); }
  bool empty() const { return names_.empty(); }

  // Events. A subscriber is a session with at least one prefix ("" is every
  // name); a cluster subscription also gets other hosts' events (those with a host).
  Status Subscribe(uint64_t session_id, const std::string& prefix, bool cluster = false);
  bool Subscribed(uint64_t session_id) const { return subscribers_.count(session_id) == 1; }
  bool HasEvents(uint64_t session_id) const;
  // Queues the event for every subscriber of a matching prefix (counted as
  // dropped where the queue is full); returns who got it.
  std::vector<uint64_t> Post(const ipc::NameEvent& event);
  // Up to ipc::kMaxEventsPerReply of the session's events, and its drop count.
  ipc::EventsReply TakeEvents(uint64_t session_id);
  // The session's publications go (persistent ones stay, without a
  // publisher): returns the names removed; its subscriptions and queue go.
  std::vector<std::string> OnSessionEnd(uint64_t session_id);

  // Every subscriber is a live session.
  Status Check(const std::function<bool(uint64_t)>& session_alive) const;

 private:
  struct Subscription {
    std::string prefix;
    bool cluster = false;
  };
  struct Subscriber {
    std::vector<Subscription> prefixes;
    std::deque<ipc::NameEvent> queue;
    uint64_t dropped = 0;
  };
  Names names_;
  std::map<uint64_t, Subscriber> subscribers_;  // by session id
};

}  // namespace membroker::broker
