// Named objects fetched from another host of the cluster (docs/CLUSTER.md,
// "Fetching a name from another host"):
//  - NameShare, which the membroker-share program runs on each host, serves
//    that host's names published read-only for the cluster (kPublishCluster |
//    kPublishReadOnly) to engines on other hosts: it maps each one read-only,
//    takes the checksum of its bytes and registers it with its engine,
//    "membroker-share@<host>", beside a card that says where it is;
//  - FetchNamed copies such a name from whichever host has it into new broker
//    memory here, in one call: find the host (LookupCluster), connect to its
//    share, read the card and then the bytes, and check every byte against the
//    card's checksum.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "membroker/client.h"
#include "membroker/status.h"
#include "membroker/transfer_engine.h"

namespace membroker {

// What FetchNamed brought here.
struct FetchedObject {
  PhysicalHandle handle;  // new broker memory of this host holding the bytes (the caller frees it)
  std::string host;       // where it came from; this host's own name when it was here already
  uint64_t generation = 0;  // that host's registration (ClusterNameInfo::generation)
  size_t size = 0;          // the object's bytes (the publisher's allocation size)
  std::string metadata;     // the publisher's (Publish)
  bool copied = false;      // false: the name is this host's, and handle is the object itself
};

// Copies `name`, published for the cluster read-only on another host, into
// new memory of this host's broker, through engine (Initialized, with the
// secret_file the shares expect). Waits up to timeout_ms in all: for the name
// to be published (LookupCluster), for its host's share to serve it and for
// the bytes. On this host already: a Lookup, no copy. Errors: those of
// LookupCluster; UNSUPPORTED for a name not published read-only (its bytes
// may change under the copy); NOT_CONNECTED when that host runs no share;
// TIMEOUT when its share has not served it by then; DATA_LOSS when the bytes
// that arrived do not match the checksum the share took (the publisher
// wrote into it after publishing it read-only, or they were damaged on the way).
MEMBROKER_API Result<FetchedObject> FetchNamed(Client& client, TransferEngine& engine, const std::string& name,
                                               int timeout_ms);

// Serves this host's names published read-only for the cluster to other
// hosts' FetchNamed. One per host; membroker-share runs it.
class MEMBROKER_API NameShare {
 public:
  // The engine name a host's share registers: "membroker-share@<host>".
  static std::string EngineName(const std::string& host);

  // Initializes an engine as EngineName(client.cluster_host()) with
  // engine_options (listen_address, and secret_file or allow_from: see
  // TransferEngine::Initialize), then serves every such name published now.
  // UNSUPPORTED when the client's broker is in no cluster.
  static Result<std::unique_ptr<NameShare>> Start(Client& client,
                                                  const std::map<std::string, std::string>& engine_options);
  ~NameShare();
  NameShare(const NameShare&) = delete;
  NameShare& operator=(const NameShare&) = delete;

  // Waits up to timeout_ms for the broker's name events and follows them:
  // serves names published since, stops serving those gone. An error is the
  // broker's (NOT_CONNECTED while it restarts); a name that cannot be served
  // is not, and is said by TakeProblems, and the others are served on.
  Status Serve(int timeout_ms);
  // What could not be served since the last call, one line per name.
  std::vector<std::string> TakeProblems();
  size_t served() const;  // names served now
  const TransferEngine& engine() const;

 private:
  class Impl;
  explicit NameShare(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace membroker
