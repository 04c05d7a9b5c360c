// FdStoreSync: the broker's side of systemd's file descriptor store
// (fd_store.h). Every allocation's memfd is stored when it enters the table
// and removed when it leaves; the exports and names are stored as one sealed
// memfd after every turn of the loop that changed them (written by
// `records`, which the broker gives). Without a store, it keeps nothing.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kv/kv_stores.h"
#include "memory/holdings.h"
#include "membroker/ipc/protocol.h"

namespace membroker::broker {

struct FdStoreCounters {
  uint64_t stored = 0;    // memfds stored
  uint64_t states = 0;    // state memfds stored
  uint64_t failures = 0;  // stores refused
  uint64_t restored = 0;  // allocations taken back from it at start
};

class FdStoreSync : public MemoryJournal, public KvJournal {
 public:
  FdStoreSync(uv_loop_t* loop, std::function<std::vector<ipc::Message>()> records)
      : loop_(loop), records_(std::move(records)) {}
  Status Init();
  // From now on, memory and state are stored (--fd-store, or systemd announced a store).
  void Enable() { enabled_ = true; }
  bool enabled() const { return enabled_; }
  // The state memfd a predecessor stored last (its generation), kept until
  // this broker stores a newer one.
  void Continue(uint64_t generation) { generation_ = generation; }
  void CountRestored(uint64_t n) { counters_.restored += n; }
  // Nothing is stored after this (the broker is stopping).
  void Close();

  void Entered(Allocation& a) override;
  void Left(const Allocation& a) override;
  void ExportsChanged() override { StateChanged(); }
  // A KV-cache store's index and slabs (StoredKvName).
  void StoreAdded(const BlockStore& store) override;
  void StoreRemoved(const BlockStore& store) override;
  // Exports or names changed: a new state memfd is stored at the next turn of
  // the loop (changes made in one turn are stored together).
  void StateChanged();

  const FdStoreCounters& counters() const { return counters_; }

 private:
  void StoreState();

  uv_loop_t* loop_;
  std::function<std::vector<ipc::Message>()> records_;
  bool enabled_ = false;
  bool closed_ = false;
  uint64_t generation_ = 0;  // of the state memfd stored last
  bool pending_ = false;     // timer_ runs: StoreState at the next turn
  uv_timer_t timer_{};
  FdStoreCounters counters_;
};

}  // namespace membroker::broker
