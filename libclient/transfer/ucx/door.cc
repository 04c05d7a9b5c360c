#include "transfer/ucx/door.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "membroker/ipc/escape.h"

namespace membroker::detail {

namespace {
constexpr int kAcceptsPerPoll = 64;  // then the rest of the loop gets its turn
constexpr auto kPauseWhenOutOfFds = std::chrono::milliseconds(100);
}  // namespace

struct Door::Waiting {
  ipc::UniqueFd fd;
  std::string address;
  sockaddr_storage peer{};
  Clock::time_point deadline;
  handshake::Nonce nonce{};
  handshake::FrameReader in;
  std::string out;  // what is still to be written, from `sent` on
  size_t sent = 0;
  enum class Stage { kProving, kAdmitting, kRefusing } stage = Stage::kProving;
  std::optional<Admitted> admitted;  // reported once its acceptance is written
};

Result<std::unique_ptr<Door>> Door::Open(const SocketAddress& address, DoorOptions options) {
  const std::string text = FormatAddress(address.get());
  auto fail = [&](ErrorCode code) {
    return Status(code, "cannot listen on " + text + ": " + std::strerror(errno) +
                            " (the address must be one of this host's, and the port free)");
  };
  ipc::UniqueFd fd(::socket(address.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fail(ErrorCode::kResourceExhausted);
  // An engine that restarts listens on its port again at once, though the
  // last one's connections are still in TIME_WAIT.
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), address.get(), address.length) != 0)
    return fail(errno == EADDRINUSE ? ErrorCode::kAddressInUse : ErrorCode::kParamInvalid);
  if (::listen(fd.get(), 128) != 0) return fail(ErrorCode::kInternal);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) return fail(ErrorCode::kInternal);
  ipc::UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return fail(ErrorCode::kResourceExhausted);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd.get();
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) return fail(ErrorCode::kInternal);
  return std::unique_ptr<Door>(new Door(std::move(fd), std::move(epoll),
                                        FormatAddress(reinterpret_cast<const sockaddr*>(&bound)), std::move(options)));
}

Door::Door(ipc::UniqueFd listen, ipc::UniqueFd epoll, std::string address, DoorOptions options)
    : listen_(std::move(listen)),
      epoll_(std::move(epoll)),
      address_(std::move(address)),
      options_(std::move(options)) {}

Door::~Door() = default;

Door::Clock::time_point Door::NextDeadline() const {
  Clock::time_point next =
      accept_paused_until_ == Clock::time_point{} ? Clock::time_point::max() : accept_paused_until_;
  for (const auto& [fd, w] : waiting_) next = std::min(next, w->deadline);
  return next;
}

std::vector<Admitted> Door::Poll(Clock::time_point now) {
  std::vector<Admitted> out;
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_.get(), events, 64, 0);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == listen_.get()) {
      Accept(now, out);
      continue;
    }
    auto it = waiting_.find(events[i].data.fd);
    if (it != waiting_.end()) Serve(*it->second, events[i].events, out);
  }
  if (accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) {
    accept_paused_until_ = {};
    Watch(listen_.get(), EPOLLIN);
  }
  std::vector<int> late;
  for (const auto& [fd, w] : waiting_)
    if (now >= w->deadline) late.push_back(fd);
  for (int fd : late) {
    const Waiting& w = *waiting_.at(fd);
    if (w.stage == Waiting::Stage::kProving)
      Refused("no handshake from " + w.address + " within " + std::to_string(options_.handshake_timeout.count()) +
              " ms");
    else if (w.stage == Waiting::Stage::kAdmitting)
      Refused(w.address + " did not read its acceptance within " + std::to_string(options_.handshake_timeout.count()) +
              " ms");
    Close(fd);
  }
  return out;
}

void Door::Accept(Clock::time_point now, std::vector<Admitted>& out) {
  for (int i = 0; i < kAcceptsPerPoll; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    const int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog: stop looking at it
        // for a moment rather than spin on it.
        Refused(std::string("cannot accept a connection: ") + std::strerror(errno) + " (accepting again in 100 ms)");
        PauseAccepting(now + kPauseWhenOutOfFds);
      }
      return;
    }
    ipc::UniqueFd owned(fd);
    if (waiting_.size() >= options_.max_waiting && !order_.empty()) {
      const int oldest = order_.front();
      Refused("closed the handshake of " + waiting_.at(oldest)->address + ": " + std::to_string(options_.max_waiting) +
              " were waiting (the oldest makes room)");
      Close(oldest);
    }
    auto w = std::make_unique<Waiting>();
    w->fd = std::move(owned);
    w->peer = peer;
    w->address = FormatAddress(reinterpret_cast<const sockaddr*>(&peer));
    w->deadline = now + options_.handshake_timeout;
    w->nonce = handshake::Random<32>();
    w->out = handshake::Encode(handshake::Challenge{handshake::kVersion, w->nonce});
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) continue;  // closed as w goes
    order_.push_back(fd);
    waiting_[fd] = std::move(w);
  }
}

void Door::Serve(Waiting& w, uint32_t events, std::vector<Admitted>& out) {
  const int fd = w.fd.get();
  if (w.sent < w.out.size() && !Flush(w)) {
    if (w.stage != Waiting::Stage::kRefusing) Refused(w.address + " closed the connection during its handshake");
    return Close(fd);
  }
  if (w.stage != Waiting::Stage::kProving) {
    if (w.sent < w.out.size()) return;  // EPOLLOUT brings us back
    if (w.admitted) out.push_back(std::move(*w.admitted));
    return Close(fd);
  }
  if ((events & EPOLLOUT) && w.sent == w.out.size()) Watch(fd, EPOLLIN);  // the challenge is out: its answer now
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  for (;;) {
    auto wanted = w.in.Wanted();
    if (!wanted.ok()) {
      Refused(w.address + " sent " + wanted.status().message());
      return Close(fd);
    }
    if (*wanted == 0) return Answer(w, out);
    uint8_t buf[4096];
    const ssize_t n = ::recv(fd, buf, std::min(*wanted, sizeof(buf)), 0);
    if (n > 0) {
      w.in.Append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Refused(w.address + (n == 0 ? " closed the connection before its handshake"
                                : std::string(" failed during its handshake: ") + std::strerror(errno)));
    return Close(fd);
  }
}

void Door::Answer(Waiting& w, std::vector<Admitted>& out) {
  auto frame = handshake::Decode(w.in.body());
  if (!frame.ok()) {
    Refused(w.address + " sent " + frame.status().message());
    return Close(w.fd.get());
  }
  auto* p = std::get_if<handshake::Proof>(&*frame);
  if (p == nullptr) {
    Refused(w.address + " answered the challenge with something other than a proof");
    return Close(w.fd.get());
  }
  const std::string who = "engine \"" + ipc::EscapeText(p->engine) + "\" at " + w.address;
  if (p->version != handshake::kVersion)
    return Refuse(w, ErrorCode::kVersionMismatch,
                  who + " speaks handshake version " + std::to_string(p->version) + ", this engine " +
                      std::to_string(handshake::kVersion),
                  out);
  const bool secret_ok = !options_.secret.empty() && p->has_secret &&
                         handshake::SameMac(p->mac, handshake::ConnectorMac(options_.secret, w.nonce, *p));
  const bool address_ok = AddressAllowed(options_.allow_from, reinterpret_cast<const sockaddr*>(&w.peer));
  if (!secret_ok && !address_ok)
    return Refuse(
        w, ErrorCode::kPermissionDenied,
        who + (p->has_secret ? " presented a wrong secret (or replayed an old handshake)" : " presented no secret") +
            " and its address is not in allow_from",
        out);
  handshake::Accept a;
  a.token = handshake::Random<16>();
  a.engine = options_.engine;
  a.worker_address = options_.worker_address;
  a.by_address = !secret_ok;
  if (secret_ok) a.mac = handshake::ListenerMac(options_.secret, p->nonce, w.nonce, p->token, a);
  w.admitted = Admitted{w.address, std::move(p->engine), std::move(p->worker_address), p->token, a.token};
  w.stage = Waiting::Stage::kAdmitting;
  Send(w, handshake::Encode(a), out);
}

void Door::Refuse(Waiting& w, ErrorCode code, const std::string& reason, std::vector<Admitted>& out) {
  Refused(reason);
  w.stage = Waiting::Stage::kRefusing;
  Send(w,
       handshake::Encode(handshake::Refuse{static_cast<int32_t>(code), reason.substr(0, handshake::kMaxReasonBytes)}),
       out);
}

void Door::Send(Waiting& w, std::string bytes, std::vector<Admitted>& out) {
  const int fd = w.fd.get();
  w.out = std::move(bytes);
  w.sent = 0;
  Watch(fd, EPOLLOUT);  // nothing more is read from it
  Serve(w, 0, out);     // writes what it can now; may close it
}

void Door::Watch(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
}

bool Door::Flush(Waiting& w) {
  while (w.sent < w.out.size()) {
    const ssize_t n = ::send(w.fd.get(), w.out.data() + w.sent, w.out.size() - w.sent, MSG_NOSIGNAL);
    if (n > 0) {
      w.sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return true;
    } else {
      return false;
    }
  }
  return true;
}

void Door::Close(int fd) {
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  order_.erase(std::remove(order_.begin(), order_.end(), fd), order_.end());
  waiting_.erase(fd);  // closes it
}

void Door::PauseAccepting(Clock::time_point until) {
  accept_paused_until_ = until;
  Watch(listen_.get(), 0);
}

}  // namespace membroker::detail
