// NameShare: the serving side of FetchNamed (membroker/name_share.h).
#include "membroker/name_share.h"

#include <set>
#include <span>

#include "transfer/share/name_card.h"

namespace membroker {

namespace {

// One name served: the object mapped read-only, its card, both registered.
// Ranges are declared before their mappings: destroyed after them.
struct Served {
  uint64_t allocation = 0;
  PhysicalHandle object;
  Reservation object_range;
  Mapping object_map;
  MemHandle object_reg = nullptr;
  PhysicalHandle card;
  Reservation card_range;
  Mapping card_map;
  MemHandle card_reg = nullptr;
};

Result<Mapping> MapAll(Client& c, const PhysicalHandle& h, Reservation& range) {
  MB_ASSIGN_OR_RETURN(range, c.ReserveMemAddress(h.size()));
  return c.MapMem(range.base(), h.size(), 0, h);
}

}  // namespace

class NameShare::Impl {
 public:
  explicit Impl(Client& client) : client_(client), engine_(client) {}
  ~Impl() {
    while (!served_.empty()) Drop(served_.begin()->first);
    engine_.Finalize();  // deregisters what is stuck, so its mappings can go
  }

  Status Start(const std::map<std::string, std::string>& options) {
    host_ = client_.cluster_host();
    if (host_.empty())
      return Status(ErrorCode::kUnsupported, "the broker is in no cluster (membrokerd --cluster): nothing to share");
    MB_RETURN_IF_ERROR(engine_.Initialize(EngineName(host_), options));
    MB_RETURN_IF_ERROR(client_.Subscribe(""));
    return Resync();
  }

  Status Serve(int timeout_ms) {
    MB_ASSIGN_OR_RETURN(NameEvents ev, client_.WaitEvents(timeout_ms));
    // Events lost to a full queue, or to a broker restart (the client
    // reattached, its subscription with it): read the whole table again.
    if (ev.dropped != dropped_ || client_.reattaches() != reattaches_) {
      dropped_ = ev.dropped;
      reattaches_ = client_.reattaches();
      return Resync();
    }
    for (const NameEvent& e : ev.events) {
      if (e.kind == NameEventKind::kPublished) MB_RETURN_IF_ERROR(Consider(e.name));
      if (e.kind == NameEventKind::kUnpublished) Drop(e.name);
    }
    return Status::Ok();
  }

  size_t served() const { return served_.size(); }
  const TransferEngine& engine() const { return engine_; }

 private:
  // Every name now: each considered, and those gone dropped.
  Status Resync() {
    MB_ASSIGN_OR_RETURN(std::vector<NamedObjectInfo> all, client_.ListNames(""));
    std::set<std::string> now;
    for (const NamedObjectInfo& n : all) {
      now.insert(n.name);
      MB_RETURN_IF_ERROR(Consider(n.name));
    }
    for (auto it = served_.begin(); it != served_.end();) {
      const std::string name = (it++)->first;
      if (now.count(name) == 0) Drop(name);
    }
    return Status::Ok();
  }

  // Serves name if it is this host's, published read-only for the cluster;
  // a name replaced by another allocation is served anew. Names that are not
  // (or no longer) such are not served; that is no error.
  Status Consider(const std::string& name) {
    Result<ClusterNameInfo> at = client_.LookupCluster(name, 0);
    if (!at.ok() || at->host != host_ || !at->read_only) {
      Drop(name);
      return at.ok() || at.status().code() == ErrorCode::kNotFound ? Status::Ok() : at.status();
    }
    Result<PhysicalHandle> h = client_.Lookup(name, 0);
    if (!h.ok()) {
      Drop(name);
      return h.status().code() == ErrorCode::kNotFound ? Status::Ok() : h.status();
    }
    if (auto it = served_.find(name); it != served_.end() && it->second->allocation == h->id())
      return client_.FreePhysical(*h);  // served already
    Drop(name);
    if (h->device() >= 0) return client_.FreePhysical(*h);  // device memory: not served (docs/CLUSTER.md)
    auto s = std::make_unique<Served>();
    s->allocation = h->id();
    s->object = std::move(*h);
    MB_ASSIGN_OR_RETURN(s->object_map, MapAll(client_, s->object, s->object_range));
    share::NameCard card{name, next_serial_++, reinterpret_cast<uintptr_t>(s->object_map.data()), s->object.size(),
                         share::Checksum(s->object_map.data(), s->object.size())};
    MB_ASSIGN_OR_RETURN(s->card, client_.MallocPhysical(share::kCardBytes));
    MB_ASSIGN_OR_RETURN(s->card_map, MapAll(client_, s->card, s->card_range));
    MB_RETURN_IF_ERROR(share::EncodeCard(card, {s->card_map.as<uint8_t>(), share::kCardBytes}));
    // The object first: a card a peer can see always points to registered bytes.
    MB_RETURN_IF_ERROR(engine_.RegisterMem({card.object_address, s->object.size()}, MEM_HOST, s->object_reg));
    Status st = engine_.RegisterMem({reinterpret_cast<uintptr_t>(s->card_map.data()), share::kCardBytes}, MEM_HOST,
                                    s->card_reg, share::CardRegionName(name, card.serial));
    if (!st.ok()) {
      (void)engine_.DeregisterMem(s->object_reg);
      return st;
    }
    served_[name] = std::move(s);
    return Status::Ok();
  }

  // The card goes first, then the object; DeregisterMem waits for peers'
  // transfers in flight. One that does not end in time keeps its memory
  // registered (and mapped) until the share ends.
  void Drop(const std::string& name) {
    auto it = served_.find(name);
    if (it == served_.end()) return;
    std::unique_ptr<Served> s = std::move(it->second);
    served_.erase(it);
    Status card = s->card_reg ? engine_.DeregisterMem(s->card_reg) : Status::Ok();
    Status object = s->object_reg ? engine_.DeregisterMem(s->object_reg) : Status::Ok();
    if (!card.ok() || !object.ok()) stuck_.push_back(std::move(s));
  }

  Client client_;
  TransferEngine engine_;
  std::string host_;
  uint64_t next_serial_ = 1;
  uint64_t dropped_ = 0;
  uint64_t reattaches_ = 0;
  std::map<std::string, std::unique_ptr<Served>> served_;
  std::vector<std::unique_ptr<Served>> stuck_;  // a peer's transfer outlived DeregisterMem's wait
};

std::string NameShare::EngineName(const std::string& host) { return "membroker-share@" + host; }

Result<std::unique_ptr<NameShare>> NameShare::Start(Client& client,
                                                    const std::map<std::string, std::string>& engine_options) {
  auto impl = std::make_unique<Impl>(client);
  MB_RETURN_IF_ERROR(impl->Start(engine_options));
  return std::unique_ptr<NameShare>(new NameShare(std::move(impl)));
}

NameShare::NameShare(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NameShare::~NameShare() = default;
Status NameShare::Serve(int timeout_ms) { return impl_->Serve(timeout_ms); }
size_t NameShare::served() const { return impl_->served(); }
const TransferEngine& NameShare::engine() const { return impl_->engine(); }

}  // namespace membroker
