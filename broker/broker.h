// Broker: the loop, the options, the counters and the components, as
// iceoryx's RouDi holds its managers. Each component owns its state and lives
// in the folder of its role (docs/ARCHITECTURE.md has the map):
//   server/   Admission (the listening socket and its limits), Sessions
//   memory/   Holdings (table, charges, window), Pools, Workers, the backend
//   restart/  TakeOver, FdStoreSync, the state file (identity.h)
//   admin/    the admin socket, its records and the consistency check
//   engine_registry, name_registry, waiters: what clients find each other by.
// Broker's own members are the loop's callbacks and the request handlers:
// check, call a component, answer. One thread runs the loop; slow work runs
// on libuv's worker pool (Workers) so the loop keeps serving.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "admin/admin_format.h"
#include "admin/admin_socket.h"
#include "answer.h"
#include "engine_registry.h"
#include "memory/holdings.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"
#include "name_registry.h"
#include "options.h"
#include "restart/fd_store_sync.h"
#include "restart/identity.h"
#include "restart/takeover.h"
#include "server/admission.h"
#include "server/sessions.h"
#include "waiters.h"

namespace membroker::broker {

struct BrokerCounters {
  uint64_t clients_total = 0;
  uint64_t clients_refused = 0;  // not admitted by the uid/gid policy
  uint64_t released_on_disconnect = 0;
  uint64_t requests = 0;
  uint64_t errors_sent = 0;
  uint64_t protocol_errors = 0;
  uint64_t bytes_pending = 0;  // reserved for allocations being created
  uint64_t quota_rejections = 0;
  uint64_t clients_reattached = 0;  // hellos with the reattach feature
  uint64_t handles_reattached = 0;  // handles given back to reattaching clients
  uint64_t handles_adopted = 0;     // of those, memory a previous broker created
  uint64_t reattach_refused = 0;    // handles refused (not ours, wrong id, ...)
  uint64_t exports_restored = 0;
};

class Broker {
 public:
  static Result<std::unique_ptr<Broker>> Create(Options options);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // Runs until SIGTERM/SIGINT, then releases everything and unlinks sockets.
  Status Run();
  // One non-blocking turn of the loop, for embedding and for the fuzzer.
  void RunOnce() { uv_run(&loop_, UV_RUN_NOWAIT); }
  size_t live_allocations() const { return holdings_.table().all().size(); }
  size_t live_sessions() const { return sessions_.size(); }
  // True when nothing is held, charged, pending or returning (the fuzzer checks it after each input).
  bool Idle() const;
  // Walks every table and checks they agree: each component's own check, then
  // holders against ledgers and names, charges against owners (consistency.cc).
  Status CheckTables() const;
  // Admin commands ("stats", "list clients", ... with optional --json).
  std::string AdminCommand(const std::string& line);
  // Disconnects a client and releases everything it held, as a crash would.
  Status KickClient(uint64_t id);
  // Stops exporting an allocation and drops every holder's reference.
  Status FreeAllocation(uint64_t id);
  // Removes every named object, persistent ones included (embedding, fuzzer).
  size_t UnpublishAll();

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
  // True if the session's process has exited: its remaining frames and the
  // end of its socket are read now, so the names it held are free at once.
  bool ReapIfExited(uint64_t session_id);

  // Requests (dispatch.cc; memory/memory_requests.cc, engine_requests.cc,
  // name_requests.cc, restart/reattach.cc): check, call a component, answer.
  void HandleFrame(Session& s, ipc::Frame frame);
#define MEMBROKER_HANDLER(T, direction, fds) \
  MEMBROKER_IF_##direction(Answer Handle(Session& s, uint64_t rid, const ipc::T& m);)
  MEMBROKER_MESSAGES(MEMBROKER_HANDLER)
#undef MEMBROKER_HANDLER
  Answer Handle(Session& s, uint64_t rid, const ipc::ReattachRequest& m, std::vector<ipc::UniqueFd>& fds);
  ipc::ReattachResult ReattachOne(Session& s, const ipc::ReattachHandle& h, ipc::UniqueFd fd);
  void ReserveIds();  // after ids were handed out: the next block in the state file
  struct PendingMalloc {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
    uint32_t flags = 0;
    uint32_t export_flags = 0;  // with ipc::kMallocExport
    Usage charged;              // up front; settled here
    uid_t uid = 0;
  };
  void FinishMalloc(const PendingMalloc& p, Result<ipc::PhysicalMemory> mem, int pool);
  // Gives s one more reference to a in `where` and sends the ImportReply carrying fd.
  Status Grant(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only, Holding where,
               const std::string& metadata = "");
  Status ConnectPeer(Session& peer, uint64_t rid, const std::string& name);
  ipc::EngineInfoReply EngineInfo(const Engine& e, uint32_t slot) const;
  Status GrantNamed(Session& s, uint64_t rid, const std::string& name, const NamedEntry& e);
  void Unpublish(const std::string& name, int32_t pid);
  void PostEvent(ipc::NameEventKind kind, const std::string& name, uint64_t allocation, int32_t pid);
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

  // Admin (admin/admin_dispatch.cc, admin/admin_records.cc).
  Record StatsRecord() const;
  Record ClientRecord(const Session& s) const;
  Record AllocationRecord(const Allocation& a) const;
  Record ConfigRecord() const;
  std::vector<Record> PoolRecords() const;
  std::vector<Record> EngineRecords() const;
  std::vector<Record> NameRecords() const;
  std::vector<Record> QuotaRecords() const;
  std::string MetricsText() const;

  Options options_;
  uv_loop_t loop_{};
  uv_signal_t signals_[2]{};  // SIGTERM, SIGINT
  uv_timer_t watchdog_timer_{};  // WATCHDOG=1 pings, when systemd asks for them
  bool stopping_ = false;
  BrokerCounters counters_;
  std::unique_ptr<BrokerIdentity> identity_ = BrokerIdentity::Ephemeral();
  ipc::UniqueFd proc_fd_dir_;  // /proc/self/fd, where reattach reads memfd names
  Admission admission_;
  Sessions sessions_;
  AdminSocket admin_;
  TakeOver takeover_;
  uv_timer_t grace_timer_{};  // until --reattach-grace-ms: what nobody reattached to is kept
  FdStoreSync fd_store_;
  Pools pools_;
  Workers workers_;
  Holdings holdings_;
  EngineRegistry engines_;
  NameRegistry names_;
  Waiters waiters_;
};

}  // namespace membroker::broker
