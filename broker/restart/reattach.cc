// Reattach: a client that held memory from a broker on this socket - one that
// crashed, was killed or was upgraded - presents it to this broker after a
// HelloRequest with the reattach feature: each handle with its own fd to the
// memory (ReattachRequest), then its exports (RestoreExportRequest); its
// names, subscriptions and host registrations are ordinary requests again.
//
// What a client presents is checked before anything changes:
//  1. Memory this broker adopted already (by the fd's inode) is that allocation; the
//     client must name the id it has here.
//  2. Memory it does not know must be a predecessor's: an id below this
//     broker's first (the state file keeps ids above every predecessor's),
//     not taken, and a memfd whose name carries a tag made with the state
//     file's key. A client cannot make such memory itself, so it can only
//     present memory a broker gave it - to it, or to a process that passed it on.
//  3. The access mode of the fd is the client's access: a read-only fd is a
//     read-only holding, whatever the client says.
// A refused handle changes nothing and is counted (reattach_refused).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "broker.h"
#include "log.h"
#include "memory/memfd.h"

namespace membroker::broker {

namespace {
constexpr int kOurSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
// From this many fds of memory it does not know, a batch's tags are read on a
// worker while the loop serves others (fewer cost less than the hand-off).
constexpr size_t kTagsOnAWorkerFrom = 16;

ipc::ReattachResult Refused(ErrorCode code, std::string why) {
  return ipc::ReattachResult{code, std::move(why), false};
}

// The memfd name behind fd ("/memfd:NAME (deleted)" in /proc), or "".
// proc_fd_dir: /proc/self/fd, opened once (half the cost of a full path).
std::string MemfdName(int proc_fd_dir, int fd) {
  char entry[32];
  std::snprintf(entry, sizeof(entry), "%d", fd);
  char target[512];
  ssize_t n = ::readlinkat(proc_fd_dir, entry, target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string link(target, static_cast<size_t>(n));
  constexpr std::string_view kPrefix = "/memfd:", kSuffix = " (deleted)";
  if (link.rfind(kPrefix, 0) != 0) return "";
  link.erase(0, kPrefix.size());
  if (link.size() >= kSuffix.size() && link.compare(link.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    link.resize(link.size() - kSuffix.size());
  return link;
}

ipc::PagePolicy PolicyOf(uint64_t page_size) {
  if (page_size == ipc::kHuge2MPageSize) return ipc::PagePolicy::kHugeOnly;
  if (page_size == ipc::kHuge1GPageSize) return ipc::PagePolicy::kHuge1GOnly;
  return ipc::PagePolicy::kNormalOnly;
}

std::string Id(uint64_t id) { return std::to_string(id); }
}  // namespace

// What the broker learned of one presented fd before it decides: its fstat and
// access mode, read on the loop, and its name's tag - a readlinkat of /proc,
// the larger part of a reattach's cost - read on a worker for a large batch,
// or by ReattachOne when it needs it.
struct Broker::PresentedFd {
  ipc::UniqueFd fd;
  struct stat st{};
  bool is_memory = false;  // fstat worked and it is a regular file
  int mode = -1;           // F_GETFL
  bool needs_tag = false;  // memory this broker did not know when it came
  std::optional<bool> tagged;
};

Answer Broker::Handle(Session& s, uint64_t rid, const ipc::ReattachRequest& m, std::vector<ipc::UniqueFd>& fds) {
  if (!s.reattaching)
    return Status(ErrorCode::kProtocolError,
                  "ReattachRequest needs a HelloRequest with the reattach feature first");
  auto presented = std::make_shared<std::vector<PresentedFd>>(m.handles.size());
  size_t unknown = 0;
  for (size_t i = 0; i < m.handles.size(); ++i) {
    PresentedFd& p = (*presented)[i];
    p.fd = std::move(fds[i]);
    p.is_memory = ::fstat(p.fd.get(), &p.st) == 0 && S_ISREG(p.st.st_mode);
    p.mode = ::fcntl(p.fd.get(), F_GETFL);
    p.needs_tag = p.is_memory && holdings_.FindByInode(p.st.st_dev, p.st.st_ino) == nullptr;
    unknown += p.needs_tag ? 1 : 0;
  }
  // Decides every handle on the loop, in order, with what was read.
  auto decide = [this, handles = m.handles, presented](Session& s) {
    ipc::ReattachReply reply;
    for (size_t i = 0; i < handles.size(); ++i) {
      ipc::ReattachResult r = ReattachOne(s, handles[i], (*presented)[i]);
      if (r.code == ErrorCode::kOk) {
        ++counters_.handles_reattached;
      } else {
        ++counters_.reattach_refused;
        MB_WARN("reattach_refused", "client=%llu pid=%d handle=%llu code=%s reason=\"%s\"",
                static_cast<unsigned long long>(s.id), static_cast<int>(s.cred.pid),
                static_cast<unsigned long long>(handles[i].handle), std::string(ErrorCodeName(r.code)).c_str(),
                LogText(r.message).c_str());
      }
      reply.results.push_back(std::move(r));
    }
    return reply;
  };
  if (unknown < kTagsOnAWorkerFrom) return decide(s);
  // A take-over waits for it, as for an allocation on a worker.
  ++s.inflight;
  workers_.Run(
      [this, presented] {
        for (PresentedFd& p : *presented)
          if (p.needs_tag) p.tagged = state_file_->Tagged(MemfdName(proc_fd_dir_.get(), p.fd.get()));
      },
      [this, session_id = s.id, rid, decide = std::move(decide)] {
        Session* s = sessions_.Find(session_id);
        if (s == nullptr) return;  // gone: the fds close, nothing was taken
        --s->inflight;
        if (!s->closing) Send(*s, rid, decide(*s));
      });
  return Deferred{};  // the worker's completion answers
}

ipc::ReattachResult Broker::ReattachOne(Session& s, const ipc::ReattachHandle& h, PresentedFd& p) {
  ipc::UniqueFd& fd = p.fd;
  const struct stat& st = p.st;
  if (!p.is_memory)
    return Refused(ErrorCode::kPermissionDenied, "the fd of handle " + Id(h.handle) + " is not memory");
  const int mode = p.mode;
  if (mode < 0) return Refused(ErrorCode::kInternal, "fcntl(F_GETFL) failed on handle " + Id(h.handle));
  const bool writable = (mode & O_ACCMODE) == O_RDWR;
  if (s.ledger.size() >= kMaxHoldingsPerClient)
    return Refused(ErrorCode::kResourceExhausted, "this client holds too many allocations");

  if (Allocation* a = holdings_.FindByInode(st.st_dev, st.st_ino)) {
    // 1. Memory this broker has: given back by another holder already, or
    //    kept across a take-over.
    if (a->id != h.handle)
      return Refused(ErrorCode::kInvalidHandle, "this memory is allocation " + Id(a->id) + " here, not " +
                                                    Id(h.handle));
    if (s.ledger.Holds(a->id))
      return Refused(ErrorCode::kAlreadyExists, "this client holds allocation " + Id(a->id) + " already");
    if (writable && (::fcntl(a->memory.fd.get(), F_GETFL) & O_ACCMODE) != O_RDWR)
      a->memory.fd = std::move(fd);  // the broker held it read-only so far
    holdings_.Rehold(s, *a, !writable, h.created);
    return ipc::ReattachResult{ErrorCode::kOk, "", a->pinned};
  }

  // 2. Memory a predecessor created.
  if (h.handle == 0 || h.handle >= holdings_.table().first_id())
    return Refused(ErrorCode::kInvalidHandle,
                   "handle " + Id(h.handle) + " was not given out by an earlier broker on this socket");
  if (holdings_.Find(h.handle) != nullptr)
    return Refused(ErrorCode::kInvalidHandle, "handle " + Id(h.handle) + " is other memory here");
  // (Known when it came, freed since: its tag is read now.)
  if (!p.tagged.has_value()) p.tagged = state_file_->Tagged(MemfdName(proc_fd_dir_.get(), fd.get()));
  if (!*p.tagged)
    return Refused(ErrorCode::kPermissionDenied,
                   "the fd of handle " + Id(h.handle) +
                       " is not memory a broker on this socket handed out (no valid tag)");
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  const uint64_t page = static_cast<uint64_t>(st.st_blksize);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (seals < 0 || (seals & kOurSeals) != kOurSeals ||
      (page != ipc::kNormalPageSize && page != ipc::kHuge2MPageSize && page != ipc::kHuge1GPageSize) ||
      size == 0 || size % page != 0)
    return Refused(ErrorCode::kPermissionDenied, "the memory of handle " + Id(h.handle) +
                                                     " is not sealed and sized as a broker's");
  PhysicalMemory mem;
  if (writable) {
    mem.fd = std::move(fd);
  } else {
    // The broker needs a writable fd for later importers; the memory is its own.
    mem.fd.reset(::openat(proc_fd_dir_.get(), std::to_string(fd.get()).c_str(), O_RDWR | O_CLOEXEC));
    if (!mem.fd.valid()) mem.fd = std::move(fd);  // only read-only importers then
  }
  mem.size = size;
  mem.page_size = page;
  auto adopted = holdings_.Adopt(h.handle, std::move(mem), PolicyOf(page), s.cred.uid, h.pinned, h.fixed_address,
                             {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
  if (!adopted.ok()) return Refused(adopted.code(), adopted.status().message());
  Allocation& a = **adopted;
  holdings_.Rehold(s, a, !writable, h.created);
  ++counters_.handles_adopted;
  return ipc::ReattachResult{ErrorCode::kOk, "", a.pinned};
}

Answer Broker::Handle(Session& s, uint64_t, const ipc::RestoreExportRequest& m) {
  if (!s.reattaching)
    return Status(ErrorCode::kProtocolError,
                  "RestoreExportRequest needs a HelloRequest with the reattach feature first");
  if (!s.ledger.Holds(m.handle))
    return Status(ErrorCode::kInvalidHandle,
                  "handle " + Id(m.handle) + " is not held by this client: reattach it first");
  // What a client may only read it shares onward read-only (as ExportRequest).
  const uint32_t flags = m.flags | (s.ledger.ReadOnly(m.handle) ? ipc::kExportReadOnly : 0);
  MB_RETURN_IF_ERROR(holdings_.RestoreExport(m.token, m.handle, s.id, s.cred.uid, flags, m.pids));
  ++counters_.exports_restored;
  return Status::Ok();
}

void Broker::ReserveIds() {
  const uint64_t next = holdings_.table().next_id();
  if (next <= state_file_->limit()) return;
  Status st = state_file_->Reserve(next);
  if (!st.ok())
    MB_ERROR("state_file_write_failed", "path=\"%s\" reason=\"%s\" (a broker started after a crash may "
             "refuse some reattaching handles)",
             LogText(state_file_->path()).c_str(), LogText(st.message()).c_str());
}

}  // namespace membroker::broker
