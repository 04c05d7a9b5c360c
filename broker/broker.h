// Broker: the loop, the options, the counters and one object per component,
// as iceoryx's RouDi holds its managers. Each component owns its state and
// lives in the folder of its role (docs/ARCHITECTURE.md has the map). Broker's
// members are the loop's callbacks and the request handlers: check, call a
// component, answer.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "admin/admin_tables.h"
#include "admin/admin_socket.h"
#include "admin/metrics_http.h"
#include "answer.h"
#include "cluster/cluster.h"
#include "counters.h"
#include "engine_registry.h"
#include "kv/kv_stores.h"
#include "memory/holdings.h"
#include "name_registry.h"
#include "options.h"
#include "restart/fd_store_sync.h"
#include "restart/state_file.h"
#include "restart/takeover.h"
#include "server/admission.h"
#include "server/sessions.h"
#include "waiters.h"

namespace membroker::broker {

class Broker {
 public:
  static Result<std::unique_ptr<Broker>> Create(Options options);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  Status Run();  // until SIGTERM/SIGINT; then releases everything and unlinks sockets
  void RunOnce() { uv_run(&loop_, UV_RUN_NOWAIT); }  // for embedding and the fuzzer
  size_t live_allocations() const { return holdings_.table().all().size(); }
  size_t live_sessions() const { return sessions_.size(); }
  // True when nothing is held, charged, pending or returning (the fuzzer checks it after each input).
  bool Idle() const;
  // Each component's own Check, then the tables against each other (consistency.cc).
  Status CheckTables() const;
  std::string AdminCommand(const std::string& line);  // "stats", "list clients", ... [--json]
  // Disconnects a client and releases everything it held, as a crash would.
  Status KickClient(uint64_t id);
  // Stops exporting an allocation and drops every holder's reference.
  Status FreeAllocation(uint64_t id);
  // Removes what outlives its client by design - every named object, persistent ones
  // included, and every KV store no client uses - and says how many (embedding, fuzzer).
  size_t RemoveOwnerless();

 private:
  explicit Broker(Options options);
  void Stop();
  void ReportReady();  // sd_notify READY=1 and the watchdog (systemd.h)

  // Sessions (server/accept.cc, server/session_io.cc, server/session_end.cc).
  void Accept();
  bool Admits(const ipc::PeerCred& cred, int fd) const;
  void ArmHandshakeTimer();
  void CloseSilentSessions();
  static void OnSessionEvent(uv_poll_t* h, int status, int events);
  void ReadFrames(Session& s);
  void Flush(Session& s);
  // Sends a reply; fds are borrowed (duplicated only if the reply must queue).
  void Send(Session& s, uint64_t request_id, ipc::Message body, std::span<const int> fds = {});
  void SendError(Session& s, uint64_t request_id, const Status& st);
  void CloseAfterReply(Session& s, CloseReason reason = CloseReason::kProtocolViolation);
  // The one end of a session, whatever the reason: each component's OnSessionEnd in order.
  void CloseSession(Session& s, CloseReason reason, const std::string& detail = "");
  // True if the session's process has exited (its end is read now, so what it held is free at once).
  bool ReapIfExited(uint64_t session_id);

  // Requests (dispatch.cc, the *_requests.cc files, restart/reattach.cc): check, call a component, answer.
  void HandleFrame(Session& s, ipc::Frame&& frame);  // takes what it keeps; ReadFrames closes the rest
#define MEMBROKER_HANDLER(T, direction, fds) \
  MEMBROKER_IF_##direction(Answer Handle(Session& s, uint64_t rid, const ipc::T& m);)
  MEMBROKER_MESSAGES(MEMBROKER_HANDLER)
#undef MEMBROKER_HANDLER
  Answer Handle(Session& s, uint64_t rid, const ipc::ReattachRequest& m, std::vector<ipc::UniqueFd>& fds);
  struct PresentedFd;  // restart/reattach.cc: an fd a client presents, as checked so far
  ipc::ReattachResult ReattachOne(Session& s, const ipc::ReattachHandle& h, PresentedFd& p);
  void ReserveIds();     // after ids were handed out: the next block in the state file
  struct PendingMalloc;  // memory_requests.cc
  void FinishMalloc(const PendingMalloc& p, Result<PhysicalMemory> mem, int pool);
  // One more reference to a for s in `where`, and the ImportReply carrying fd.
  Status Grant(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only, Holding where,
               const std::string& metadata = "");
  Status ConnectPeer(Session& peer, uint64_t rid, const std::string& name);
  ipc::EngineInfoReply EngineInfo(const Engine& e, uint32_t slot) const;
  void OnClusterChanged();
  Status GrantNamed(Session& s, uint64_t rid, const std::string& name, const NamedEntry& e);
  void Unpublish(const std::string& name, int32_t pid);
  std::vector<HostName> ListedForCluster() const;  // this host's names for its cluster record
  void PostEvent(ipc::NameEventKind kind, const std::string& name, uint64_t allocation, int32_t pid,
                 const std::string& host = "");
  void SendEvents(Session& s, uint64_t rid);
  // Answers and closes every waiter of kind for key: answer() sends the reply, or returns the error to send.
  void AnswerWaiters(Waiter::Kind kind, const std::string& key, const std::function<Status(Session&, uint64_t)>& answer);
  void OnWaiterTimeout(const Waiter& w);

  // Restart (restart/takeover_steps.cc, restart/fd_store_restore.cc).
  void BeginHandOver();
  void ContinueHandOver();
  Status SendState();
  void ResumeServing(const std::string& why);
  Status ReceiveTakeOver();
  Status RestoreFromFdStore(std::vector<std::pair<std::string, ipc::UniqueFd>> stored);
  Result<Allocation*> AdoptHandedOver(const ipc::TakeOverAllocation& x, ipc::UniqueFd fd, const std::string& stored_as);
  Status RestoreName(const ipc::TakeOverName& m);
  std::vector<ipc::Message> StateRecords() const;  // the exports and names, as take-over and the fd store write them
  Status StartReattachGrace();
  void ExpireAwaiting();  // the grace is over: what nobody reattached to goes

  AdminTables Tables() const;  // admin/admin_dispatch.cc: what the admin's records read

  Options options_;
  uv_loop_t loop_{};
  uv_signal_t signals_[2]{};  // SIGTERM, SIGINT
  uv_timer_t watchdog_timer_{};  // WATCHDOG=1 pings, when systemd asks for them
  bool stopping_ = false;
  BrokerCounters counters_;
  ipc::MessageEncoder encoder_;  // every reply and notice Send encodes (on the loop)
  std::unique_ptr<StateFile> state_file_ = StateFile::Ephemeral();
  ipc::UniqueFd proc_fd_dir_;  // /proc/self/fd, where reattach reads memfd names
  Admission admission_;
  Sessions sessions_;
  AdminSocket admin_;
  MetricsHttp metrics_;
  TakeOver takeover_;
  uv_timer_t grace_timer_{};  // until --reattach-grace-ms: what nobody reattached to is kept
  FdStoreSync fd_store_;
  Pools pools_;
  Workers workers_;
  Holdings holdings_;
  EngineRegistry engines_;
  NameRegistry names_;
  KvStores kv_;
  Waiters waiters_;
  Cluster cluster_;  // --cluster: this host in etcd, and the others
};

}  // namespace membroker::broker
