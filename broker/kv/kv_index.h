// KvIndex: a store's index kept in a memfd of its own (docs/KV.md, "Across
// a restart"), so that a broker started after a take-over or a crash finds
// the store again from its fds alone (the take-over socket, systemd's fd
// store). It holds a header (the store's id and spec) and one fixed-size
// record per slot (generation, length, key, sealed or not), each with its
// own checksum: the broker writes a slot's record after the slot changes
// (after a seal's bytes are in), so a broker killed while writing one leaves
// a record that fails its checksum and is dropped, never a wrong block.
// Only the broker maps it; no client ever gets its fd.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/store_spec.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

class KvIndex {
 public:
  struct Record {
    uint64_t slot = 0;
    uint64_t generation = 0;
    uint64_t length = 0;  // 0 unless sealed
    bool sealed = false;
    std::string key;
  };
  // What a broker finds in an index it did not write.
  struct Contents {
    uint64_t store = 0;
    uint64_t generation = 0;  // 0 as created, +1 at each restart it went through
    KvStoreSpec spec;
    std::vector<Record> records;    // every slot ever used, sealed or not, in slot order
    std::vector<uint64_t> damaged;  // slots whose record failed its checksum
    uint64_t max_generation = 0;    // over every sound record
  };

  static Result<KvIndex> Create(uint64_t store, uint64_t generation, const KvStoreSpec& spec);
  // Reads and checks an index: its header, its size, every record.
  static Result<Contents> Read(int fd);

  KvIndex() = default;
  KvIndex(KvIndex&& o) noexcept { *this = std::move(o); }
  KvIndex& operator=(KvIndex&& o) noexcept;
  ~KvIndex();

  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return size_; }
  // A slot taken by a key (not yet sealed), sealed, or freed (key empty).
  void Write(const Record& r);

 private:
  ipc::UniqueFd fd_;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace membroker::broker
