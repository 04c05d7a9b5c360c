// The broker's steps of a take-over (restart/takeover.h says the protocol):
// on the old broker, stopping its sessions, draining them and sending the
// state; on the new one, taking the state in. Both take-over and the fd
// store carry the same records (StateRecords), and what nobody reattaches to
// within --reattach-grace-ms goes.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/framing.h"
#include "restart/kv_stores_restart.h"
#include "uv_status.h"

namespace membroker::broker {

// ---- the old broker ----------------------------------------------------------

void Broker::BeginHandOver() {
  if (stopping_) {
    takeover_.Abort();
    return;
  }
  MB_INFO("takeover_begins", "new_pid=%d clients=%zu allocations=%zu", static_cast<int>(takeover_.new_pid()),
          sessions_.size(), live_allocations());
  // 1. Nothing new comes in: connections wait in the backlog, requests in
  //    their sockets, for the new broker.
  admission_.Hold();
  for (const auto& [id, s] : sessions_.all())
    if (!s->closing) uv_poll_stop(&s->poll);
}

void Broker::ContinueHandOver() {
  // 2. What is in flight finishes first (its reply is sent before the notice),
  //    and so do the disk tier's writes (the new broker reads them after) and
  //    the restores of stores from this broker's own start.
  bool busy = counters_.bytes_pending > 0 || kv_.DiskWriting() || kv_.restoring();
  for (const auto& [id, s] : sessions_.all()) busy = busy || s->inflight > 0;
  if (busy && takeover_.Draining()) return;
  if (kv_.restoring()) {  // its stores are not whole yet: nothing to send
    ResumeServing(std::to_string(kv_.restoring_count()) +
                  " KV stores of this broker's start are still being made again; take over when they are");
    return;
  }
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(TakeOver::kDrainMs);
  for (uint64_t id : sessions_.Ids()) {
    Session* s = sessions_.Find(id);
    while (s != nullptr && !s->outbound.empty()) {
      Flush(*s);
      s = sessions_.Find(id);
      if (s == nullptr || s->outbound.empty()) break;
      pollfd p{s->fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, Remaining(flush_deadline)) <= 0) break;  // it does not read: it loses those replies
    }
    if (s != nullptr) uv_poll_stop(&s->poll);  // Flush re-armed it
  }
  // 3. The state, then the new broker's word that it has it all.
  Status st = SendState();
  if (st.ok()) st = takeover_.AwaitAck();
  if (!st.ok()) {
    ResumeServing(st.message());
    return;
  }
  // 4. Every client reattaches to the new broker; this one exits holding
  //    everything until the kernel closes its fds (the new broker has its own).
  const std::vector<uint8_t> notice = ipc::Encode(
      {ipc::kProtocolVersion, 0, 0,
       ipc::ErrorReply{ErrorCode::kNotConnected, "membrokerd handed over to a new broker (pid " +
                                                     std::to_string(takeover_.new_pid()) + "); reattaching"}});
  for (const auto& [id, s] : sessions_.all()) {
    if (s->closing) continue;
    (void)ipc::SendFrame(s->fd.get(), notice, {});
    // No more requests can come (the client's sends fail now), and those
    // that came unread are dropped here: a socket closed with unread data
    // would reset the client's end before it reads the notice.
    ::shutdown(s->fd.get(), SHUT_RD);
    ipc::Frame unread;
    while (ipc::RecvFrame(s->fd.get(), &unread).ok() && !unread.bytes.empty()) {
    }
  }
  MB_INFO("handed_over", "new_pid=%d clients=%zu allocations=%zu exports=%zu names=%zu",
          static_cast<int>(takeover_.new_pid()), sessions_.size(), live_allocations(),
          holdings_.table().export_count(), names_.size());
  std::fflush(stderr);
  cluster_.Stop();  // its records go; the new broker registers this host anew
  ::_exit(0);
}

Status Broker::SendState() {
  const int listen = admission_.fd();
  MB_RETURN_IF_ERROR(takeover_.Send(ipc::TakeOverSockets{}, {&listen, 1}));
  ipc::TakeOverAllocations batch;
  std::vector<int> fds;
  auto send_batch = [&]() -> Status {
    if (batch.handles.empty()) return Status::Ok();
    Status st = takeover_.Send(std::move(batch), fds);
    batch = {};
    fds.clear();
    return st;
  };
  uint64_t sent = 0;
  for (const auto& [id, a] : holdings_.table().all()) {
    if (!KeptOverRestart(a.memory)) continue;
    ++sent;
    batch.handles.push_back({a.id, a.page_size, a.policy, a.pinned, a.fell_back, a.fixed_address,
                             static_cast<uint32_t>(a.creator_uid)});
    fds.push_back(a.memory.fd.get());
    if (batch.handles.size() == ipc::kMaxReattachHandles) MB_RETURN_IF_ERROR(send_batch());
  }
  MB_RETURN_IF_ERROR(send_batch());
  MB_ASSIGN_OR_RETURN(const uint64_t stores, SendKvStores(kv_, [this](ipc::Message m, std::span<const int> fds) {
                        return takeover_.Send(std::move(m), fds);
                      }));
  if (const KvDiskTier* disk = kv_.disk()) {
    const int locked = disk->lock_fd();
    MB_RETURN_IF_ERROR(takeover_.Send(ipc::TakeOverKvDisk{}, {&locked, 1}));
  }
  for (ipc::Message& m : StateRecords()) {
    if (auto* end = std::get_if<ipc::TakeOverEnd>(&m)) {
      end->allocations = sent;
      end->kv_stores = stores;
    }
    MB_RETURN_IF_ERROR(takeover_.Send(std::move(m)));
  }
  return Status::Ok();
}

std::vector<ipc::Message> Broker::StateRecords() const {
  std::vector<ipc::Message> out;
  auto kept = [this](uint64_t allocation) {
    const Allocation* a = holdings_.Find(allocation);
    return a != nullptr && KeptOverRestart(a->memory);
  };
  uint64_t exports = 0, names = 0;
  for (const auto& [token, e] : holdings_.table().exports()) {
    if (!kept(e.allocation)) continue;
    out.push_back(ipc::TakeOverExport{token, e.allocation, static_cast<uint32_t>(e.exporter_uid), e.flags, e.allowed});
    ++exports;
  }
  for (const auto& [name, e] : names_.all()) {
    if (!kept(e.allocation)) continue;
    const uint32_t flags = (e.read_only ? ipc::kPublishReadOnly : 0) | (e.persist ? ipc::kPublishPersist : 0) |
                           (e.cluster ? ipc::kPublishCluster : 0);
    out.push_back(ipc::TakeOverName{name, e.allocation, flags, static_cast<uint32_t>(e.uid), e.publisher_pid, e.metadata});
    ++names;
  }
  out.push_back(ipc::TakeOverEnd{0, exports, names});
  return out;
}

void Broker::ResumeServing(const std::string& why) {
  MB_WARN("takeover_failed", "reason=\"%s\" (serving on)", LogText(why).c_str());
  takeover_.Abort();
  admission_.Resume();
  for (const auto& [id, s] : sessions_.all())
    if (!s->closing)
      (void)uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT | (s->polling_writable ? UV_WRITABLE : 0),
                          &Broker::OnSessionEvent);
}

// ---- the new broker ------------------------------------------------------------

Status Broker::ReceiveTakeOver() {
  MB_ASSIGN_OR_RETURN(TakeOverReceiver from, TakeOverReceiver::Connect(options_.socket_path + ".takeover"));
  uint64_t allocations = 0, exports = 0, names = 0;
  ipc::UniqueFd listening, disk_lock;
  KvStoreParts stores;
  for (;;) {
    std::vector<ipc::UniqueFd> fds;
    MB_ASSIGN_OR_RETURN(ipc::Envelope env, from.Next(&fds));
    if (std::holds_alternative<ipc::TakeOverSockets>(env.body)) {
      listening = std::move(fds[0]);
    } else if (auto* m = std::get_if<ipc::TakeOverAllocations>(&env.body)) {
      for (size_t i = 0; i < m->handles.size(); ++i) {
        auto adopted = AdoptHandedOver(m->handles[i], std::move(fds[i]), "");
        if (!adopted.ok()) return Status(adopted.code(), "--take-over: " + adopted.status().message());
        ++allocations;
      }
    } else if (auto* m = std::get_if<ipc::TakeOverKvStore>(&env.body)) {
      for (size_t i = 0; i < m->handles.size(); ++i)
        MB_RETURN_IF_ERROR(stores.Add(m->store, 0, m->handles[i], std::move(fds[i])));
    } else if (std::holds_alternative<ipc::TakeOverKvDisk>(env.body)) {
      disk_lock = std::move(fds[0]);
    } else if (auto* m = std::get_if<ipc::TakeOverExport>(&env.body)) {
      MB_RETURN_IF_ERROR(holdings_.RestoreExport(m->token, m->allocation, 0, m->exporter_uid, m->flags, m->pids));
      ++exports;
    } else if (auto* m = std::get_if<ipc::TakeOverName>(&env.body)) {
      if (Status st = RestoreName(*m); !st.ok()) return Status(st.code(), "--take-over: " + st.message());
      ++names;
    } else if (auto* m = std::get_if<ipc::TakeOverEnd>(&env.body)) {
      if (m->allocations != allocations || m->exports != exports || m->names != names ||
          m->kv_stores != stores.size() || !listening.valid())
        return Status(ErrorCode::kProtocolError, "--take-over: the state arrived incomplete");
      break;
    } else {
      return Status(ErrorCode::kProtocolError, std::string("--take-over: unexpected ") + ipc::MessageName(env.body));
    }
  }
  // Before the acknowledgement: a disk tier that is a third broker's fails
  // the take-over, and the old broker serves on. Its writes are all done.
  if (KvDiskTier* disk = kv_.disk()) {
    if (Status st = disk->TakeOver(std::move(disk_lock)); !st.ok())
      return Status(st.code(), "--take-over: " + st.message());
  }
  MB_RETURN_IF_ERROR(from.Finish());
  // The stores are copied once the old broker is gone, so each old slab's
  // memory goes as its blocks are copied (unless a client maps it).
  const size_t kv_stores = stores.RestoreInto(kv_, holdings_.limits(), workers_);
  MB_INFO("took_over", "allocations=%llu exports=%llu names=%llu kv_stores=%zu grace_ms=%u",
          static_cast<unsigned long long>(allocations), static_cast<unsigned long long>(exports),
          static_cast<unsigned long long>(names), kv_stores, options_.reattach_grace_ms);
  MB_RETURN_IF_ERROR(admission_.Adopt(std::move(listening)));
  return StartReattachGrace();
}

Result<Allocation*> Broker::AdoptHandedOver(const ipc::TakeOverAllocation& x, ipc::UniqueFd fd,
                                            const std::string& stored_as) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || holdings_.Find(x.id) != nullptr)
    return Status(ErrorCode::kProtocolError, "allocation " + std::to_string(x.id) + " is unusable");
  PhysicalMemory mem;
  mem.fd = std::move(fd);
  mem.size = static_cast<uint64_t>(st.st_size);
  mem.page_size = x.page_size;
  mem.fell_back = x.fell_back;
  MB_ASSIGN_OR_RETURN(Allocation * a,
                      holdings_.Adopt(x.id, std::move(mem), x.policy, x.creator_uid, x.pinned, x.fixed_address,
                                      {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)},
                                      stored_as));
  a->awaiting = true;  // its holders come back by reattaching
  return a;
}

Status Broker::RestoreName(const ipc::TakeOverName& m) {
  const Allocation* a = holdings_.Find(m.allocation);
  if (a == nullptr) return Status(ErrorCode::kProtocolError, "a name of an unknown allocation");
  if (names_.Find(m.name) != nullptr) return Status(ErrorCode::kAlreadyExists, "the name \"" + m.name + "\" came twice");
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxObjectNameBytes, "a name"));
  NamedEntry e;
  e.allocation = m.allocation;
  e.publisher_pid = m.publisher_pid;
  e.uid = m.uid;
  e.read_only = m.flags & ipc::kPublishReadOnly;
  e.persist = m.flags & ipc::kPublishPersist;
  e.cluster = m.flags & ipc::kPublishCluster;
  e.awaiting_publisher = !e.persist;
  e.metadata = m.metadata;
  if (e.read_only) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, BackendOf(a->memory, holdings_.backend()).ReadOnlyFd(a->memory));
  }
  MB_RETURN_IF_ERROR(names_.Add(m.name, std::move(e)).status());
  holdings_.AddReference(m.allocation);
  return Status::Ok();
}

Status Broker::StartReattachGrace() {
  return UvStatus("uv_timer_start", uv_timer_start(
                                        &grace_timer_,
                                        [](uv_timer_t* t) { static_cast<Broker*>(t->data)->ExpireAwaiting(); },
                                        options_.reattach_grace_ms, 0));
}

void Broker::ExpireAwaiting() {
  const std::vector<std::string> unclaimed = names_.NamesWhere([](const NamedEntry& e) { return e.awaiting_publisher; });
  for (const std::string& name : unclaimed) Unpublish(name, 0);
  const size_t released = holdings_.ExpireAwaiting();
  MB_INFO("reattach_grace_over", "released=%zu unpublished=%zu", released, unclaimed.size());
}

}  // namespace membroker::broker
