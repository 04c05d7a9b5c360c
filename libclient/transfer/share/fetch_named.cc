// FetchNamed: a name of another host copied here through its share
// (membroker/name_share.h, docs/CLUSTER.md).
#include <algorithm>
#include <chrono>
#include <span>
#include <thread>

#include "membroker/name_share.h"
#include "transfer/share/name_card.h"

namespace membroker {

namespace {

using Clock = std::chrono::steady_clock;

int32_t Left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int32_t>(std::max<int64_t>(0, ms));
}
// A transfer's timeout: what is left, and at least 1 ms (0 would not wait at all).
int32_t TransferTimeout(Clock::time_point deadline) { return std::max<int32_t>(1, Left(deadline)); }

// The destination while it is filled: mapped and registered here, undone on
// every return; the handle itself outlives it.
struct Landing {
  TransferEngine& engine;
  Reservation range;
  Mapping map;
  MemHandle reg = nullptr;
  ~Landing() {
    if (reg != nullptr) (void)engine.DeregisterMem(reg);
  }
  uint8_t* data() const { return map.as<uint8_t>(); }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(map.data()); }
};

enum class Outcome { kCopied, kNotServed };

// Reads name's card and then its bytes from the share, if the share serves
// it now; kNotServed when it does not (yet, or any more).
Result<Outcome> CopyOnce(TransferEngine& engine, const std::string& share, const ClusterNameInfo& at,
                         const std::string& name, Landing& land, Clock::time_point deadline) {
  const size_t size = at.size;
  std::vector<RegionInfo> regions;
  MB_RETURN_IF_ERROR(engine.GetRemoteRegions(share, regions, TransferTimeout(deadline)));
  const std::string prefix = share::CardRegionPrefix(name);
  for (const RegionInfo& r : regions) {
    if (r.name.rfind(prefix, 0) != 0 || r.length < share::kCardBytes) continue;
    Status st = engine.TransferSync(share, READ, {{land.addr(), r.address, share::kCardBytes}},
                                    TransferTimeout(deadline));
    if (st.code() == ErrorCode::kParamInvalid) continue;  // deregistered since the list was read
    MB_RETURN_IF_ERROR(st);
    MB_ASSIGN_OR_RETURN(share::NameCard card, share::DecodeCard({land.data(), share::kCardBytes}));
    // A hash's other name, or another object under the name: the one the
    // lookup found is served a little later (a replace), or was replaced since.
    if (card.name != name || card.size != size || (at.allocation != 0 && card.allocation != at.allocation)) continue;
    st = engine.TransferSync(share, READ, {{land.addr(), card.object_address, size}},
                             TransferTimeout(deadline));
    if (st.code() == ErrorCode::kParamInvalid) continue;  // unpublished during the copy
    MB_RETURN_IF_ERROR(st);
    if (share::Checksum(land.data(), size) != card.checksum)
      return Status(ErrorCode::kDataLoss, "the bytes of '" + name + "' from " + share +
                                              " do not match their checksum: written after they were published "
                                              "read-only, or damaged on the way");
    return Outcome::kCopied;
  }
  return Outcome::kNotServed;
}

}  // namespace

Result<FetchedObject> FetchNamed(Client& client, TransferEngine& engine, const std::string& name, int timeout_ms) {
  if (timeout_ms < 0) return Status(ErrorCode::kParamInvalid, "timeout_ms must be 0 or more");
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  MB_ASSIGN_OR_RETURN(ClusterNameInfo at, client.LookupCluster(name, timeout_ms));
  FetchedObject out;
  out.host = at.host;
  out.generation = at.generation;
  out.size = at.size;
  out.metadata = at.metadata;
  if (at.host == client.cluster_host()) {  // here already: the object itself
    MB_ASSIGN_OR_RETURN(out.handle, client.Lookup(name, 0));
    return out;
  }
  if (!at.read_only)
    return Status(ErrorCode::kUnsupported, "'" + name + "' on " + at.host +
                                               " is not published read-only, so its bytes may change under a copy "
                                               "(publish it with kPublishReadOnly to fetch it)");
  const std::string share = NameShare::EngineName(at.host);
  Status connected = engine.Connect(share, Left(deadline));
  if (connected.code() == ErrorCode::kTimeout || connected.code() == ErrorCode::kNotFound)
    return Status(connected.code(), "no share answered for " + at.host + " (is membroker-share running there?): " +
                                        connected.message());
  if (!connected.ok() && connected.code() != ErrorCode::kAlreadyConnected) return connected;
  bool reconnect = connected.code() == ErrorCode::kAlreadyConnected;

  MB_ASSIGN_OR_RETURN(out.handle, client.MallocPhysical(at.size));
  {
    Landing land{engine, {}, {}, nullptr};
    MB_ASSIGN_OR_RETURN(land.range, client.ReserveMemAddress(out.handle.size()));
    MB_ASSIGN_OR_RETURN(land.map, client.MapMem(land.range.base(), out.handle.size(), 0, out.handle));
    MB_RETURN_IF_ERROR(engine.RegisterMem({land.addr(), out.handle.size()}, MEM_HOST, land.reg));
    // The share learns of a name by the broker's event, a little after the
    // name is found: poll for its card until the deadline.
    for (std::chrono::milliseconds pause{1};; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      Result<Outcome> o = CopyOnce(engine, share, at, name, land, deadline);
      if (!o.ok() && o.status().code() == ErrorCode::kNotConnected && reconnect) {
        // A connection of an earlier fetch, to a share that has gone since
        // (restarted, or its host came back): once more on a new one.
        reconnect = false;
        (void)engine.Disconnect(share, 0);
        MB_RETURN_IF_ERROR(engine.Connect(share, Left(deadline)));
        continue;
      }
      if (!o.ok()) return o.status();
      if (*o == Outcome::kCopied) break;
      if (Clock::now() >= deadline)
        return Status(ErrorCode::kTimeout, share + " did not serve '" + name + "' in time");
      std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - Clock::now() + std::chrono::milliseconds(1))));
    }
  }
  out.copied = true;
  return out;
}

}  // namespace membroker
