// Broker: the owner of the daemon's components - the loop and its sockets
// (broker.cc), sessions and admission (sessions.cc, admission.cc, the end of
// a session in session_end.cc), dispatch and the request handlers
// (dispatch.cc, requests.cc, engines.cc, names.cc, waiters.cc), holdings
// (holdings.cc), workers and pools (workers.cc, pools.cc), the physical-memory
// backend (backend.h), admin (admin.cc) and the consistency check
// (consistency.cc); docs/ARCHITECTURE.md has the map. One thread runs the
// loop; slow work runs on libuv's worker pool so the loop keeps serving.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <set>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "accounting.h"
#include "admin_format.h"
#include "address_window.h"
#include "allocation_table.h"
#include "engines.h"
#include "identity.h"
#include "names.h"
#include "waiter.h"
#include "options.h"
#include "pool.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"
#include "session.h"

namespace membroker::broker {

struct BrokerCounters {
  uint64_t clients_total = 0;
  uint64_t clients_refused = 0;  // not admitted by the uid/gid policy
  uint64_t connections_refused = 0;  // turned away at accept (out of fds, handshake backlog, full)
  uint64_t released_on_disconnect = 0;
  uint64_t requests = 0;
  uint64_t errors_sent = 0;
  uint64_t protocol_errors = 0;
  uint64_t bytes_pending = 0;    // reserved for allocations being created
  uint64_t bytes_returning = 0;  // freed allocations whose pages a worker is returning now
  uint64_t quota_rejections = 0;
  uint64_t clients_reattached = 0;   // hellos with the reattach feature
  uint64_t handles_reattached = 0;   // handles given back to reattaching clients
  uint64_t handles_adopted = 0;      // of those, memory a previous broker created
  uint64_t reattach_refused = 0;     // handles refused (not ours, wrong id, ...)
  uint64_t exports_restored = 0;
  // systemd's fd store (fd_store_broker.cc)
  uint64_t fd_store_stored = 0;    // memfds stored
  uint64_t fd_store_states = 0;    // state memfds stored
  uint64_t fd_store_failures = 0;  // stores refused
  uint64_t fd_store_restored = 0;  // allocations taken back from it at start
};

// Freed allocations' memory, to be given back to the backend together on a worker.
struct ReturnBatch {
  uint64_t bytes = 0;
  std::vector<ipc::PhysicalMemory> memories;
  void Add(Allocation&& a) {
    bytes += a.size;
    memories.push_back(std::move(a.memory));
  }
  bool empty() const { return memories.empty(); }
};

// What a request handler answers, in one value instead of a flag the
// dispatcher must guess: an error (ErrorReply), a reply to send now (Status::Ok()
// is OkReply, which NO_REPLY_ON_SUCCESS requests do without), or Deferred: the
// handler has sent its reply itself (one that carries fds) or something will
// later (a worker finishing, a waiter's event or timeout).
struct Deferred {};
struct Answer {
  Answer(Status st) : status(std::move(st)) {}  // NOLINT: an error, or OkReply
  template <typename T, typename = std::enable_if_t<std::is_constructible_v<ipc::Message, T>>>
  Answer(T reply) : reply(std::move(reply)) {}  // NOLINT
  Answer(Deferred) : deferred(true) {}          // NOLINT
  Status status;
  ipc::Message reply = ipc::OkReply{};
  bool deferred = false;
};
// For handlers whose callee sends the reply itself on success.
inline Answer SentOnSuccess(Status st) { return st.ok() ? Answer(Deferred{}) : Answer(std::move(st)); }

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
  size_t live_allocations() const { return table_.all().size(); }
  size_t live_sessions() const { return sessions_.size(); }
  // True when nothing is held or charged: no session, allocation, charge,
  // same-address range, pending creation or pending return of freed pages (the
  // fuzzer checks it after each input).
  bool Idle() const {
    const Usage& u = accounting_.total();
    return sessions_.empty() && table_.all().empty() && table_.export_count() == 0 &&
           u.bytes == 0 && u.pinned_bytes == 0 && u.allocations == 0 && u.imports == 0 &&
           window_.used() == 0 && counters_.bytes_pending == 0 && BytesReturning() == 0 &&
           engines_.empty() && waiters_.empty() && names_.empty();
  }

  // Freed bytes not yet back with the kernel: on a worker, or waiting for a pause.
  uint64_t BytesReturning() const { return counters_.bytes_returning + deferred_returns_.bytes; }

  // Walks every table and checks they agree (holders against ledgers and
  // names, charges against owners, waiters against sessions); the first
  // disagreement as an INTERNAL error (consistency.cc). The fuzzer runs it
  // after every input, the integration tests (admin `check`) after each test.
  Status CheckTables() const;

  // Admin commands ("stats", "list clients", ... with optional --json).
  std::string AdminCommand(const std::string& line);

 private:
  explicit Broker(Options options);
  Status Listen();
  void Stop();
  // sd_notify READY=1 and, when systemd asks, the watchdog (systemd.h).
  void ReportReady();

  // Connection handling (sessions.cc; the end of a session: session_end.cc).
  static void OnListenReadable(uv_poll_t* h, int status, int events);
  static void OnSessionEvent(uv_poll_t* h, int status, int events);
  void Accept();
  void ReadFrames(Session& s);
  void Flush(Session& s);
  // Why a connection ended, as the caller saw it (CloseReason, session.h),
  // and as the logs and counters say it (a peer's close is clean after a
  // goodbye, a crash otherwise). Counted per kind; stats derive from these.
  enum class CloseWhy { kClean, kCrash, kProtocolViolation, kSlowReader, kKicked, kNotAdmitted,
                        kBrokerStopping, kIoError, kHandshakeTimeout, kRefused, kCount };
  static const char* CloseWhyName(CloseWhy why);
  uint64_t Closes(CloseWhy why) const { return closes_[static_cast<size_t>(why)]; }
  // The one end of a session, whatever the reason (session_end.cc).
  void CloseSession(Session& s, CloseReason reason, const std::string& detail = "");
 public:
  // Disconnects a client and releases everything it held, as a crash would.
  Status KickClient(uint64_t id);
  // Stops exporting an allocation and drops every holder's reference (clients,
  // engines, names).
  Status FreeAllocation(uint64_t id);
  // Removes every named object, persistent ones included (embedding, fuzzer).
  size_t UnpublishAll();
 private:
  // Sends a reply; fds are borrowed (duplicated only if the reply must queue).
  void Send(Session& s, uint64_t request_id, ipc::Message body, std::span<const int> fds = {});
  void CloseAfterReply(Session& s, CloseReason reason = CloseReason::kProtocolViolation);
  void SendError(Session& s, uint64_t request_id, const Status& st);
  Session* FindSession(uint64_t id);
  // True if the session's process has exited: its remaining frames and the
  // end of its socket are read now, so the names it held are free at once.
  bool ReapIfExited(uint64_t session_id);
  bool Admits(const ipc::PeerCred& cred, int fd) const;  // at connect time

  // Admission at the limits (admission.cc).
  // Sends `why` (request id 0) on a connection it will not serve, then closes it.
  void Refuse(ipc::UniqueFd conn, const char* reason, const Status& why);
  // accept() failed for lack of fds: refuses one pending connection with the
  // reserve fd; false when none could be taken (the listener pauses).
  bool RefuseForLackOfFds(int err);
  void PauseListening();
  // Counts a refusal; logs it unless one was logged in the last second.
  void LogRefusal(const char* reason, const std::string& detail);
  // Connections that have not said hello (handshaking_), and the others.
  size_t Handshaking() const { return handshaking_.size(); }
  size_t Handshaken() const { return sessions_.size() - handshaking_.size(); }
  void ArmHandshakeTimer();
  // Closes the connection that has waited longest for its hello.
  void EvictOldestHandshaking();
  void CloseSilentSessions();

  // Requests (dispatch.cc; handlers in requests.cc, engines.cc, names.cc). HandleFrame decodes a frame
  // and hands it to the Handle overload of its message type; each returns
  // its Answer (a reply, an error, or Deferred).
  void HandleFrame(Session& s, ipc::Frame frame);
  // Reattach (reattach.cc): gives s back one handle it presents with its fd.
  ipc::ReattachResult ReattachOne(Session& s, const ipc::ReattachHandle& h, ipc::UniqueFd fd);
  // Puts memory an earlier broker made into the table under its old id
  // (reattach and take-over): pinned again if it was, at its old
  // same-address range (ADDRESS_IN_USE if that is taken: nothing changes),
  // charged to uid, with one holder (the caller's to record) and no creator.
  Result<Allocation*> AdoptMemory(uint64_t id, ipc::PhysicalMemory mem, ipc::PagePolicy policy, uid_t uid,
                                  bool pinned, uint64_t fixed_address, std::pair<uint64_t, uint64_t> inode);
  // A tagged memfd name (identity.h) for memory made for `what`.
  std::string MemoryName(const std::string& what) { return identity_->NameFor(what); }
  // After ids were handed out: reserves the next block in the state file.
  void ReserveIds();
#define MEMBROKER_HANDLER(T, direction, fds) \
  MEMBROKER_IF_##direction(Answer Handle(Session& s, uint64_t rid, const ipc::T& m);)
  MEMBROKER_MESSAGES(MEMBROKER_HANDLER)
#undef MEMBROKER_HANDLER
  // Transfer engines (engines.cc).
  // Connects peer to engine e and sends the EngineInfoReply.
  Status ConnectPeer(Session& peer, uint64_t rid, Engine& e);
  // The engine this session runs, or nullptr (a session's engine name is
  // cleared when its engine goes).
  Engine* OwnEngine(const Session& s);
  ipc::EngineInfoReply EngineInfo(const Engine& e, uint32_t slot) const;
  // Removes s's engine (its name, regions and inbound peers) and s's own
  // connections; with `all`, also its engine holdings.
  void EndEngineSession(Session& s);

  // Named objects and events (names.cc).
  // Gives s a reference to the named object and sends the ImportReply.
  Status GrantNamed(Session& s, uint64_t rid, const NamedEntry& e);
  void Unpublish(std::map<std::string, NamedEntry>::iterator it, int32_t pid);
  void PostEvent(ipc::NameEventKind kind, const std::string& name, uint64_t allocation, int32_t pid);
  void SendEvents(Session& s, uint64_t rid);
  // At session close: names it published go (unless persistent), and a
  // crash tells subscribers that a holder of each named object it held died.
  void EndNamesSession(Session& s, bool crashed);

  // Waiters (waiters.cc).
  Status AddWaiter(Session& s, uint64_t rid, Waiter::Kind kind, const std::string& key, uint32_t timeout_ms);
  std::vector<Waiter*> WaitersFor(Waiter::Kind kind, const std::string& key);
  // Answers and closes every waiter of kind for key: answer() sends the reply,
  // or returns the error to send.
  void AnswerWaiters(Waiter::Kind kind, const std::string& key,
                     const std::function<Status(Session&, uint64_t)>& answer);
  std::vector<Waiter*> WaitersOf(uint64_t session_id);
  void CloseWaiter(Waiter* w);
  static void OnWaiterTimeout(uv_timer_t* t);
  // Completes a MallocRequest whose memory was created (or failed): charges
  // were made up front with `charged`; they are settled here.
  struct PendingMalloc {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    uid_t uid = 0;
    ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
    uint32_t flags = 0;
    uint32_t export_flags = 0;  // with ipc::kMallocExport
    Usage charged;
    int pool = -1;
  };
  void FinishMalloc(const PendingMalloc& p, Result<ipc::PhysicalMemory> mem);
  // Creates spec's memory on a worker, then FinishMalloc (workers.cc).
  void CreateOnWorker(PendingMalloc p, MemorySpec spec);
  // Serves p from a matching pool that has memory ready (FinishMalloc
  // answers); false when none does (pools.cc).
  bool TakeFromPool(PendingMalloc& p, uint64_t size);
  // Removes s's entry for allocation_id from `where` and releases it (charges
  // settled, the reference dropped) in one step; false if s held none there.
  bool Release(Session& s, uint64_t allocation_id, Holding where);
  // Releases every entry of `where`; returns how many there were.
  size_t ReleaseAll(Session& s, Holding where);
  // Gives s one more reference to a, recorded in `into` (its ledger or its
  // engine's holdings) and charged as an import, and sends the ImportReply
  // carrying fd.
  Status GrantImport(Session& s, uint64_t rid, const Allocation& a, int fd, bool read_only, Ledger& into,
                     const std::string& metadata = "");
  // Drops one reference; the allocation goes when the last one does.
  void DropReference(uint64_t allocation_id);
  // Settles and releases an allocation that has left the table.
  void Retire(Allocation gone);

  // Take-over (takeover.cc). The old broker's side: SOCKET.takeover, a new
  // broker connecting to it, draining, sending the state, then exiting.
  Status ListenTakeOver();
  std::string TakeOverSocketPath() const { return options_.socket_path + ".takeover"; }
  static void OnTakeOverReadable(uv_poll_t* h, int status, int events);
  void BeginHandOver();
  void ContinueHandOver();
  Status SendState(int fd);
  void ResumeServing(const std::string& why);
  // The new broker's side: receives the listening socket and the state.
  Status ReceiveTakeOver();
  // What both take-over and the fd store carry: an allocation the broker
  // before this one had (kept without holders until clients reattach), an
  // export, a name.
  Result<Allocation*> AdoptHandedOver(const ipc::TakeOverAllocation& x, ipc::UniqueFd fd);
  Status RestoreName(const ipc::TakeOverName& m);
  // The exports and names as take-over and the fd store write them down.
  std::vector<ipc::Message> StateRecords() const;
  // Memory and names nobody reattached to are kept until --reattach-grace-ms.
  Status StartReattachGrace();
  // When the reattach grace ends: what nobody reattached to goes.
  void ExpireAwaiting();

  // systemd's file descriptor store (fd_store_broker.cc, fd_store.h).
  // Stores a's memfd (once; nothing without a store).
  void StoreMemory(Allocation& a);
  // Exports or names changed: a new state memfd is stored at the next turn
  // of the loop (changes made in one turn are stored together).
  void StateChanged();
  void StoreState();
  // At start: takes back what systemd kept for the broker before this one.
  Status RestoreFromFdStore(std::vector<std::pair<std::string, ipc::UniqueFd>> stored);
  // Closes the batch's fds on a worker, counted in bytes_returning meanwhile.
  void ReturnOnWorker(ReturnBatch batch);
  // Pool refills and single frees' returns wait until takes and frees pause
  // (--background-delay-ms), so a burst does not share the CPUs with the
  // workers creating and zeroing memory behind it.
  void DeferBackground();
  void RunBackground();
  Status Charge(Session& s, const Usage& delta);
  void Uncharge(Session* s, uid_t uid, const Usage& delta);
  void FillPools();
  void RefillPool(size_t index);

  // Admin socket (admin.cc).
  Record StatsRecord() const;
  Record ClientRecord(const Session& s) const;
  Record AllocationRecord(const Allocation& a) const;
  Record ConfigRecord() const;
  std::vector<Record> PoolRecords() const;
  std::vector<Record> EngineRecords() const;
  std::vector<Record> NameRecords() const;
  std::vector<Record> QuotaRecords() const;
  std::string MetricsText() const;
  Status ListenAdmin();
  static void OnAdminConnection(uv_stream_t* server, int status);

  friend struct MallocWork;
  friend struct RefillWork;
  friend struct ReturnWork;
  friend struct AdminConnection;

  Options options_;
  uv_loop_t loop_{};
  uv_poll_t listen_poll_{};
  ipc::UniqueFd listen_fd_;
  bool socket_bound_ = false;  // our socket file exists and is ours to unlink
  ipc::UniqueFd reserve_fd_;    // closed to accept-and-refuse when out of fds
  bool socket_activated_ = false;  // the client socket came from systemd (not ours to unlink)
  ipc::UniqueFd activated_socket_;  // that socket, until Listen serves it
  bool fd_store_ = false;           // keep memory and state in systemd's fd store
  uint64_t state_generation_ = 0;   // of the state memfd stored last
  bool state_pending_ = false;      // state_timer_ runs: StoreState at the next turn
  uv_timer_t state_timer_{};
  uv_timer_t watchdog_timer_{};    // WATCHDOG=1 pings, when systemd asks for them
  bool listening_paused_ = false;
  uv_timer_t listen_retry_timer_{};
  uv_timer_t handshake_timer_{};
  struct {
    uint64_t window_start = 0;  // uv_now() of the last refusal logged
    uint64_t suppressed = 0;    // refusals since, not logged
  } refusal_log_;
  uv_pipe_t admin_pipe_{};
  uv_signal_t sigterm_{};
  uv_signal_t sigint_{};
  bool stopping_ = false;
  uint64_t next_session_id_ = 1;
  std::unordered_map<uint64_t, Session*> sessions_;
  std::set<uint64_t> handshaking_;  // ids of sessions without a hello yet, oldest first
  std::unique_ptr<BrokerIdentity> identity_ = BrokerIdentity::Ephemeral();
  // The fds of the request being handled (ReattachRequest's), for its handler.
  std::vector<ipc::UniqueFd>* request_fds_ = nullptr;
  ipc::UniqueFd proc_fd_dir_;  // /proc/self/fd, where reattach reads memfd names
  // Take-over (takeover.cc).
  ipc::UniqueFd takeover_listen_fd_;
  uv_poll_t takeover_poll_{};
  bool takeover_bound_ = false;  // SOCKET.takeover is ours to unlink
  ipc::UniqueFd handover_conn_;  // the new broker, while handing over
  pid_t handover_pid_ = 0;
  uint64_t handover_deadline_ = 0;  // uv_now() by which draining ends
  uv_timer_t handover_timer_{};
  uv_timer_t grace_timer_{};
  PhysicalBackend& backend_ = MemfdBackend();  // host memory; device backends join here
  AllocationTable table_{backend_};
  Accounting accounting_;
  AddressWindow window_;
  std::deque<Pool> pools_;  // deque: a Pool is not copyable and never moves
  uv_timer_t background_timer_{};
  ReturnBatch deferred_returns_;      // frees waiting for a pause
  uint64_t background_deadline_ = 0;  // uv_now() by which they start; valid while the timer runs
  BrokerCounters counters_;
  std::string budget_source_;         // where options_.max_bytes came from
  std::string pinned_budget_source_;  // and options_.max_pinned_bytes
  uint64_t closes_[static_cast<size_t>(CloseWhy::kCount)] = {};
  uint64_t outbound_bytes_ = 0;  // replies queued for every slow reader together
  std::map<std::string, Engine> engines_;  // by name
  std::vector<Waiter*> waiters_;
  std::map<std::string, NamedEntry> names_;
  uint64_t next_region_id_ = 1;
  // While a session closes: where DropReference gathers what it frees, so one
  // worker closes it all (see CloseSession).
  ReturnBatch* return_batch_ = nullptr;
};

// The open-file limit the broker runs under (RLIMIT_NOFILE, soft).
uint64_t FdLimit();
// RESOURCE_EXHAUSTED for a connection refused for lack of fds (err: EMFILE or ENFILE).
Status OutOfFds(int err);

// Closes every admin connection on loop except the listener (at shutdown).
void CloseAdminConnections(uv_loop_t* loop, uv_handle_t* listener);

// A group name or number.
Result<gid_t> ResolveGroup(const std::string& name);

// Prepares a Unix socket path for bind: a stale socket file (nobody accepting)
// is removed; a live broker or a non-socket file there is an error.
Status PrepareSocketPath(const std::string& path);
// PrepareSocketPath, then a non-blocking SOCK_SEQPACKET socket bound at path
// under umask_bits (0117: mode 0660). *bound turns true once the file exists
// (the caller removes it); the caller listens.
Status BindSeqpacket(const std::string& path, mode_t umask_bits, ipc::UniqueFd* out, bool* bound);

}  // namespace membroker::broker
