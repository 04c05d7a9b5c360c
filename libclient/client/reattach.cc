// Reattach: when the broker goes away, this client's watcher thread connects
// to the next broker on the socket and presents what the client holds
// (docs/RESTART.md). Until then every call that needs the broker fails at
// once with NOT_CONNECTED; mappings stay valid (the kernel keeps the pages,
// and this process keeps its fds).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "client/client_core.h"
#include "client/hangup_watcher.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/syscall.h"

namespace membroker::detail {

namespace {
using Clock = std::chrono::steady_clock;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

uint64_t MsSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

void Note(ReattachReport* report, const Status& st) {
  if (st.ok()) {
    ++report->restored;
    return;
  }
  ++report->failed;
  if (report->first_error.ok()) report->first_error = st;
}
}  // namespace

Status ClientCore::StartWatcher() {
  if (!options_.reattach) return Status::Ok();
  return HangupWatcher::Get().Watch(this, conn_.socket_fd());
}

void ClientCore::OnHangup() {
  // The previous reattach has finished (it watched the new socket last).
  if (reattacher_.joinable()) reattacher_.join();
  if (!stop_fd_.valid()) {
    stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_fd_.valid()) {
      // Without an eventfd this client could not be stopped mid-reattach: it
      // stays detached (every call NOT_CONNECTED), as with reattach off.
      (void)conn_.BreakOnHangup(ipc::ErrnoStatus("eventfd", "reattaching", errno));
      return;
    }
  }
  reattacher_ = std::thread([this] { ReattachLoop(); });
}

uint64_t ClientCore::reattaches() const {
  std::lock_guard<std::mutex> lk(reattach_mu_);
  return reattaches_;
}

ReattachReport ClientCore::last_reattach() const {
  std::lock_guard<std::mutex> lk(reattach_mu_);
  return last_reattach_;
}

Status ClientCore::WaitForReattach(uint64_t count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(reattach_mu_);
  if (reattach_cv_.wait_for(lk, timeout, [&] { return reattaches_ >= count; })) return Status::Ok();
  return Status(ErrorCode::kTimeout, "no reattach to a new broker within " + std::to_string(timeout.count()) + " ms");
}

void ClientCore::ReattachLoop() {
  const Clock::time_point lost = Clock::now();
  Status why = conn_.BreakOnHangup(Status(ErrorCode::kNotConnected,
                                          "the broker went away; this client reattaches when one serves " +
                                              options_.socket_path + " again"));
  // A broker that said why it closed (kicked by the operator, refused) meant it.
  if (why.code() != ErrorCode::kNotConnected) return;
  // Closing an inotify instance waits for an RCU grace period (milliseconds),
  // so the watch is closed only once the client has reattached.
  ipc::UniqueFd watch;
  const uint32_t max_backoff = std::max<uint32_t>(1, options_.reattach_max_backoff_ms);
  for (uint32_t retry_ms = 1;; retry_ms = std::min(retry_ms * 2, max_backoff)) {
    ipc::UniqueFd sock = ConnectAgain(&watch);
    if (!sock.valid()) return;  // stopping
    ReattachReport report;
    Status st = Reattach(std::move(sock), lost, &report);
    if (!st.ok()) {
      // That broker went away too, or refused this client (too many clients,
      // another protocol): try again, after a doubling pause, never in a spin.
      pollfd stop{stop_fd_.get(), POLLIN, 0};
      if (::poll(&stop, 1, static_cast<int>(retry_ms)) > 0) return;
      continue;
    }
    // (Watch fails only without an epoll entry to spare: attached, but unwatched.)
    if (!HangupWatcher::Get().Watch(this, conn_.socket_fd()).ok()) return;
    if (options_.on_reattach) options_.on_reattach(report);
    return;
  }
}

ipc::UniqueFd ClientCore::ConnectAgain(ipc::UniqueFd* watch_fd) {
  // The socket file reappearing (a new broker binding it) wakes us at once;
  // otherwise retry with a doubling delay, at most reattach_max_backoff_ms.
  // Without an inotify instance (the per-uid limit), the delay alone.
  ipc::UniqueFd& watch = *watch_fd;
  if (!watch.valid()) {
    watch.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
    if (watch.valid() && ::inotify_add_watch(watch.get(), DirOf(options_.socket_path).c_str(),
                                             IN_CREATE | IN_MOVED_TO | IN_ATTRIB) < 0)
      watch.reset();
  }
  const uint32_t max_backoff = std::max<uint32_t>(1, options_.reattach_max_backoff_ms);
  uint32_t backoff = 1;
  for (;;) {
    auto sock = ipc::ConnectSeqpacket(options_.socket_path);
    if (sock.ok()) return std::move(*sock);
    pollfd p[2] = {{stop_fd_.get(), POLLIN, 0}, {watch.get(), POLLIN, 0}};
    const int n = ::poll(p, watch.valid() ? 2 : 1, static_cast<int>(backoff));
    if (n > 0 && p[0].revents) return ipc::UniqueFd();
    if (n > 0 && (p[1].revents & POLLIN)) {
      char events[4096];
      while (::read(watch.get(), events, sizeof(events)) > 0) {
      }
      backoff = 1;  // something changed in the socket's directory: try now
      continue;
    }
    backoff = std::min(backoff * 2, max_backoff);
  }
}

Status ClientCore::Reattach(ipc::UniqueFd sock, std::chrono::steady_clock::time_point lost,
                            ReattachReport* report) {
  Connection fresh(std::move(sock), std::chrono::milliseconds(options_.call_timeout_ms));
  MB_ASSIGN_OR_RETURN(Reply hello, fresh.Call(ipc::HelloRequest{options_.client_name, ipc::kProtocolVersion,
                                                                ipc::kFeatureReattach}));
  auto* h = std::get_if<ipc::HelloReply>(&hello.body);
  if (h == nullptr) return Status(ErrorCode::kProtocolError, "reattach handshake got no HelloReply");
  report->client_id = h->client_id;

  // What to present, taken under the lock; fds duplicated so a handle freed
  // meanwhile cannot close one under us.
  struct Presented {
    ipc::ReattachHandle handle;
    ipc::UniqueFd fd;
  };
  std::vector<Presented> handles;
  std::map<uintptr_t, size_t> host_regs;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [id, held] : handles_) {
      if (held.detached) continue;  // (a freed handle still mapped is held until unmapped)
      int dup = ::fcntl(held.fd.get(), F_DUPFD_CLOEXEC, 0);
      if (dup < 0) return ipc::ErrnoStatus("fcntl(F_DUPFD_CLOEXEC)", "a handle's fd", errno);
      handles.push_back({ipc::ReattachHandle{id, held.created, held.pinned, held.fixed_address}, ipc::UniqueFd(dup)});
    }
    host_regs = host_regs_;
  }
  std::set<uint64_t> taken;  // handles the new broker holds for this client again
  for (size_t at = 0; at < handles.size(); at += ipc::kMaxReattachHandles) {
    const size_t n = std::min(ipc::kMaxReattachHandles, handles.size() - at);
    ipc::ReattachRequest req;
    std::vector<int> fds;
    for (size_t i = 0; i < n; ++i) {
      req.handles.push_back(handles[at + i].handle);
      fds.push_back(handles[at + i].fd.get());
    }
    MB_ASSIGN_OR_RETURN(Reply r, fresh.Call(std::move(req), std::chrono::milliseconds(0), fds));
    auto* m = std::get_if<ipc::ReattachReply>(&r.body);
    if (m == nullptr || m->results.size() != n)
      return Status(ErrorCode::kProtocolError, "ReattachRequest got a wrong reply");
    for (size_t i = 0; i < n; ++i) {
      const ipc::ReattachResult& res = m->results[i];
      if (res.code == ErrorCode::kOk) {
        ++report->handles;
        taken.insert(handles[at + i].handle.handle);
        continue;
      }
      ++report->handles_refused;
      if (report->first_error.ok())
        report->first_error = Status(res.code, "handle " + std::to_string(handles[at + i].handle.handle) +
                                                   ": " + res.message);
    }
  }
  // Exports and names of handles the new broker took back (a freed handle's
  // memory cannot be presented again).
  const ReattachJournal::Entries journal = journal_.entries();
  for (const auto& [token, e] : journal.exports)
    if (taken.count(e.handle))
      Note(report, fresh.Call(ipc::RestoreExportRequest{e.handle, token, e.flags, e.pids}).status());
  for (const auto& [name, p] : journal.publications)
    if (taken.count(p.handle))
      Note(report, fresh.Call(ipc::PublishRequest{name, p.handle, p.flags, p.metadata}).status());
  for (const auto& [prefix, cluster] : journal.subscriptions)
    Note(report, fresh.Call(ipc::SubscribeRequest{prefix, cluster}).status());
  for (const auto& [addr, size] : host_regs)
    Note(report, fresh.Call(ipc::RegisterHostRequest{addr, size, 0}).status());
  const std::map<uintptr_t, uint64_t> regions = ReattachEngine(fresh, taken, report);
  if (const int wake = wake_.sending(); wake >= 0)
    Note(report, fresh.Call(ipc::WakeRequest{}, std::chrono::milliseconds(0), {&wake, 1}).status());

  // From here on the new broker serves every call of this client.
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Presented& p : handles)
      if (!taken.count(p.handle.handle))
        if (auto it = handles_.find(p.handle.handle); it != handles_.end()) it->second.detached = true;
    // A range the new broker did not take is local only (DeregisterMem then
    // only forgets it here).
    for (auto& [va, r] : engine_ranges_)
      if (r.region != 0) r.region = regions.count(va) ? regions.at(va) : 0;
  }
  client_id_ = h->client_id;
  report->waited_ms = MsSince(lost);
  conn_.Replace(fresh.TakeSocket());
  {
    // Counted once the new broker serves this client's calls (WaitForReattach
    // returns only then); a call may succeed a moment before the count.
    std::lock_guard<std::mutex> lk(reattach_mu_);
    ++reattaches_;
    last_reattach_ = *report;
    reattach_cv_.notify_all();
  }
  SendLostFrees(taken);
  wake_.Poke();  // an event loop looks again: what was queued at the old broker is gone
  return Status::Ok();
}

std::map<uintptr_t, uint64_t> ClientCore::ReattachEngine(Connection& fresh, const std::set<uint64_t>& taken,
                                                         ReattachReport* report) {
  const ReattachJournal::Entries journal = journal_.entries();
  const std::string& name = journal.engine_name;
  const uint64_t control = journal.engine_control;
  std::map<uintptr_t, EngineRegistration> ranges;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [va, r] : engine_ranges_)
      if (r.region != 0) ranges.emplace(va, r);
  }
  std::map<uintptr_t, uint64_t> regions;
  if (name.empty()) return regions;
  // The engine's connections are made again by each peer's next use of them
  // (transfer_engine.cc): the peer's engine may reattach after this one.
  // Hidden from peers until its ranges are back (the second Init below), so
  // a peer reconnecting meanwhile waits instead of finding them missing.
  Status init = taken.count(control) ? fresh.Call(ipc::EngineInitRequest{name, control, true}).status()
                                     : Status(ErrorCode::kNotFound, "the engine's control block was not taken back");
  Note(report, init);
  if (!init.ok()) return regions;
  for (const auto& [va, r] : ranges) {
    if (r.where.handle != 0 && !taken.count(r.where.handle)) {
      Note(report, Status(ErrorCode::kNotFound, "registered memory of a handle the new broker did not take back"));
      continue;
    }
    auto reply = fresh.Call(ipc::EngineRegisterRequest{va, r.size, r.where.handle, r.where.offset, r.name});
    auto* m = reply.ok() ? std::get_if<ipc::EngineRegisterReply>(&reply->body) : nullptr;
    Note(report, m != nullptr ? Status::Ok()
                 : reply.ok() ? Status(ErrorCode::kProtocolError, "EngineRegisterRequest got a wrong reply")
                              : reply.status());
    if (m != nullptr) regions[va] = m->region;
  }
  // (Not an item of its own in the report; counted only if it fails.)
  if (Status whole = fresh.Call(ipc::EngineInitRequest{name, control, false}).status(); !whole.ok())
    Note(report, whole);
  return regions;
}

void ClientCore::SendLostFrees(const std::set<uint64_t>& taken) {
  const std::vector<uint64_t> frees = journal_.TakeLostFrees();
  // Freed before they were presented: the new broker never held them.
  for (uint64_t id : frees)
    if (taken.count(id)) (void)conn_.SendOneWay(ipc::FreeRequest{id});
}

}  // namespace membroker::detail
