// NameShare: the serving side of FetchNamed (membroker/name_share.h).
#include "membroker/name_share.h"

#include <map>
#include <memory>
#include <set>
#include <span>
#include <utility>

#include "transfer/share/name_card.h"

namespace membroker {

namespace {

// Memory of this process registered with the engine: deregistered first
// (DeregisterMem waits for peers' transfers in flight), then unmapped, its
// range released and its handle freed. A deregistration that does not end in
// time leaves the range registered and mapped until the engine finalizes.
// The range is declared before its mapping: destroyed after it.
struct Registered {
  TransferEngine& engine;
  PhysicalHandle handle;
  Reservation range;
  Mapping map;
  MemHandle reg = nullptr;
  explicit Registered(TransferEngine& e) : engine(e) {}
  ~Registered() {
    if (reg != nullptr) (void)engine.DeregisterMem(reg);
  }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(map.data()); }
};

// An object served, under one name or several (names of one allocation):
// mapped read-only, its checksum taken once, registered.
struct ServedObject {
  explicit ServedObject(TransferEngine& e) : mem(e) {}
  uint64_t allocation = 0;
  uint64_t checksum = 0;
  Registered mem;
};

// A name served: its card (a page of the share's own memory, registered)
// and its object. Declared first, the object goes after the card.
struct ServedName {
  explicit ServedName(TransferEngine& e) : card(e) {}
  std::shared_ptr<ServedObject> object;
  Registered card;
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
    names_.clear();
    objects_.clear();
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
      if (e.kind == NameEventKind::kPublished) Consider(e.name);
      if (e.kind == NameEventKind::kUnpublished) Drop(e.name);
    }
    return Status::Ok();
  }

  size_t served() const { return names_.size(); }
  const TransferEngine& engine() const { return engine_; }
  std::vector<std::string> TakeProblems() { return std::exchange(problems_, {}); }

 private:
  // Every name now: each considered, and those gone dropped.
  Status Resync() {
    MB_ASSIGN_OR_RETURN(std::vector<NamedObjectInfo> all, client_.ListNames(""));
    std::set<std::string> now;
    for (const NamedObjectInfo& n : all) {
      now.insert(n.name);
      Consider(n.name);
    }
    for (auto it = names_.begin(); it != names_.end();) {
      const std::string name = (it++)->first;
      if (now.count(name) == 0) Drop(name);
    }
    return Status::Ok();
  }

  // A name that cannot be served is not, and said (TakeProblems); the others are served on.
  void Consider(const std::string& name) {
    Status st = ServeName(name);
    if (!st.ok()) {
      Drop(name);
      problems_.push_back("'" + name + "' is not served: " + st.ToString());
    }
  }

  // Serves name if it is this host's, published read-only for the cluster;
  // a name replaced by another allocation is served anew. Names that are not
  // (or no longer) such are not served; that is no error.
  Status ServeName(const std::string& name) {
    Result<ClusterNameInfo> at = client_.LookupCluster(name, 0);
    if (!at.ok() || at->host != host_ || !at->read_only) {
      Drop(name);
      return at.ok() || at.status().code() == ErrorCode::kNotFound ? Status::Ok() : at.status();
    }
    MB_ASSIGN_OR_RETURN(std::shared_ptr<ServedObject> object, ObjectOf(name));
    if (!object) {  // gone since, or device memory (not served: docs/CLUSTER.md)
      Drop(name);
      return Status::Ok();
    }
    if (auto it = names_.find(name); it != names_.end() && it->second->object == object) return Status::Ok();
    Drop(name);
    auto s = std::make_unique<ServedName>(engine_);
    s->object = object;
    const share::NameCard card{name,          next_serial_++, object->allocation, object->mem.addr(),
                               object->mem.handle.size(), object->checksum};
    MB_ASSIGN_OR_RETURN(s->card.handle, client_.MallocPhysical(share::kCardBytes));
    MB_ASSIGN_OR_RETURN(s->card.map, MapAll(client_, s->card.handle, s->card.range));
    MB_RETURN_IF_ERROR(share::EncodeCard(card, {s->card.map.as<uint8_t>(), share::kCardBytes}));
    // Written before it is registered, and never again: a peer never sees it half written.
    MB_RETURN_IF_ERROR(engine_.RegisterMem({s->card.addr(), share::kCardBytes}, MEM_HOST, s->card.reg,
                                           share::CardRegionName(name, card.serial)));
    names_[name] = std::move(s);
    return Status::Ok();
  }

  // The object name refers to now: mapped, checksummed and registered here,
  // or served already under another name (then this client holds its
  // allocation, and Lookup says so); null when the name is gone or in device
  // memory.
  Result<std::shared_ptr<ServedObject>> ObjectOf(const std::string& name) {
    Result<PhysicalHandle> h = client_.Lookup(name, 0);
    if (h.ok()) {
      if (h->device() >= 0) {
        MB_RETURN_IF_ERROR(client_.FreePhysical(*h));
        return std::shared_ptr<ServedObject>();
      }
      auto o = std::make_shared<ServedObject>(engine_);
      o->allocation = h->id();
      o->mem.handle = std::move(*h);
      MB_ASSIGN_OR_RETURN(o->mem.map, MapAll(client_, o->mem.handle, o->mem.range));
      o->checksum = share::Checksum(o->mem.map.data(), o->mem.handle.size());
      MB_RETURN_IF_ERROR(engine_.RegisterMem({o->mem.addr(), o->mem.handle.size()}, MEM_HOST, o->mem.reg));
      objects_[o->allocation] = o;
      return o;
    }
    if (h.status().code() == ErrorCode::kNotFound) return std::shared_ptr<ServedObject>();
    if (h.status().code() != ErrorCode::kAlreadyExists) return h.status();
    // This client holds its allocation already: another name of the same object.
    MB_ASSIGN_OR_RETURN(std::vector<NamedObjectInfo> found, client_.ListNames(name));
    for (const NamedObjectInfo& n : found)
      if (n.name == name)
        if (auto it = objects_.find(n.allocation); it != objects_.end())
          if (std::shared_ptr<ServedObject> o = it->second.lock()) return o;
    return h.status();
  }

  // Its card goes, then its object when no other name uses it (Registered).
  void Drop(const std::string& name) {
    names_.erase(name);
    std::erase_if(objects_, [](const auto& o) { return o.second.expired(); });
  }

  Client client_;
  TransferEngine engine_;
  std::string host_;
  uint64_t next_serial_ = 1;
  uint64_t dropped_ = 0;
  uint64_t reattaches_ = 0;
  // Declared after the engine: destroyed before it, so each deregisters.
  std::map<std::string, std::unique_ptr<ServedName>> names_;
  // Objects by allocation, owned by the names that use them.
  std::map<uint64_t, std::weak_ptr<ServedObject>> objects_;
  std::vector<std::string> problems_;
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
std::vector<std::string> NameShare::TakeProblems() { return impl_->TakeProblems(); }

}  // namespace membroker
