#include "transfer/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "transfer/ucx/dial.h"
#include "transfer/ucx/door.h"
#include "transfer/ucx/engine_wire.h"

static_assert(membroker::detail::wire::kTokenBytes == sizeof(membroker::detail::handshake::Token));
#include "membroker/ipc/escape.h"
#include "membroker/ipc/unique_fd.h"

namespace membroker::detail {

namespace {

using Clock = UcxTransport::Clock;
using wire::kAmId;
using wire::kDataAmId;
constexpr size_t kMaxQueuedNotifies = 256;         // as the broker's queue
constexpr auto kCallerGrace = std::chrono::seconds(10);  // past its deadline the thread has answered
constexpr auto kSpinAfterActivity = std::chrono::milliseconds(1);
// While the loop spins for transfers, the door is still looked at this often.
constexpr auto kDoorInterval = std::chrono::milliseconds(1);
// Refusals logged to stderr: at most this many lines a minute, then one line
// that says how many more there were.
constexpr int kRefusalLinesPerMinute = 10;
using handshake::Token;
// A transfer moves in pieces of at most 512 KiB, one data message each, at
// most 64 pieces and 16 MiB of one transfer in flight. On the two-host
// bench's veth (bench/net_transfer.py, a noisy 2-CPU machine), one 64 MiB
// WRITE took: pieces of 128 KiB (one TCP segment) 2.3-3.8 GB/s in six runs,
// 256 KiB 3.6-4.1 in four, 512 KiB 4.4 in two, 1 and 4 MiB 1.7-4.2 in four;
// UCX's emulated put 3.2-4.9 in the same minutes. Windows above 16 MiB were
// slower.
constexpr size_t kPieceBytes = 512 << 10;
constexpr size_t kWindowPieces = 64;
// Descriptors of at most 64 KiB are sent together, up to 120 KiB and
// wire::kMaxSegments of them: one message and one answer for many KV blocks,
// not one each, and within one TCP segment, so no side reassembles it. With
// 1000 4 KiB descriptors on the two-host veth, per descriptor: batches of
// 120 KiB wrote in 2.3-3.4 us and read in 0.9-1.3, of 256-512 KiB in 5.3-6.0
// and 2.5-3.1; one message each (no batches) took 8.5-11.3 and 8.0-9.2.
constexpr size_t kBatchBytes = 64 << 10;
constexpr size_t kBatchMessageBytes = 120 << 10;
constexpr size_t kWindowBytes = 16 << 20;
// Answers to one connection's pieces that UCX may still hold, queued because
// the peer does not read them: past this many the connection is closed rather
// than the queue growing without bound (an engine has at most 64 pieces of
// each transfer in flight).
constexpr size_t kMaxAnswersInFlight = 4096;
// How long RegisterMem waits for connected engines to acknowledge a new range:
// after it they see it when the message arrives (a link that is down delays them).
constexpr auto kAnnounceWait = std::chrono::seconds(1);

Status UcxError(std::string_view what, ucs_status_t st) {
  return Status(ErrorCode::kInternal, std::string(what) + ": " + ucs_status_string(st));
}

// One caller blocked on the progress thread.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void Finish(Status st) {
    std::lock_guard<std::mutex> lk(mu);
    if (done) return;
    done = true;
    status = std::move(st);
    cv.notify_all();
  }
  // Bounded: the progress thread answers by the caller's deadline; the grace
  // covers a thread that is slow, not one that forgot.
  Status Wait(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_until(lk, std::max(deadline, Clock::now()) + kCallerGrace, [&] { return done; }))
      return Status(ErrorCode::kInternal, "the UCX progress thread did not answer");
    return status;
  }
};

struct RemoteRegion {
  uint64_t handle = 0;
  uint64_t length = 0;
  bool read_only = false;
  std::string name;
  int users = 0;      // transfers in flight that use it
  bool gone = false;  // the owner deregistered it: acknowledged once users is 0
};

struct LocalRegion {
  uintptr_t address = 0;
  size_t length = 0;
  bool read_only = false;
  std::string name;
  int device = -1;  // CUDA device memory: moved with NetOptions::device_copy, never memcpy
  int sending = 0;  // answers to reads that UCX still sends from it
  bool removing = false;
  std::set<uint64_t> awaiting;  // connections that have not acknowledged RegionGone
  std::vector<std::pair<std::shared_ptr<Waiter>, Clock::time_point>> waiters;
  // RegisterMem waits (briefly) until every connected engine knows the range.
  std::set<uint64_t> announcing;  // connections that have not acknowledged RegionAdded
  std::shared_ptr<Waiter> add_waiter;
  Clock::time_point add_deadline{};
};

struct Job;
struct Piece;

struct Conn {
  uint64_t id = 0;
  bool outgoing = false;
  ucp_ep_h ep = nullptr;  // ours, to the peer's worker
  Token token{};          // on what the peer sends us: how we know it is this connection's
  Token peer_token{};     // on what we send it
  // kHandshake: a connector admitted, waiting for the acceptor's Welcome.
  enum class State { kHandshake, kReady, kBroken } state = State::kHandshake;
  std::string address;  // the peer's, as text
  std::string engine;   // the remote engine's name (from its handshake)
  Clock::time_point deadline = Clock::time_point::max();  // of the handshake
  Status broken;        // why it is broken
  // Connector side. Its token is known before the handshake, so the Welcome
  // is caught even when it comes before the endpoint is made (then what it
  // answers waits in unsent).
  std::array<uint8_t, 16> identity{};  // the acceptor's, from its Welcome
  std::vector<wire::Message> unsent;
  std::shared_ptr<Waiter> connect_waiter;
  PeerInfo* connect_info = nullptr;
  std::map<uint64_t, RemoteRegion> regions;  // by remote address
  std::set<Job*> jobs;
  std::unordered_map<uint64_t, Piece*> pieces;  // in flight, by tag
  uint64_t next_tag = 1;
  // Acceptor side.
  size_t answers_in_flight = 0;
  std::map<uint64_t, std::pair<std::shared_ptr<Waiter>, Clock::time_point>> notifies;  // by seq
  uint64_t next_seq = 1;
};

// One piece of a transfer in flight, until UCX is done sending it and its
// answer came (or never will: the connection broke). Its send request's user data.
struct Piece {
  Job* job = nullptr;
  uint64_t tag = 0;
  // Where its bytes come from (WRITE) or go (READ), and their range at the
  // remote: one range, or a batch of small descriptors' (more than one).
  std::vector<std::pair<uintptr_t, wire::Segment>> ranges;
  uint64_t length = 0;  // of all its ranges
  bool sending = false;
  bool answered = false;
  wire::RoutedDataHeader header{};  // alive while UCX sends it
  std::string batch_bytes;  // a batch's table (and a WRITE's bytes, gathered), alive while UCX sends them
};

struct Job {
  class UcxTransport::Worker* worker = nullptr;
  uint64_t conn = 0;
  TransferOp op = READ;
  Clock::time_point deadline;
  Status result;
  // What to send, checked against the remote's ranges; sent in order, in
  // pieces, a window at a time (Worker::Pump).
  std::vector<TransferOpDesc> descs;
  size_t next = 0;           // the descriptor of the next piece
  uint64_t next_offset = 0;  // and where in it that piece starts
  std::map<uint64_t, std::unique_ptr<Piece>> in_flight;  // by tag
  size_t bytes_in_flight = 0;
  std::vector<uint64_t> regions;  // remote addresses of the regions it uses
  std::shared_ptr<Waiter> waiter;
};

// An active message's bytes, alive until UCX has sent them.
struct SendContext {
  Token token;  // the header
  std::string bytes;
};

// The acceptor's answer to a piece, alive until UCX has sent it; a read's
// answer is sent from the range itself, which stays mapped until then.
struct AnswerContext {
  class UcxTransport::Worker* worker = nullptr;
  uint64_t conn = 0;
  std::optional<uint64_t> range;  // the handle of the range a read's bytes come from
  wire::RoutedDataHeader header{};
  std::string bytes;  // a batched read's bytes, gathered
};

}  // namespace

class UcxTransport::Worker {
 public:
  ~Worker() { Stop(); }

  Status Init(NetOptions options);
  std::string listen_address() const { return listen_address_; }
  const NetOptions& options() const { return options_; }
  const std::string& worker_address() const { return worker_address_; }

  // Runs fn on the progress thread.
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      commands_.push_back(std::move(fn));
    }
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  // Runs fn on the progress thread, which finishes the waiter (also later).
  Status Ask(Clock::time_point deadline, std::function<void(std::shared_ptr<Waiter>)> fn) {
    auto w = std::make_shared<Waiter>();
    Post([w, fn = std::move(fn)] { fn(w); });
    return w->Wait(deadline);
  }

  // Progress-thread side of the public calls.
  void AddRegion(uint64_t handle, uintptr_t address, size_t length, bool read_only, const std::string& name,
                 int device, std::shared_ptr<Waiter> w);
  // The regions the remote of conn has announced (a connection we made).
  void RemoteRegions(uint64_t conn, std::vector<RegionInfo>* out, std::shared_ptr<Waiter> w);
  void RemoveRegion(uint64_t handle, Clock::time_point deadline, std::shared_ptr<Waiter> w);
  // A connection about to be dialed, known by its token from now on.
  void Expect(const std::string& text, Token token, Clock::time_point deadline, uint64_t* id, std::shared_ptr<Waiter> w);
  // The listener admitted it (Dial): its endpoint, then (or already) its Welcome.
  void Attach(uint64_t id, const Dialed& dialed, PeerInfo* info, std::shared_ptr<Waiter> w);
  void Close(uint64_t id, Clock::time_point deadline, std::shared_ptr<Waiter> w);
  void Transfer(uint64_t id, TransferOp op, const std::vector<TransferOpDesc>* descs, Clock::time_point deadline,
                std::shared_ptr<Waiter> w);
  void SendNotify(uint64_t id, const std::string& name, const std::string& message, Clock::time_point deadline,
                  std::shared_ptr<Waiter> w);

  void TakeNotifies(std::vector<ReceivedNotify>* out) {
    std::lock_guard<std::mutex> lk(mu_);
    out->insert(out->end(), notifies_.begin(), notifies_.end());
    notifies_.clear();
  }
  bool Broken(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    return broken_.count(id) != 0;
  }
  NetStats stats() {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  uint64_t changes() const { return changes_.load(std::memory_order_relaxed); }

 private:
  void Stop();
  void Loop();
  void RunCommands();
  void CheckDeadlines();
  void Reap();  // forgets the acceptor's broken connections
  Clock::time_point NextDeadline();

  void PollDoor(Clock::time_point now);
  void Admit(Admitted&& a);  // an engine passed the door: its endpoint, then Welcome
  // UCX callbacks (static trampolines).
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  static void OnRndvData(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnPieceSent(void* request, ucs_status_t status, void* user_data);
  static void OnAnswerSent(void* request, ucs_status_t status, void* user_data);
  static void OnCloseDone(void* request, ucs_status_t status, void* user_data);

  Conn* Find(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }
  Conn* FindByEp(ucp_ep_h ep) {
    auto it = by_ep_.find(ep);
    return it == by_ep_.end() ? nullptr : Find(it->second);
  }
  // The connection whose token starts an active message's header.
  Conn* FindByToken(const void* header, size_t length) {
    if (length < wire::kTokenBytes) return nullptr;
    Token t;
    std::memcpy(t.data(), header, t.size());
    auto it = by_token_.find(t);
    return it == by_token_.end() ? nullptr : Find(it->second);
  }
  // An endpoint to the peer's worker address.
  Status SetUpEp(Conn& c, const std::string& worker_address);
  void Send(Conn& c, const wire::Message& m);
  void Handle(Conn& c, wire::Message&& m);
  void HandleWelcome(Conn& c, wire::Welcome&& w);
  void FinishConnect(Conn& c);  // attached and welcomed
  Status AddRemoteRegion(Conn& c, const wire::Region& r);
  void RemoteRegionGone(Conn& c, uint64_t handle);
  void Acknowledged(uint64_t conn, uint64_t handle);
  // Marks c broken (outstanding work fails with st), closes its endpoint.
  // With goodbye, a ready connection tells its peer first, and its endpoint
  // closes once that is sent (a peer that stopped reading holds it until
  // UCX's keepalive gives up on it); without, it closes at once.
  void Break(Conn& c, Status st, bool goodbye = false);
  void CloseEp(ucp_ep_h ep, bool flush = false);
  void FinishJob(Job* job);
  // Sends the job's next pieces, up to the window; finishes it when nothing
  // is left in flight and nothing more will be sent.
  void Pump(Job* job);
  void SendPiece(Conn& c, Piece* p);
  // Sends the job's next small descriptors as one piece; false (nothing
  // sent) when fewer than two come next.
  bool SendBatch(Conn& c, Job* job);
  void Retire(Piece* p);  // forgets p once it is sent and answered
  // The acceptor's side of a piece: checked against the ranges c may use,
  // then written, or read and sent back.
  void Serve(Conn& c, const wire::DataHeader& h, const void* data, size_t length);
  void ServeBatch(Conn& c, const wire::DataHeader& h, const uint8_t* data, size_t length);
  // A piece into (from bytes) or out of (to a buffer) a device range, with
  // the engine's driver copy; RefuseDeviceCopy answers a failed one.
  Status MoveDevice(const LocalRegion& r, uintptr_t device_addr, const void* from, size_t n);
  Status MoveDevice(const LocalRegion& r, uintptr_t to, uint64_t device_addr, size_t n);
  void RefuseDeviceCopy(Conn& c, wire::DataHeader answer, const Status& why);
  // The range registered here that [address, address+length) lies in, if c
  // may use it so (not one whose deregistration it acknowledged, nor a
  // read-only one for a write).
  std::optional<uint64_t> RangeFor(const Conn& c, uint64_t address, uint64_t length, bool write) const;
  void SendAnswer(Conn& c, const wire::DataHeader& h, std::optional<uint64_t> range, const void* data,
                  std::string gathered = {});
  void AnswerSent(AnswerContext* ctx);
  // The connector's side: a piece's answer.
  void Answered(Conn& c, const wire::DataHeader& h, const void* data, size_t length);
  void Forget(uint64_t id);
  void TryUnmap(uint64_t handle);
  void Announced(uint64_t conn, uint64_t handle);  // conn knows the range (or is gone)
  void CountRefusal(std::string reason);          // stats, the change count and the (rate-limited) log
  std::vector<uint64_t> ReadyConnectors() const;   // connections accepted here and welcomed
  std::string Transports(ucp_ep_h ep);
  std::vector<wire::Region> Advertised() const;

  NetOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h recv_ = nullptr;  // where peers' endpoints end; its address is ours
  ucp_worker_h send_ = nullptr;  // where ours start
  std::string worker_address_;
  std::unique_ptr<Door> door_;  // with a listen address
  std::string listen_address_;
  ipc::UniqueFd epoll_, wake_;
  int worker_fds_[2] = {-1, -1};
  std::thread thread_;

  std::mutex mu_;  // commands_, stopping_, notifies_, stats_, broken_
  std::deque<std::function<void()>> commands_;
  bool stopping_ = false;
  std::deque<ReceivedNotify> notifies_;
  NetStats stats_;
  std::set<uint64_t> broken_;  // connections broken and not yet forgotten (Lost)
  std::atomic<uint64_t> changes_{0};

  // Progress thread only.
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<ucp_ep_h, uint64_t> by_ep_;
  std::map<Token, uint64_t> by_token_;
  Clock::time_point door_polled_{};
  Clock::time_point log_window_{};  // the minute refusals are logged in
  int logged_ = 0;                  // lines in it
  uint64_t unlogged_ = 0;           // refusals past the limit in it
  std::map<uint64_t, LocalRegion> regions_;  // by handle
  std::map<uintptr_t, uint64_t> by_address_;  // region address -> handle (the local side of transfers)
  std::map<Job*, std::unique_ptr<Job>> jobs_;
  std::set<void*> closing_;  // ucp_ep_close_nbx requests not yet done
};

Status UcxTransport::Worker::Init(NetOptions options) {
  options_ = std::move(options);
  // UCX reads its transports' options from the environment only, when the
  // worker is made; an operator's own settings win (setenv does not overwrite).
  //  - TCP segments of 128 KiB out and 512 KiB in, not 8 and 64: 1 MiB and
  //    larger transfers over TCP went from 1.2-1.4 to 5.7-6.2 GB/s on the
  //    two-host bench's veth, 4 KiB ones unchanged, RSS within 1 MiB.
  static std::once_flag env_once;
  std::call_once(env_once, [] {
    ::setenv("UCX_TCP_TX_SEG_SIZE", "128k", 0);
    ::setenv("UCX_TCP_RX_SEG_SIZE", "512k", 0);
  });
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("ucp_config_read", st);
  // Notice a peer whose link died within a few seconds, unless the operator
  // set it (UCX_KEEPALIVE_INTERVAL).
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // Active messages only, not UCP_FEATURE_RMA: over TCP UCX emulates RMA with
  // active messages that write or read any address a peer names, unchecked
  // (even a peer that never said hello), and it aborts the process when such
  // a message arrives on an endpoint that has failed. Our own data messages
  // are checked against the ranges registered for that peer.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "membroker";
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("ucp_init", st);
  // Two workers: every endpoint this engine makes starts at send_, and every
  // endpoint to it ends at recv_ (the address the handshake hands out). So
  // no two workers ever make endpoints to each other: UCX 1.13's TCP
  // transport crashed (a null handler, then heap corruption) when two engines
  // that had both made one reconnected after their link went down.
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches them
  for (ucp_worker_h* w : {&recv_, &send_}) {
    st = ucp_worker_create(context_, &wp, w);
    if (st != UCS_OK) return UcxError("ucp_worker_create", st);
  }
  for (int i = 0; i < 2; ++i) {
    st = ucp_worker_get_efd(i == 0 ? recv_ : send_, &worker_fds_[i]);
    if (st != UCS_OK) return UcxError("ucp_worker_get_efd", st);
  }
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &Worker::OnAm;
  am.arg = this;
  st = ucp_worker_set_am_recv_handler(recv_, &am);
  if (st != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", st);
  am.id = kDataAmId;
  am.cb = &Worker::OnData;
  st = ucp_worker_set_am_recv_handler(recv_, &am);
  if (st != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", st);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(recv_, &address, &address_length);
  if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(recv_, address);
  if (worker_address_.size() > handshake::kMaxWorkerAddressBytes)
    return Status(ErrorCode::kInternal, "UCX's worker address is " + std::to_string(worker_address_.size()) +
                                            " bytes, more than the handshake carries");

  if (!options_.listen.empty()) {
    MB_ASSIGN_OR_RETURN(SocketAddress addr, ParseHostPort(options_.listen, /*allow_any_port=*/true));
    MB_ASSIGN_OR_RETURN(door_, Door::Open(addr, DoorOptions{options_.engine_name, options_.secret,
                                                            options_.allow_from, worker_address_,
                                                            options_.handshake_timeout,
                                                            [this](std::string why) { CountRefusal(std::move(why)); }}));
    listen_address_ = door_->address();
  }

  epoll_ = ipc::UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = ipc::UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid()) return Status(ErrorCode::kResourceExhausted, "epoll or eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (int fd : {worker_fds_[0], worker_fds_[1], wake_.get(), door_ ? door_->fd() : -1}) {
    if (fd < 0) continue;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return Status(ErrorCode::kInternal, std::string("epoll_ctl: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void UcxTransport::Worker::Stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    Post([] {});
    thread_.join();
  }
  door_.reset();
  for (ucp_worker_h* w : {&send_, &recv_}) {
    if (*w != nullptr) ucp_worker_destroy(*w);
    *w = nullptr;
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

void UcxTransport::Worker::RunCommands() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lk(mu_);
    batch.swap(commands_);
  }
  for (auto& fn : batch) fn();
}

void UcxTransport::Worker::Loop() {
  Clock::time_point spin_until{};
  for (;;) {
    RunCommands();
    unsigned progressed = 0;
    while (unsigned n = ucp_worker_progress(recv_) + ucp_worker_progress(send_)) progressed += n;
    // While transfers run, and for a moment after the last event, poll instead
    // of sleeping: a wake-up through the event fd per TCP segment or emulated
    // get costs more than the message (an idle engine still sleeps).
    const auto now = Clock::now();
    if (progressed != 0 || !jobs_.empty()) spin_until = now + kSpinAfterActivity;
    PollDoor(now);
    CheckDeadlines();
    Reap();
    bool stopping;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping = stopping_ && commands_.empty();
    }
    if (stopping) break;
    if (now < spin_until) continue;
    if (ucp_worker_arm(recv_) == UCS_ERR_BUSY || ucp_worker_arm(send_) == UCS_ERR_BUSY) continue;  // more to progress first
    const auto next = NextDeadline();
    int timeout_ms = 1000;
    if (next != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
    }
    epoll_event events[4];
    if (::epoll_wait(epoll_.get(), events, 4, timeout_ms) > 0) door_polled_ = {};  // look at the door now
    uint64_t n;
    while (::read(wake_.get(), &n, sizeof(n)) == sizeof(n)) {
    }
  }
  // Shutting down: everything still open fails, every endpoint closes, every range unmaps.
  std::vector<uint64_t> ids;
  for (auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids)
    if (Conn* c = Find(id)) Break(*c, Status(ErrorCode::kNotConnected, "the engine is finalizing"), /*goodbye=*/true);
  const auto until = Clock::now() + std::chrono::seconds(2);
  while ((!closing_.empty() || !jobs_.empty()) && Clock::now() < until) {
    ucp_worker_progress(recv_);
    ucp_worker_progress(send_);
  }
  for (uint64_t id : ids) Forget(id);
  for (auto& [h, r] : regions_) {
    for (auto& [w, d] : r.waiters) w->Finish(Status::Ok());
    if (r.add_waiter) r.add_waiter->Finish(Status::Ok());
  }
  regions_.clear();
}

Clock::time_point UcxTransport::Worker::NextDeadline() {
  Clock::time_point next = Clock::time_point::max();
  if (door_) next = std::min(next, door_->NextDeadline());
  for (auto& [id, c] : conns_) {
    if (c->state == Conn::State::kHandshake) next = std::min(next, c->deadline);
    for (auto& [seq, n] : c->notifies) next = std::min(next, n.second);
  }
  for (auto& [j, owned] : jobs_) next = std::min(next, j->deadline);
  for (auto& [h, r] : regions_) {
    for (auto& [w, d] : r.waiters) next = std::min(next, d);
    if (r.add_waiter) next = std::min(next, r.add_deadline);
  }
  return next;
}

void UcxTransport::Worker::CheckDeadlines() {
  const auto now = Clock::now();
  std::vector<uint64_t> expired;
  for (auto& [id, c] : conns_) {
    if (c->state == Conn::State::kHandshake && now >= c->deadline) expired.push_back(id);
    for (auto it = c->notifies.begin(); it != c->notifies.end();) {
      if (now >= it->second.second) {
        it->second.first->Finish(Status(ErrorCode::kTimeout, "no answer to the notify from engine \"" +
                                                                 ipc::EscapeText(c->engine) + "\" in time"));
        it = c->notifies.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (uint64_t id : expired) {
    Conn* c = Find(id);
    if (c == nullptr) continue;
    Break(*c, Status(ErrorCode::kTimeout, "engine \"" + ipc::EscapeText(c->engine) + "\" at " + c->address +
                                              " admitted us but sent nothing over UCX in time (can UCX reach it "
                                              "from here?)"));
  }
  // A transfer past its deadline: the connection closes, which cancels what
  // is outstanding; the job ends TIMEOUT when the last request is back.
  std::vector<uint64_t> late;
  for (auto& [j, owned] : jobs_)
    if (now >= j->deadline && j->result.ok()) {
      j->result = Status(ErrorCode::kTimeout, "the transfer did not complete in time; its connection was closed "
                                              "(Disconnect, then Connect again)");
      late.push_back(j->conn);
    }
  for (uint64_t id : late)
    if (Conn* c = Find(id); c != nullptr && c->state != Conn::State::kBroken)
      Break(*c, Status(ErrorCode::kNotConnected, "the connection was closed after a transfer timed out "
                                                 "(Disconnect, then Connect again)"));
  for (auto& [h, r] : regions_)
    if (r.add_waiter && now >= r.add_deadline) {
      r.add_waiter->Finish(Status::Ok());  // slow connectors learn of it when the message arrives
      r.add_waiter.reset();
    }
  for (auto& [h, r] : regions_)
    for (auto it = r.waiters.begin(); it != r.waiters.end();) {
      if (now >= it->second) {
        it->first->Finish(Status(ErrorCode::kTimeout, "a remote engine still uses the range (it has not "
                                                      "acknowledged its deregistration); it stays registered "
                                                      "remotely until a later DeregisterMem sees it released"));
        it = r.waiters.erase(it);
      } else {
        ++it;
      }
    }
}

Status UcxTransport::Worker::SetUpEp(Conn& c, const std::string& worker_address) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Worker::OnEpError;
  params.err_handler.arg = this;
  ucs_status_t st = ucp_ep_create(send_, &params, &c.ep);
  if (st != UCS_OK) {
    c.ep = nullptr;
    return Status(ErrorCode::kNotConnected, "cannot reach the UCX worker of " + c.address + ": " +
                                                ucs_status_string(st));
  }
  by_ep_[c.ep] = c.id;
  return Status::Ok();
}

void UcxTransport::Worker::PollDoor(Clock::time_point now) {
  if (!door_ || (door_polled_ != Clock::time_point{} && now - door_polled_ < kDoorInterval &&
                 now < door_->NextDeadline()))
    return;
  door_polled_ = now;
  for (Admitted& a : door_->Poll(now)) Admit(std::move(a));
}

void UcxTransport::Worker::Admit(Admitted&& a) {
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->address = std::move(a.address);
  c->engine = std::move(a.engine);
  c->token = a.token;
  c->peer_token = a.peer_token;
  if (Status st = SetUpEp(*c, a.worker_address); !st.ok()) return CountRefusal(st.message());
  c->state = Conn::State::kReady;
  by_token_[c->token] = c->id;
  Conn& ref = *c;
  conns_[c->id] = std::move(c);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.accepted;
    stats_.connections = conns_.size();
  }
  changes_.fetch_add(1, std::memory_order_relaxed);
  Send(ref, wire::Welcome{options_.engine_name, options_.identity, Advertised()});
}

void UcxTransport::Worker::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Worker*>(arg);
  Conn* c = self->FindByEp(ep);
  if (c == nullptr) return;
  const bool handshake = c->state == Conn::State::kHandshake && c->outgoing;
  self->Break(*c, Status(ErrorCode::kNotConnected,
                         (handshake ? "could not connect to " : "lost the connection to ") +
                             (c->engine.empty() ? c->address : "engine \"" + ipc::EscapeText(c->engine) + "\" at " + c->address) +
                             ": " + ucs_status_string(status)));
}

void UcxTransport::Worker::CloseEp(ucp_ep_h ep, bool flush) {
  by_ep_.erase(ep);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  p.cb.send = &Worker::OnCloseDone;
  p.user_data = this;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r != nullptr && UCS_PTR_IS_PTR(r)) closing_.insert(r);
}

void UcxTransport::Worker::OnCloseDone(void* request, ucs_status_t, void* user_data) {
  auto* self = static_cast<Worker*>(user_data);
  self->closing_.erase(request);
  ucp_request_free(request);
}

void UcxTransport::Worker::Break(Conn& c, Status st, bool goodbye) {
  if (c.state == Conn::State::kBroken) return;
  goodbye = goodbye && c.state == Conn::State::kReady && c.ep != nullptr;
  if (goodbye) Send(c, wire::Goodbye{st.message()});
  c.state = Conn::State::kBroken;
  c.broken = st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    broken_.insert(c.id);
  }
  if (c.connect_waiter) {
    c.connect_waiter->Finish(st);
    c.connect_waiter.reset();
  }
  for (auto& [seq, n] : c.notifies) n.first->Finish(st);
  c.notifies.clear();
  // No piece in flight will be answered now; those UCX still sends end
  // (cancelled) through their callbacks when the endpoint closes below.
  for (Job* j : c.jobs)
    if (j->result.ok()) j->result = st;
  std::vector<Piece*> unanswered;
  for (auto& [tag, p] : c.pieces) unanswered.push_back(p);
  for (Piece* p : unanswered) {
    p->answered = true;
    Retire(p);
  }
  const std::vector<Job*> jobs(c.jobs.begin(), c.jobs.end());
  for (Job* j : jobs) Pump(j);  // ends those with nothing left in flight
  // The acceptor no longer waits for this connector's acknowledgements
  // (unmapped after the walk: TryUnmap erases from regions_).
  std::vector<uint64_t> released, announced;
  for (auto& [h, r] : regions_) {
    if (r.awaiting.erase(c.id)) released.push_back(h);
    if (r.announcing.count(c.id)) announced.push_back(h);
  }
  for (uint64_t h : announced) Announced(c.id, h);
  for (uint64_t h : released) TryUnmap(h);
  if (c.ep != nullptr) {
    ucp_ep_h ep = c.ep;
    c.ep = nullptr;
    CloseEp(ep, goodbye);  // outstanding requests complete (cancelled, or sent first) through their callbacks
  }
  // An acceptor's connection is forgotten by the loop (Reap); a connector's
  // stays, broken, until its owner calls Close, so its calls keep saying why.
}

void UcxTransport::Worker::Reap() {
  std::vector<uint64_t> dead;
  for (auto& [id, c] : conns_)
    if (!c->outgoing && c->state == Conn::State::kBroken && c->jobs.empty()) dead.push_back(id);
  for (uint64_t id : dead) Forget(id);
}

void UcxTransport::Worker::Forget(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (!c.jobs.empty()) return;  // the last job's completion forgets it
  if (c.ep != nullptr) CloseEp(c.ep);
  by_token_.erase(c.token);
  conns_.erase(it);
  std::lock_guard<std::mutex> lk(mu_);
  broken_.erase(id);
  stats_.connections = conns_.size();
  changes_.fetch_add(1, std::memory_order_relaxed);
}

void UcxTransport::Worker::Send(Conn& c, const wire::Message& m) {
  if (c.ep == nullptr) {
    if (c.outgoing && c.state != Conn::State::kBroken) c.unsent.push_back(m);  // sent once attached
    return;
  }
  auto* ctx = new SendContext{c.peer_token, wire::Encode(m)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Worker::OnSendDone;
  p.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_send_nbx(c.ep, kAmId, ctx->token.data(), ctx->token.size(), ctx->bytes.data(),
                                       ctx->bytes.size(), &p);
  if (r == nullptr) {
    delete ctx;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete ctx;
    Break(c, Status(ErrorCode::kNotConnected, std::string("sending to ") + c.address + " failed: " +
                                                  ucs_status_string(UCS_PTR_STATUS(r))));
  }
}

void UcxTransport::Worker::OnSendDone(void* request, ucs_status_t, void* user_data) {
  delete static_cast<SendContext*>(user_data);
  ucp_request_free(request);
}

namespace {
struct RndvContext {
  class UcxTransport::Worker* worker;
  uint64_t conn;
  std::vector<uint8_t> bytes;
};
}  // namespace

ucs_status_t UcxTransport::Worker::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                        size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Worker*>(arg);
  // Not from a connection we admitted: dropped (returning without receiving
  // rendezvous bytes drops them too).
  Conn* c = header_length == wire::kTokenBytes ? self->FindByToken(header, header_length) : nullptr;
  if (c == nullptr || c->state == Conn::State::kBroken) return UCS_OK;
  if (length > wire::kMaxMessageBytes) {
    self->Break(*c, Status(ErrorCode::kProtocolError, "a message from " + c->address + " is too large"));
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    auto* ctx = new RndvContext{self, c->id, std::vector<uint8_t>(length)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &Worker::OnRndvData;
    p.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->recv_, data, ctx->bytes.data(), length, &p);
    if (r == nullptr) {
      OnRndvData(nullptr, UCS_OK, length, ctx);
    } else if (UCS_PTR_IS_ERR(r)) {
      delete ctx;
    }
    return UCS_OK;
  }
  auto m = wire::Decode({static_cast<const uint8_t*>(data), length});
  if (!m.ok()) {
    self->Break(*c, Status(ErrorCode::kProtocolError, m.status().message() + " (" + c->address + ")"));
    return UCS_OK;
  }
  self->Handle(*c, std::move(*m));
  return UCS_OK;
}

void UcxTransport::Worker::OnRndvData(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<RndvContext*>(user_data);
  Worker* self = ctx->worker;
  if (request != nullptr) ucp_request_free(request);
  Conn* c = self->Find(ctx->conn);
  if (c != nullptr && c->state != Conn::State::kBroken && status == UCS_OK) {
    auto m = wire::Decode(ctx->bytes);
    if (m.ok())
      self->Handle(*c, std::move(*m));
    else
      self->Break(*c, Status(ErrorCode::kProtocolError, m.status().message() + " (" + c->address + ")"));
  }
  delete ctx;
}

void UcxTransport::Worker::Handle(Conn& c, wire::Message&& m) {
  const bool ready = c.state == Conn::State::kReady;
  auto unexpected = [&](const char* what) {
    Break(c, Status(ErrorCode::kProtocolError, std::string("an unexpected ") + what + " from " + c.address));
  };
  if (auto* g = std::get_if<wire::Goodbye>(&m))
    return Break(c, Status(ErrorCode::kNotConnected, "engine \"" + ipc::EscapeText(c.engine) + "\" at " + c.address +
                                                         " closed the connection: " + ipc::EscapeText(g->reason)));
  if (auto* w = std::get_if<wire::Welcome>(&m)) {
    if (!c.outgoing || c.state != Conn::State::kHandshake) return unexpected("welcome");
    return HandleWelcome(c, std::move(*w));
  }
  if (auto* a = std::get_if<wire::RegionAdded>(&m)) {
    if (!c.outgoing || !ready) return unexpected("region");
    if (Status st = AddRemoteRegion(c, a->region); !st.ok()) return Break(c, st);
    return Send(c, wire::RegionAddedAck{a->region.handle});
  }
  if (auto* g = std::get_if<wire::RegionGone>(&m)) {
    if (!c.outgoing || !ready) return unexpected("deregistration");
    return RemoteRegionGone(c, g->handle);
  }
  if (auto* g = std::get_if<wire::RegionAddedAck>(&m)) {
    if (c.outgoing || !ready) return unexpected("acknowledgement");
    return Announced(c.id, g->handle);
  }
  if (auto* g = std::get_if<wire::RegionGoneAck>(&m)) {
    if (c.outgoing || !ready) return unexpected("acknowledgement");
    return Acknowledged(c.id, g->handle);
  }
  if (auto* n = std::get_if<wire::Notify>(&m)) {
    if (c.outgoing || !ready) return unexpected("notify");
    wire::NotifyAck ack{n->seq, 0, ""};
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (notifies_.size() >= kMaxQueuedNotifies) {
        ack.code = static_cast<int32_t>(ErrorCode::kResourceExhausted);
        ack.message = "the engine's notify queue is full (256)";
      } else {
        notifies_.push_back(ReceivedNotify{c.engine, std::move(n->name), std::move(n->message)});
      }
    }
    if (ack.code == 0 && options_.on_notify) options_.on_notify();
    return Send(c, ack);
  }
  if (auto* a = std::get_if<wire::NotifyAck>(&m)) {
    if (!c.outgoing || !ready) return unexpected("notify answer");
    auto it = c.notifies.find(a->seq);
    if (it == c.notifies.end()) return;  // answered after its caller timed out
    const auto code = static_cast<ErrorCode>(a->code);
    it->second.first->Finish(code == ErrorCode::kOk ? Status::Ok()
                                                    : Status(code == ErrorCode::kResourceExhausted
                                                                 ? ErrorCode::kResourceExhausted
                                                                 : ErrorCode::kInternal,
                                                             ipc::EscapeText(a->message)));
    c.notifies.erase(it);
  }
}

void UcxTransport::Worker::CountRefusal(std::string reason) {
  const auto now = Clock::now();
  if (now - log_window_ >= std::chrono::minutes(1)) {
    if (unlogged_ != 0)
      std::fprintf(stderr, "membroker: engine \"%s\" refused %llu more connections in the last minute\n",
                   ipc::EscapeText(options_.engine_name).c_str(), static_cast<unsigned long long>(unlogged_));
    log_window_ = now;
    logged_ = 0;
    unlogged_ = 0;
  }
  if (logged_ < kRefusalLinesPerMinute) {
    ++logged_;
    std::fprintf(stderr, "membroker: engine \"%s\" refused a connection: %s%s\n",
                 ipc::EscapeText(options_.engine_name).c_str(), reason.c_str(),
                 logged_ == kRefusalLinesPerMinute ? " (no more such lines this minute)" : "");
  } else {
    ++unlogged_;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.refused;
    stats_.last_refusal = std::move(reason);
  }
  changes_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> UcxTransport::Worker::ReadyConnectors() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_)
    if (!c->outgoing && c->state == Conn::State::kReady) ids.push_back(id);
  return ids;
}

std::vector<wire::Region> UcxTransport::Worker::Advertised() const {
  std::vector<wire::Region> out;
  for (const auto& [h, r] : regions_)
    if (!r.removing) out.push_back(wire::Region{h, r.address, r.length, r.read_only, r.name});
  return out;
}

Status UcxTransport::Worker::AddRemoteRegion(Conn& c, const wire::Region& r) {
  // Ranges of one engine never overlap; one that does is a confused peer.
  auto next = c.regions.lower_bound(r.address);
  bool overlaps = next != c.regions.end() && next->first < r.address + r.length;
  if (next != c.regions.begin()) {
    auto prev = std::prev(next);
    overlaps = overlaps || prev->first + prev->second.length > r.address;
  }
  if (overlaps)
    return Status(ErrorCode::kProtocolError, "engine \"" + ipc::EscapeText(c.engine) + "\" announced overlapping ranges");
  c.regions[r.address] = RemoteRegion{r.handle, r.length, r.read_only, r.name, 0, false};
  return Status::Ok();
}

void UcxTransport::Worker::HandleWelcome(Conn& c, wire::Welcome&& w) {
  c.engine = w.engine;
  for (const wire::Region& r : w.regions)
    if (Status st = AddRemoteRegion(c, r); !st.ok()) return Break(c, st);
  c.identity = w.identity;
  c.state = Conn::State::kReady;
  c.deadline = Clock::time_point::max();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.connections = conns_.size();
  }
  if (c.ep != nullptr) FinishConnect(c);  // else Attach does
}

void UcxTransport::Worker::FinishConnect(Conn& c) {
  if (c.connect_info != nullptr) {
    c.connect_info->engine = c.engine;
    c.connect_info->identity = c.identity;
    c.connect_info->address = c.address;
    c.connect_info->transports = Transports(c.ep);
  }
  if (c.connect_waiter) {
    c.connect_waiter->Finish(Status::Ok());
    c.connect_waiter.reset();
  }
}

void UcxTransport::Worker::RemoteRegionGone(Conn& c, uint64_t handle) {
  for (auto it = c.regions.begin(); it != c.regions.end(); ++it) {
    if (it->second.handle != handle) continue;
    it->second.gone = true;
    if (it->second.users > 0) return;  // acknowledged when its last transfer ends
    c.regions.erase(it);
    break;
  }
  Send(c, wire::RegionGoneAck{handle});  // also for a range it never knew: nothing in use
}

void UcxTransport::Worker::Acknowledged(uint64_t conn, uint64_t handle) {
  auto it = regions_.find(handle);
  if (it == regions_.end() || !it->second.awaiting.erase(conn)) return;
  TryUnmap(handle);
}

void UcxTransport::Worker::TryUnmap(uint64_t handle) {
  auto it = regions_.find(handle);
  if (it == regions_.end() || !it->second.removing || !it->second.awaiting.empty() || it->second.sending > 0) return;
  for (auto& [w, d] : it->second.waiters) w->Finish(Status::Ok());
  if (it->second.add_waiter) it->second.add_waiter->Finish(Status::Ok());
  by_address_.erase(it->second.address);
  regions_.erase(it);
}

std::string UcxTransport::Worker::Transports(ucp_ep_h ep) {
  // UCX 1.13 has no query for an endpoint's transports; its printed
  // configuration has one line per lane: "lane[0]:  0:tcp/eth0.0 md[0] -> ...".
  char* text = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&text, &size);
  if (f == nullptr) return "ucx (transports not reported)";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  const std::string all(text, size);
  std::free(text);
  std::string out;
  std::set<std::string> seen;
  for (size_t pos = all.find("lane["); pos != std::string::npos; pos = all.find("lane[", pos + 1)) {
    size_t colon = all.find(':', all.find(']', pos));  // after "lane[N]"
    colon = colon == std::string::npos ? colon : all.find(':', colon + 1);  // after the lane's index
    if (colon == std::string::npos) break;
    size_t end = all.find_first_of(" \n", colon + 1);
    std::string device = all.substr(colon + 1, end - colon - 1);
    if (!device.empty() && seen.insert(device).second) out += (out.empty() ? "" : ",") + device;
  }
  return out.empty() ? "ucx (transports not reported)" : out;
}

// --- the public calls, on the progress thread -------------------------------

void UcxTransport::Worker::AddRegion(uint64_t handle, uintptr_t address, size_t length, bool read_only,
                                     const std::string& name, int device, std::shared_ptr<Waiter> w) {
  LocalRegion r;
  r.address = address;
  r.length = length;
  r.read_only = read_only;
  r.name = name;
  r.device = device;
  wire::RegionAdded added{wire::Region{handle, address, length, read_only, name}};
  const std::vector<uint64_t> told = ReadyConnectors();
  r.announcing.insert(told.begin(), told.end());
  r.add_waiter = std::move(w);
  r.add_deadline = Clock::now() + kAnnounceWait;
  regions_[handle] = std::move(r);
  by_address_[address] = handle;
  for (uint64_t id : told)
    if (Conn* c = Find(id)) Send(*c, added);  // a failed send breaks c, which stops awaiting it
  Announced(0, handle);  // finishes at once when nobody is connected
}

void UcxTransport::Worker::Announced(uint64_t conn, uint64_t handle) {
  auto it = regions_.find(handle);
  if (it == regions_.end()) return;
  it->second.announcing.erase(conn);
  if (it->second.announcing.empty() && it->second.add_waiter) {
    it->second.add_waiter->Finish(Status::Ok());
    it->second.add_waiter.reset();
  }
}

void UcxTransport::Worker::RemoveRegion(uint64_t handle, Clock::time_point deadline, std::shared_ptr<Waiter> w) {
  auto it = regions_.find(handle);
  if (it == regions_.end()) return w->Finish(Status::Ok());
  if (!it->second.removing) {
    it->second.removing = true;
    const std::vector<uint64_t> told = ReadyConnectors();
    it->second.awaiting.insert(told.begin(), told.end());
    // A send that fails breaks its connection, which stops awaiting it (and may
    // unmap the range): look the range up again afterwards.
    for (uint64_t id : told)
      if (Conn* c = Find(id)) Send(*c, wire::RegionGone{handle});
    it = regions_.find(handle);
    if (it == regions_.end()) return w->Finish(Status::Ok());
  }
  it->second.waiters.emplace_back(std::move(w), deadline);
  TryUnmap(handle);
}

void UcxTransport::Worker::Expect(const std::string& text, Token token, Clock::time_point deadline, uint64_t* id,
                                  std::shared_ptr<Waiter> w) {
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->outgoing = true;
  c->address = text;
  c->token = token;
  c->deadline = deadline;
  *id = c->id;
  by_token_[c->token] = c->id;
  conns_[c->id] = std::move(c);
  w->Finish(Status::Ok());
}

void UcxTransport::Worker::Attach(uint64_t id, const Dialed& dialed, PeerInfo* info, std::shared_ptr<Waiter> w) {
  Conn* c = Find(id);
  if (c == nullptr || c->state == Conn::State::kBroken)
    return w->Finish(c != nullptr ? c->broken : Status(ErrorCode::kNotConnected, "not connected"));
  if (c->engine.empty()) c->engine = dialed.engine;  // its Welcome says it too
  c->peer_token = dialed.token;
  if (Status st = SetUpEp(*c, dialed.worker_address); !st.ok()) {
    Break(*c, st);
    return w->Finish(st);
  }
  for (const wire::Message& m : std::exchange(c->unsent, {})) Send(*c, m);
  c->connect_waiter = std::move(w);
  c->connect_info = info;
  if (c->state == Conn::State::kReady) FinishConnect(*c);  // the Welcome came first
}

void UcxTransport::Worker::Close(uint64_t id, Clock::time_point deadline, std::shared_ptr<Waiter> w) {
  Conn* c = Find(id);
  if (c == nullptr) return w->Finish(Status::Ok());
  if (!c->jobs.empty() && Clock::now() < deadline) {
    // Its transfers end by their own deadlines: look again soon.
    Post([this, id, deadline, w] { Close(id, deadline, w); });
    return;
  }
  if (!c->jobs.empty())
    return w->Finish(Status(ErrorCode::kTimeout, "transfers to \"" + ipc::EscapeText(c->engine) +
                                                     "\" still running after the timeout"));
  Break(*c, Status(ErrorCode::kNotConnected, "disconnected"), /*goodbye=*/true);
  Forget(id);
  w->Finish(Status::Ok());
}

void UcxTransport::Worker::Transfer(uint64_t id, TransferOp op, const std::vector<TransferOpDesc>* descs,
                                    Clock::time_point deadline, std::shared_ptr<Waiter> w) {
  Conn* c = Find(id);
  if (c == nullptr) return w->Finish(Status(ErrorCode::kNotConnected, "not connected"));
  if (c->state != Conn::State::kReady) return w->Finish(c->broken.ok() ? Status(ErrorCode::kNotConnected, "not connected") : c->broken);
  // Every descriptor against the remote's ranges before a byte moves.
  auto owned = std::make_unique<Job>();
  Job* job = owned.get();
  std::vector<std::map<uint64_t, RemoteRegion>::iterator> used;
  for (size_t i = 0; i < descs->size(); ++i) {
    const TransferOpDesc& d = (*descs)[i];
    auto it = c->regions.upper_bound(d.remote_addr);
    bool inside = it != c->regions.begin();
    if (inside) {
      --it;
      inside = !it->second.gone && d.remote_addr + d.len >= d.remote_addr &&
               d.remote_addr + d.len <= it->first + it->second.length;
    }
    if (!inside)
      return w->Finish(Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                            ": remote range is not inside memory engine \"" +
                                                            ipc::EscapeText(c->engine) + "\" registered"));
    if (op == WRITE && it->second.read_only)
      return w->Finish(Status(ErrorCode::kParamInvalid, "descriptor " + std::to_string(i) +
                                                            ": remote range is read-only for its owner"));
    if (std::find(used.begin(), used.end(), it) == used.end()) used.push_back(it);
  }
  job->worker = this;
  job->conn = id;
  job->op = op;
  job->deadline = deadline;
  job->waiter = std::move(w);
  job->descs = *descs;
  for (auto it : used) {
    job->regions.push_back(it->first);
    ++it->second.users;  // a RegionGone for it waits until this job ends
  }
  jobs_.emplace(job, std::move(owned));
  c->jobs.insert(job);
  Pump(job);
}

void UcxTransport::Worker::Pump(Job* job) {
  Conn* c = Find(job->conn);
  if ((c == nullptr || c->state != Conn::State::kReady || c->ep == nullptr) && job->result.ok())
    job->result = Status(ErrorCode::kNotConnected, "the connection closed");
  while (job->result.ok() && job->next < job->descs.size() && job->in_flight.size() < kWindowPieces &&
         job->bytes_in_flight < kWindowBytes) {
    const TransferOpDesc& d = job->descs[job->next];
    if (job->next_offset == 0 && d.len != 0 && d.len <= kBatchBytes && SendBatch(*c, job)) continue;
    const uint64_t offset = job->next_offset;
    const uint64_t length = std::min<uint64_t>(kPieceBytes, d.len - offset);
    job->next_offset += length;
    if (job->next_offset >= d.len) {
      ++job->next;
      job->next_offset = 0;
    }
    if (length == 0) continue;  // an empty descriptor moves nothing
    auto piece = std::make_unique<Piece>();
    Piece* p = piece.get();
    p->job = job;
    p->tag = c->next_tag++;
    p->ranges = {{d.local_addr + offset, wire::Segment{d.remote_addr + offset, length}}};
    p->length = length;
    job->in_flight[p->tag] = std::move(piece);
    c->pieces[p->tag] = p;
    job->bytes_in_flight += length;
    SendPiece(*c, p);
  }
  if (job->in_flight.empty() && (job->next == job->descs.size() || !job->result.ok())) FinishJob(job);
}

bool UcxTransport::Worker::SendBatch(Conn& c, Job* job) {
  size_t end = job->next;
  uint64_t total = 0;
  while (end < job->descs.size() && end - job->next < wire::kMaxSegments && job->descs[end].len != 0 &&
         job->descs[end].len <= kBatchBytes && total + job->descs[end].len <= kBatchMessageBytes)
    total += job->descs[end++].len;
  if (end - job->next < 2) return false;
  auto piece = std::make_unique<Piece>();
  Piece* p = piece.get();
  p->job = job;
  p->tag = c.next_tag++;
  p->length = total;
  std::vector<wire::Segment> table;
  for (size_t i = job->next; i < end; ++i) {
    const TransferOpDesc& d = job->descs[i];
    p->ranges.push_back({d.local_addr, wire::Segment{d.remote_addr, d.len}});
    table.push_back(wire::Segment{d.remote_addr, d.len});
  }
  p->batch_bytes = wire::EncodeSegments(table);
  if (job->op == WRITE)
    for (const auto& [local, seg] : p->ranges)
      p->batch_bytes.append(reinterpret_cast<const char*>(local), seg.length);
  job->next = end;
  job->in_flight[p->tag] = std::move(piece);
  c.pieces[p->tag] = p;
  job->bytes_in_flight += total;
  SendPiece(c, p);
  return true;
}

void UcxTransport::Worker::SendPiece(Conn& c, Piece* p) {
  const bool write = p->job->op == WRITE;
  const bool batch = p->ranges.size() > 1;
  using K = wire::DataKind;
  p->header = wire::EncodeRouted(
      c.peer_token, batch ? wire::DataHeader{write ? K::kWriteV : K::kReadV, 0, p->tag, p->ranges.size(), p->length}
            : wire::DataHeader{write ? K::kWrite : K::kReadRequest, 0, p->tag, p->ranges[0].second.address,
                               p->length});
  void* data = batch ? p->batch_bytes.data() : write ? reinterpret_cast<void*>(p->ranges[0].first) : nullptr;
  const size_t bytes = batch ? p->batch_bytes.size() : write ? p->length : 0;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.flags = UCP_AM_SEND_FLAG_EAGER;
  prm.cb.send = &Worker::OnPieceSent;
  prm.user_data = p;
  // Sending while in the call: UCX may report the endpoint's failure from
  // inside it (a peer just killed), and the Break that follows retires every
  // piece of the connection; this one must outlive the call (CI saw a
  // SIGSEGV here when it did not).
  p->sending = true;
  ucs_status_ptr_t r = ucp_am_send_nbx(c.ep, kDataAmId, p->header.data(), p->header.size(), data, bytes, &prm);
  if (UCS_PTR_IS_PTR(r)) return;  // OnPieceSent ends it
  p->sending = false;
  if (UCS_PTR_IS_ERR(r)) {
    if (p->job->result.ok())
      p->job->result = Status(ErrorCode::kNotConnected,
                              std::string("UCX refused the transfer: ") + ucs_status_string(UCS_PTR_STATUS(r)));
    p->answered = true;  // it never left
  }
  Retire(p);  // gone if it never left, or if a Break during the call answered it
}

void UcxTransport::Worker::OnPieceSent(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Piece*>(user_data);
  ucp_request_free(request);
  Job* job = p->job;
  p->sending = false;
  if (status != UCS_OK) {
    if (job->result.ok())
      job->result = Status(ErrorCode::kNotConnected, std::string("the transfer failed: ") + ucs_status_string(status));
    p->answered = true;  // its connection failed: no answer will come
  }
  Worker* self = job->worker;
  self->Retire(p);
  self->Pump(job);
}

void UcxTransport::Worker::Retire(Piece* p) {
  if (p->sending || !p->answered) return;
  Job* job = p->job;
  if (Conn* c = Find(job->conn)) c->pieces.erase(p->tag);
  job->bytes_in_flight -= p->length;
  job->in_flight.erase(p->tag);  // destroys p
}

ucs_status_t UcxTransport::Worker::OnData(void* arg, const void* header, size_t header_length, void* data,
                                          size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Worker*>(arg);
  Conn* c = self->FindByToken(header, header_length);
  if (c == nullptr || c->state == Conn::State::kBroken) return UCS_OK;  // not from a connection we admitted
  auto protocol_error = [&](const std::string& what) {
    self->Break(*c, Status(ErrorCode::kProtocolError, what + " from " + c->address));
    return UCS_OK;
  };
  auto h = wire::DecodeData({static_cast<const uint8_t*>(header) + wire::kTokenBytes, header_length - wire::kTokenBytes});
  if (!h.ok()) return protocol_error(h.status().message());
  // Our pieces always fit one eager message: bytes by rendezvous are not ours
  // (returning without receiving them drops them).
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return protocol_error("a transfer's bytes by rendezvous");
  const bool asks = h->kind != wire::DataKind::kWriteAck && h->kind != wire::DataKind::kReadData;
  // Only a connection accepted here may touch our memory;
  // only our own connections get answers.
  if (c->state != Conn::State::kReady || c->outgoing == asks) return protocol_error("an unexpected transfer message");
  if (asks)
    self->Serve(*c, *h, data, length);
  else
    self->Answered(*c, *h, data, length);
  return UCS_OK;
}

std::optional<uint64_t> UcxTransport::Worker::RangeFor(const Conn& c, uint64_t address, uint64_t length,
                                                       bool write) const {
  auto it = by_address_.upper_bound(address);
  if (it == by_address_.begin()) return std::nullopt;
  const uint64_t handle = std::prev(it)->second;
  const LocalRegion& r = regions_.at(handle);
  const bool allowed = address + length <= r.address + r.length && (!r.removing || r.awaiting.count(c.id) != 0) &&
                       !(write && r.read_only);
  return allowed ? std::optional<uint64_t>(handle) : std::nullopt;
}

void UcxTransport::Worker::Serve(Conn& c, const wire::DataHeader& h, const void* data, size_t length) {
  if (h.kind == wire::DataKind::kWriteV || h.kind == wire::DataKind::kReadV)
    return ServeBatch(c, h, static_cast<const uint8_t*>(data), length);
  const bool write = h.kind == wire::DataKind::kWrite;
  if (length != (write ? h.length : 0))
    return Break(c, Status(ErrorCode::kProtocolError, "a transfer message whose bytes do not match its header from " +
                                                          c.address));
  const std::optional<uint64_t> range = RangeFor(c, h.address, h.length, write);
  wire::DataHeader answer{write ? wire::DataKind::kWriteAck : wire::DataKind::kReadData, 0, h.tag, h.address,
                          h.length};
  if (!range) {
    answer.code = static_cast<int32_t>(ErrorCode::kParamInvalid);
    answer.length = 0;
    return SendAnswer(c, answer, std::nullopt, nullptr);
  }
  const LocalRegion& r = regions_.at(*range);
  if (r.device >= 0) {  // device memory: through the driver, the message's bytes being the staging
    std::string staged;
    if (!write) staged.resize(h.length);
    Status st = write ? MoveDevice(r, h.address, data, h.length)
                      : MoveDevice(r, reinterpret_cast<uintptr_t>(staged.data()), h.address, h.length);
    if (!st.ok()) return RefuseDeviceCopy(c, answer, st);
    return SendAnswer(c, answer, std::nullopt, nullptr, std::move(staged));
  }
  if (write) {
    std::memcpy(reinterpret_cast<void*>(h.address), data, h.length);
    return SendAnswer(c, answer, std::nullopt, nullptr);
  }
  SendAnswer(c, answer, range, reinterpret_cast<const void*>(h.address));
}

Status UcxTransport::Worker::MoveDevice(const LocalRegion& r, uintptr_t device_addr, const void* from, size_t n) {
  if (!options_.device_copy) return Status(ErrorCode::kUnsupported, "no device copy");
  return options_.device_copy(device_addr, true, reinterpret_cast<uintptr_t>(from), false, n, r.device);
}

Status UcxTransport::Worker::MoveDevice(const LocalRegion& r, uintptr_t to, uint64_t device_addr, size_t n) {
  if (!options_.device_copy) return Status(ErrorCode::kUnsupported, "no device copy");
  return options_.device_copy(to, false, device_addr, true, n, r.device);
}

// The asker hears INTERNAL: the range was ours, the driver's copy failed
// (its text stays here: a peer learns nothing of this process's driver).
void UcxTransport::Worker::RefuseDeviceCopy(Conn& c, wire::DataHeader answer, const Status&) {
  answer.code = static_cast<int32_t>(ErrorCode::kInternal);
  answer.length = 0;
  SendAnswer(c, answer, std::nullopt, nullptr);
}

void UcxTransport::Worker::ServeBatch(Conn& c, const wire::DataHeader& h, const uint8_t* data, size_t length) {
  const bool write = h.kind == wire::DataKind::kWriteV;
  const size_t table = h.address * wire::kSegmentBytes;
  auto segments = wire::DecodeSegments({data, length}, h.address, h.length);
  if (!segments.ok() || length != table + (write ? h.length : 0))
    return Break(c, Status(ErrorCode::kProtocolError, "a malformed batch from " + c.address));
  wire::DataHeader answer{write ? wire::DataKind::kWriteAck : wire::DataKind::kReadData, 0, h.tag, 0, h.length};
  // All or nothing: every segment is checked before a byte moves.
  for (const wire::Segment& s : *segments)
    if (!RangeFor(c, s.address, s.length, write)) {
      answer.code = static_cast<int32_t>(ErrorCode::kParamInvalid);
      answer.length = 0;
      return SendAnswer(c, answer, std::nullopt, nullptr);
    }
  if (write) {
    const uint8_t* from = data + table;
    for (const wire::Segment& s : *segments) {
      const LocalRegion& r = regions_.at(*RangeFor(c, s.address, s.length, write));
      if (r.device < 0)
        std::memcpy(reinterpret_cast<void*>(s.address), from, s.length);
      else if (Status st = MoveDevice(r, s.address, from, s.length); !st.ok())
        return RefuseDeviceCopy(c, answer, st);
      from += s.length;
    }
    return SendAnswer(c, answer, std::nullopt, nullptr);
  }
  std::string gathered;
  gathered.reserve(h.length);
  for (const wire::Segment& s : *segments) {
    const LocalRegion& r = regions_.at(*RangeFor(c, s.address, s.length, write));
    if (r.device < 0) {
      gathered.append(reinterpret_cast<const char*>(s.address), s.length);
      continue;
    }
    const size_t at = gathered.size();
    gathered.resize(at + s.length);
    if (Status st = MoveDevice(r, reinterpret_cast<uintptr_t>(gathered.data() + at), s.address, s.length); !st.ok())
      return RefuseDeviceCopy(c, answer, st);
  }
  SendAnswer(c, answer, std::nullopt, nullptr, std::move(gathered));
}

void UcxTransport::Worker::SendAnswer(Conn& c, const wire::DataHeader& h, std::optional<uint64_t> range,
                                      const void* data, std::string gathered) {
  if (c.answers_in_flight >= kMaxAnswersInFlight)
    return Break(c, Status(ErrorCode::kResourceExhausted,
                           c.address + " asked for more than " + std::to_string(kMaxAnswersInFlight) +
                               " pieces without reading the answers"));
  auto* ctx = new AnswerContext{this, c.id, range, wire::EncodeRouted(c.peer_token, h), std::move(gathered)};
  if (!ctx->bytes.empty()) data = ctx->bytes.data();
  ++c.answers_in_flight;
  if (range) ++regions_.at(*range).sending;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.flags = UCP_AM_SEND_FLAG_EAGER;
  prm.cb.send = &Worker::OnAnswerSent;
  prm.user_data = ctx;
  const size_t bytes = data != nullptr ? h.length : 0;
  ucs_status_ptr_t r = ucp_am_send_nbx(c.ep, kDataAmId, ctx->header.data(), ctx->header.size(), const_cast<void*>(data),
                                       bytes, &prm);
  if (UCS_PTR_IS_PTR(r)) return;
  AnswerSent(ctx);
  if (UCS_PTR_IS_ERR(r))
    Break(c, Status(ErrorCode::kNotConnected, std::string("answering ") + c.address + " failed: " +
                                                  ucs_status_string(UCS_PTR_STATUS(r))));
}

void UcxTransport::Worker::OnAnswerSent(void* request, ucs_status_t, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<AnswerContext*>(user_data);
  ctx->worker->AnswerSent(ctx);
}

void UcxTransport::Worker::AnswerSent(AnswerContext* ctx) {
  if (Conn* c = Find(ctx->conn)) --c->answers_in_flight;
  if (ctx->range) {
    auto it = regions_.find(*ctx->range);
    if (it != regions_.end()) {
      --it->second.sending;
      TryUnmap(*ctx->range);
    }
  }
  delete ctx;
}

void UcxTransport::Worker::Answered(Conn& c, const wire::DataHeader& h, const void* data, size_t length) {
  auto it = c.pieces.find(h.tag);
  Piece* p = it == c.pieces.end() ? nullptr : it->second;
  const wire::DataKind expected = p == nullptr ? wire::DataKind::kWrite
                                  : p->job->op == WRITE ? wire::DataKind::kWriteAck
                                                        : wire::DataKind::kReadData;
  if (p == nullptr || p->answered || h.kind != expected)
    return Break(c, Status(ErrorCode::kProtocolError, "an answer that matches no transfer in flight from " + c.address));
  Job* job = p->job;
  if (h.code == static_cast<int32_t>(ErrorCode::kInternal)) {
    if (job->result.ok())
      job->result = Status(ErrorCode::kInternal, "engine \"" + ipc::EscapeText(c.engine) +
                                                     "\" could not copy into or out of its device memory "
                                                     "(its CUDA driver refused the copy)");
  } else if (h.code != 0) {
    if (job->result.ok())
      job->result = Status(ErrorCode::kParamInvalid,
                           "engine \"" + ipc::EscapeText(c.engine) + "\" refused the transfer at " +
                               (p->ranges.size() == 1 ? "its address " + ipc::Hex(p->ranges[0].second.address)
                                                      : "one of " + std::to_string(p->ranges.size()) +
                                                            " ranges from " + ipc::Hex(p->ranges[0].second.address)) +
                               ": not inside memory it registered for this engine");
  } else if (length != (job->op == READ ? p->length : 0) || h.length != p->length) {
    return Break(c, Status(ErrorCode::kProtocolError, "an answer of the wrong size from " + c.address));
  } else if (job->op == READ) {
    const char* from = static_cast<const char*>(data);  // each range's bytes in turn
    for (const auto& [local, seg] : p->ranges) {
      std::memcpy(reinterpret_cast<void*>(local), from, seg.length);
      from += seg.length;
    }
  }
  p->answered = true;
  Retire(p);
  Pump(job);
}

void UcxTransport::Worker::FinishJob(Job* job) {
  Conn* c = Find(job->conn);
  if (c != nullptr) {
    c->jobs.erase(job);
    for (uint64_t addr : job->regions) {
      auto it = c->regions.find(addr);
      if (it == c->regions.end()) continue;
      if (--it->second.users == 0 && it->second.gone) {
        const uint64_t handle = it->second.handle;
        c->regions.erase(it);
        Send(*c, wire::RegionGoneAck{handle});
      }
    }
  }
  job->waiter->Finish(job->result);
  jobs_.erase(job);
}

void UcxTransport::Worker::SendNotify(uint64_t id, const std::string& name, const std::string& message,
                                      Clock::time_point deadline, std::shared_ptr<Waiter> w) {
  Conn* c = Find(id);
  if (c == nullptr) return w->Finish(Status(ErrorCode::kNotConnected, "not connected"));
  if (c->state != Conn::State::kReady) return w->Finish(c->broken.ok() ? Status(ErrorCode::kNotConnected, "not connected") : c->broken);
  const uint64_t seq = c->next_seq++;
  c->notifies[seq] = {w, deadline};
  Send(*c, wire::Notify{seq, name, message});
}

void UcxTransport::Worker::RemoteRegions(uint64_t id, std::vector<RegionInfo>* out, std::shared_ptr<Waiter> w) {
  Conn* c = Find(id);
  if (c == nullptr) return w->Finish(Status(ErrorCode::kNotConnected, "not connected"));
  if (c->state != Conn::State::kReady) return w->Finish(c->broken.ok() ? Status(ErrorCode::kNotConnected, "not connected") : c->broken);
  for (const auto& [address, r] : c->regions)
    if (!r.gone) out->push_back(RegionInfo{r.name, address, r.length, r.read_only});
  w->Finish(Status::Ok());
}

// --- UcxTransport ----------------------------------------------------------

Result<std::unique_ptr<UcxTransport>> UcxTransport::Start(NetOptions options) {
  auto worker = std::make_unique<Worker>();
  MB_RETURN_IF_ERROR(worker->Init(std::move(options)));
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(worker)));
}

UcxTransport::UcxTransport(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}
UcxTransport::~UcxTransport() = default;

std::string UcxTransport::listen_address() const { return worker_->listen_address(); }

Status UcxTransport::AddRegion(const RegionDesc& r) {
  return worker_->Ask(Clock::now(), [=, this](std::shared_ptr<Waiter> w) {
    worker_->AddRegion(r.handle, r.address, r.length, r.read_only, r.name, r.device, std::move(w));
  });
}

Status UcxTransport::RemoveRegion(uint64_t handle, Clock::time_point deadline) {
  return worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) { worker_->RemoveRegion(handle, deadline, std::move(w)); });
}

Result<uint64_t> UcxTransport::Connect(const std::string& address, Clock::time_point deadline, PeerInfo* info) {
  MB_ASSIGN_OR_RETURN(SocketAddress addr, ParseHostPort(address));
  // The connection is known by its token first; the handshake runs on this
  // thread; the progress thread then only makes the endpoint.
  const Token token = handshake::Random<16>();
  auto id = std::make_shared<uint64_t>(0);
  MB_RETURN_IF_ERROR(worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) {
    worker_->Expect(address, token, deadline, id.get(), std::move(w));
  }));
  const NetOptions& o = worker_->options();
  auto dialed = Dial(addr, address, deadline, DialRequest{o.secret, o.engine_name, worker_->worker_address(), token});
  Status st = dialed.status();
  auto out = std::make_shared<PeerInfo>();
  if (st.ok())
    st = worker_->Ask(deadline, [=, this, d = *dialed](std::shared_ptr<Waiter> w) {
      worker_->Attach(*id, d, out.get(), std::move(w));
    });
  if (!st.ok()) {
    (void)Close(*id, Clock::now());
    return st;
  }
  *info = *out;
  return *id;
}

Status UcxTransport::Close(uint64_t conn, Clock::time_point deadline) {
  return worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) { worker_->Close(conn, deadline, std::move(w)); });
}

Status UcxTransport::Transfer(uint64_t conn, TransferOp op, const std::vector<TransferOpDesc>& descs,
                              Clock::time_point deadline) {
  // The job keeps its own copy: a caller that gave up must not leave it dangling.
  auto copy = std::make_shared<std::vector<TransferOpDesc>>(descs);
  return worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) {
    worker_->Transfer(conn, op, copy.get(), deadline, std::move(w));
  });
}

Status UcxTransport::SendNotify(uint64_t conn, const std::string& name, const std::string& message,
                                Clock::time_point deadline) {
  return worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) {
    worker_->SendNotify(conn, name, message, deadline, std::move(w));
  });
}

bool UcxTransport::Lost(uint64_t conn) { return worker_->Broken(conn); }

Status UcxTransport::RemoteRegions(uint64_t conn, Clock::time_point deadline, std::vector<RegionInfo>* out) {
  // The worker fills its own copy: a caller that gave up must not leave it dangling.
  auto got = std::make_shared<std::vector<RegionInfo>>();
  MB_RETURN_IF_ERROR(worker_->Ask(deadline, [=, this](std::shared_ptr<Waiter> w) {
    worker_->RemoteRegions(conn, got.get(), std::move(w));
  }));
  *out = std::move(*got);
  return Status::Ok();
}

Status UcxTransport::TakeNotifies(std::vector<ReceivedNotify>* out) {
  worker_->TakeNotifies(out);
  return Status::Ok();
}
NetStats UcxTransport::stats() { return worker_->stats(); }
uint64_t UcxTransport::changes() const { return worker_->changes(); }

}  // namespace membroker::detail
