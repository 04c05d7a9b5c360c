// KvDiskTier: the KV stores' second tier, a directory (docs/KV.md, "The disk
// tier"). A block evicted from a store's memory is written there by a worker
// thread; a get of a key found there promotes it back into a slot (a disk
// hit). The tier's bytes are bounded: past its capacity the oldest files go.
//
// Each block is one file, DIR/<store hash>/<key hex>.<sequence>.kv, that
// describes itself: a header with the store's name and block size, the key,
// the tier's write sequence (the order files were written in, kept across
// starts) and the payload's length and checksum, under a checksum of its
// own. Open scans the directory, so a broker that starts finds the blocks of
// an earlier one; a file that fails any check is dropped with a log line,
// and a payload is checked again at every promotion: never served damaged.
// A file is written under a temporary name and renamed when whole.
//
// One broker per directory: the tier holds a lock on it (flock of the
// directory) for as long as the broker runs, and a take-over hands the lock to
// the new broker with the rest of the state (docs/KV.md).
//
// The tier itself is used on the loop thread only. Each write and read has
// three steps: Begin* on the loop (takes the entry, says what to do), Perform
// on a worker (file I/O alone, on what Begin* copied out), End* on the loop.
// A write copies its block out of the slab first (Copy, on a worker), so the
// slot is free again after a memory copy, not after the disk's write; the
// bytes waiting to be written are bounded (kMaxWaitingBytes). Once the loop
// is told of that copy (Copied), a read of the key is served from it rather
// than wait for the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

struct KvDiskStats {
  uint64_t blocks = 0;  // files in the tier (written or being written)
  uint64_t bytes = 0;   // their payloads
  uint64_t writing = 0;  // of them, being written by a worker
  uint64_t written = 0;
  uint64_t write_failed = 0;
  uint64_t promoted = 0;
  uint64_t damaged = 0;  // files dropped because a check failed (at the scan or a promotion)
  uint64_t trimmed = 0;  // files removed to stay within the capacity
  uint64_t found = 0;    // files the scan at start kept
  uint64_t write_skipped = 0;  // evicted blocks not written: no room (files being written) or too many bytes waiting
};

class KvDiskTier {
 public:
  static constexpr uint64_t kMaxWaitingBytes = 256ull << 20;

  // Makes dir (mode 0700) if it is absent, refuses one another user owns or
  // others may write (a file there is served as a block), locks it (BUSY
  // while another broker has it) and scans it. taking_over: a broker being
  // taken over holds the lock and still writes, so the scan only reads what is
  // whole; TakeOver finishes the opening.
  static Result<std::unique_ptr<KvDiskTier>> Open(const std::string& dir, uint64_t capacity,
                                                  bool taking_over = false);
  // After a take-over: the old broker's locked directory fd when it had this
  // directory as its tier (else the lock is taken here: BUSY when a third
  // broker has it); then what the old one wrote or removed since the first
  // scan is read, and its unfinished writes go.
  Status TakeOver(ipc::UniqueFd handed_lock);
  // The directory, open and locked: a take-over sends it.
  int lock_fd() const { return dir_fd_.get(); }

  // The key has a file here, whole or being written.
  bool Has(const std::string& store, std::string_view key) const;
  bool BeingWritten(const std::string& store, std::string_view key) const;

  struct Write {
    std::string store, key;
    uint64_t block_size = 0, length = 0, sequence = 0;
    std::string path, temporary;
    std::vector<std::string> trimmed;  // older files to remove first
    std::shared_ptr<const ipc::UniqueFd> slab;  // where the payload is read from
    uint64_t offset = 0;
    std::shared_ptr<std::byte[]> payload;  // Copy's
  };
  // Nothing when the key has a file already, a block cannot fit, or too
  // many bytes wait to be written.
  std::optional<Write> BeginWrite(const std::string& store, const std::string& key, uint64_t block_size,
                                  uint64_t length);
  // Reads the block from its slab (the slot may be reused after this).
  static Status Copy(Write& w);
  // On the loop, after a Copy that succeeded: reads of the key may be served
  // from the copy until EndWrite.
  void Copied(const Write& w);
  // Writes the file from what Copy read.
  static Status Perform(Write& w);
  void EndWrite(const Write& w, const Status& result);

  struct Read {
    std::string store, key;
    uint64_t block_size = 0, sequence = 0;
    std::string path;
    std::shared_ptr<const std::byte[]> copy;  // a block waiting to be written: read from here
    uint64_t length = 0;                       // (the copy's)
  };
  // Nothing unless the key's file is whole or its block waits, copied, to be
  // written.
  std::optional<Read> BeginRead(const std::string& store, std::string_view key, uint64_t block_size);
  // Reads the payload into `to` (block_size bytes of room) and checks it all:
  // its length, or why the file cannot be served.
  static Result<uint64_t> Perform(const Read& r, std::byte* to);
  // A file that failed is dropped (removed, logged, counted).
  void EndRead(const Read& r, const Result<uint64_t>& result);
  // The read was begun but not performed (no slot for it).
  void CancelRead(const Read& r);

  const std::string& dir() const { return dir_; }
  uint64_t capacity() const { return capacity_; }
  const KvDiskStats& stats() const { return stats_; }
  // Files of one store (blocks, bytes).
  std::pair<uint64_t, uint64_t> StoreUsage(const std::string& store) const;
  // One store's share of trimmed and write_skipped since the broker started
  // (by store name: the tier keeps blocks by name, past a drop).
  struct StoreLosses {
    uint64_t trimmed = 0;
    uint64_t write_skipped = 0;
  };
  StoreLosses LossesOf(const std::string& store) const;

 private:
  using Name = std::pair<std::string, std::string>;  // (store, key)
  struct Entry {
    uint64_t sequence = 0;
    uint64_t length = 0;
    uint64_t block_size = 0;
    bool whole = false;    // written (not still being written)
    uint32_t readers = 0;  // promotions reading it: not trimmed meanwhile
    std::shared_ptr<const std::byte[]> copy;  // while it waits to be written (Copied)
  };
  KvDiskTier(std::string dir, uint64_t capacity) : dir_(std::move(dir)), capacity_(capacity) {}
  Status Lock();
  // Reads the directory: files not known yet are checked and added; known
  // ones (by name) are not read again, and those gone are forgotten. settle:
  // unfinished writes are removed and the oldest files go past the capacity
  // (not while a broker being taken over may still write here).
  Status Scan(bool settle);
  std::string PathOf(const std::string& store, const std::string& key, uint64_t sequence) const;
  void Drop(const Name& name, const std::string& why);
  void Forget(std::map<Name, Entry>::iterator it);

  std::string dir_;
  ipc::UniqueFd dir_fd_;  // locked while it is this broker's
  uint64_t capacity_;
  uint64_t next_sequence_ = 1;
  uint64_t waiting_bytes_ = 0;  // of writes begun and not ended
  std::map<Name, Entry> entries_;
  std::map<uint64_t, Name> by_age_;  // sequence -> entry: the oldest is trimmed first
  KvDiskStats stats_;
  std::map<std::string, StoreLosses> losses_;  // by store name
};

}  // namespace membroker::broker
