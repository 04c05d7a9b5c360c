#include "cluster/cluster.h"

#include <curl/curl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "cluster/etcd_client.h"
#include "log.h"

namespace membroker::broker {

namespace {

constexpr uint32_t kFirstBackoffMs = 100;
constexpr uint32_t kMaxBackoffMs = 2000;

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A broker of this boot and pid namespace, by pid: gone if no process has it
// or only its zombie is left (a parent that has not reaped it yet).
bool ProcessGone(int32_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  const std::string stat = ReadFirstLine("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// A secret's file: readable, and by its owner only.
Status CheckSecretFile(const char* option, const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0 || access(path.c_str(), R_OK) != 0)
    return Status(ErrorCode::kNotFound, std::string("cannot read ") + option + " " + path);
  if ((st.st_mode & 077) != 0)
    return Status(ErrorCode::kPermissionDenied,
                  std::string(option) + " " + path + " is readable by others than its owner (chmod 600 it)");
  return Status::Ok();
}

Result<std::string> ReadPasswordFile(const std::string& path) {
  MB_RETURN_IF_ERROR(CheckSecretFile("--cluster-password-file", path));
  std::ifstream in(path);
  std::string password;
  std::getline(in, password);
  if (!in && !in.eof()) return Status(ErrorCode::kNotFound, "cannot read --cluster-password-file " + path);
  if (password.empty()) return Status(ErrorCode::kParamInvalid, "--cluster-password-file " + path + " is empty");
  return password;
}

}  // namespace

Status ParseClusterUrl(const std::string& url, std::vector<std::string>* endpoints) {
  const bool tls = url.rfind("etcds://", 0) == 0;
  if (!tls && url.rfind("etcd://", 0) != 0)
    return Status(ErrorCode::kParamInvalid, "the cluster is etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS)");
  endpoints->clear();
  std::stringstream in(url.substr(tls ? 8 : 7));
  for (std::string hostport; std::getline(in, hostport, ',');) {
    const size_t colon = hostport.rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < hostport.size() && hostport.size() - colon <= 6;
    for (size_t i = 0; ok && i < hostport.size(); ++i) {
      const char c = hostport[i];
      ok = i > colon ? (c >= '0' && c <= '9')
                     : ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                        c == '.' || c == '-' || c == ':' || c == '[' || c == ']');
    }
    if (!ok) return Status(ErrorCode::kParamInvalid, "'" + hostport + "' is not HOST:PORT");
    endpoints->push_back((tls ? "https://" : "http://") + hostport);
  }
  if (endpoints->empty()) return Status(ErrorCode::kParamInvalid, "the cluster names no etcd endpoint");
  return Status::Ok();
}

const char* ClusterStateName(ClusterState s) {
  switch (s) {
    case ClusterState::kOff: return "off";
    case ClusterState::kConnecting: return "connecting";
    case ClusterState::kWaiting: return "waiting";
    case ClusterState::kRegistered: return "registered";
    case ClusterState::kUnreachable: return "unreachable";
  }
  return "?";
}

Status Cluster::Configure(const ClusterOptions& options, int32_t pid) {
  if (!options.enabled() || started_) return Status::Ok();
  options_ = options;
  if (options_.host_name.empty()) {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) return Status(ErrorCode::kInternal, "gethostname failed");
    options_.host_name = name;
    options_.host_name = options_.host_name.substr(0, options_.host_name.find('.'));
  }
  Status named = CheckHostName(options_.host_name);
  if (!named.ok()) return Status(named.code(), "--host-name '" + ipc::EscapeText(options_.host_name) + "': " + named.message());
  if (!options_.user.empty()) {
    if (options_.password_file.empty())
      return Status(ErrorCode::kParamInvalid, "--cluster-user needs --cluster-password-file");
    MB_ASSIGN_OR_RETURN(password_, ReadPasswordFile(options_.password_file));
  }
  const bool tls = options_.endpoints[0].rfind("https://", 0) == 0;
  if (!tls && !(options_.ca_file.empty() && options_.cert_file.empty() && options_.key_file.empty()))
    return Status(ErrorCode::kParamInvalid, "--cluster-ca, --cluster-cert and --cluster-key need an etcds:// cluster");
  if (options_.cert_file.empty() != options_.key_file.empty())
    return Status(ErrorCode::kParamInvalid, "--cluster-cert and --cluster-key go together");
  for (const auto& [option, path] : {std::pair{"--cluster-ca", options_.ca_file}, {"--cluster-cert", options_.cert_file}})
    if (!path.empty() && access(path.c_str(), R_OK) != 0)
      return Status(ErrorCode::kNotFound, std::string("cannot read ") + option + " " + path);
  if (!options_.key_file.empty()) MB_RETURN_IF_ERROR(CheckSecretFile("--cluster-key", options_.key_file));
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return Status(ErrorCode::kInternal, "curl_global_init failed");
  prefix_ = "/membroker/" + options_.ns + "/hosts/";
  self_key_ = prefix_ + options_.host_name;
  self_.host = options_.host_name;
  self_.pid = pid;
  self_.boot_id = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  struct stat ns{};
  if (stat("/proc/self/ns/pid", &ns) == 0) self_.pid_ns = ns.st_ino;
  self_.started_s = time(nullptr);
  view_.state = ClusterState::kConnecting;
  view_.endpoint = options_.endpoints[0];
  configured_ = true;
  return Status::Ok();
}

Status Cluster::Start(uv_loop_t* loop, std::function<void()> on_change) {
  if (!configured_ || started_) return Status::Ok();
  on_change_ = std::move(on_change);
  changed_.data = this;
  if (int rc = uv_async_init(loop, &changed_, [](uv_async_t* a) { static_cast<Cluster*>(a->data)->on_change_(); });
      rc != 0)
    return Status(ErrorCode::kInternal, std::string("uv_async_init: ") + uv_strerror(rc));
  started_ = true;
  registrar_ = std::thread([this] { RunRegistrar(); });
  watcher_ = std::thread([this] { RunWatcher(); });
  MB_INFO("cluster", "etcd=\"%s\" namespace=\"%s\" host=\"%s\" ttl_s=%u", LogText(options_.endpoints[0]).c_str(),
          LogText(options_.ns).c_str(), LogText(options_.host_name).c_str(), options_.ttl_s);
  return Status::Ok();
}

void Cluster::SetEngines(std::vector<HostEngine> engines) {
  if (!started_) return;
  std::lock_guard lock(mu_);
  const auto same = [](const HostEngine& a, const HostEngine& b) { return a.name == b.name && a.address == b.address; };
  if (std::equal(engines.begin(), engines.end(), self_.engines.begin(), self_.engines.end(), same)) return;
  self_.engines = std::move(engines);
  record_changed_ = true;
  wake_.notify_all();
}

void Cluster::SetNames(std::vector<HostName> names) {
  if (!configured_) return;  // (before Start too: the names a restart brought back)
  std::lock_guard lock(mu_);
  if (names == self_.names) return;
  self_.names = std::move(names);
  record_changed_ = true;
  wake_.notify_all();
}

void Cluster::Stop() {
  if (!started_) return;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  registrar_.join();
  watcher_.join();
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&changed_))) uv_close(reinterpret_cast<uv_handle_t*>(&changed_), nullptr);
  started_ = false;
}

ClusterView Cluster::View() const {
  std::lock_guard lock(mu_);
  ClusterView v = view_;
  for (const auto& [name, h] : hosts_) {
    v.hosts.push_back(h);
    v.hosts.back().self = name == options_.host_name && h.generation == view_.generation;
  }
  return v;
}

std::optional<EngineLocation> Cluster::FindEngine(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const auto& [host, h] : hosts_) {
    if (host == options_.host_name) continue;  // this host's engines are the broker's own
    for (const HostEngine& e : h.record.engines)
      if (e.name == name) return EngineLocation{host, h.generation, e.address};
  }
  return std::nullopt;
}

std::optional<NameLocation> Cluster::FindName(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const auto& [host, h] : hosts_) {
    if (host == options_.host_name) continue;  // this host's names are the broker's own
    for (const HostName& n : h.record.names)
      if (n.name == name) return NameLocation{host, h.generation, n};
  }
  return std::nullopt;
}

NameLocation Cluster::Here(HostName name) const {
  std::lock_guard lock(mu_);
  return {options_.host_name, view_.generation, std::move(name)};
}

std::vector<ClusterNameEvent> Cluster::TakeNameEvents() {
  std::lock_guard lock(mu_);
  return std::exchange(name_events_, {});
}

EtcdConfig Cluster::EtcdSettings() const {
  return {options_.endpoints, options_.user, password_, options_.ca_file, options_.cert_file, options_.key_file, 2000};
}

bool Cluster::Pause(std::unique_lock<std::mutex>& lock, uint32_t ms, bool registrar) {
  wake_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping_ || (registrar && record_changed_); });
  return !stopping_;
}

void Cluster::Failed(ClusterState state, const Status& why, bool registrar) {
  ++view_.errors;
  if (registrar) view_.state = state;
  if (why.message() != view_.error)
    MB_WARN("cluster_error", "state=%s error=\"%s\"", ClusterStateName(view_.state), LogText(why.message()).c_str());
  view_.error = why.message();
}

// Grants a lease and claims the host's key under it. The key may still hold a
// record of this host's previous broker, SIGKILLed before its lease ran out:
// that one is deleted (same boot and pid namespace, its pid gone). Any other
// holder keeps the name; this broker waits (BUSY) until its lease ends.
Status Cluster::Register(EtcdClient& etcd, int64_t* lease) {
  MB_ASSIGN_OR_RETURN(*lease, etcd.Grant(options_.ttl_s));
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string value;
    {
      std::lock_guard lock(mu_);
      value = EncodeHostRecord(self_);
      record_changed_ = false;
    }
    MB_ASSIGN_OR_RETURN(EtcdClient::Claim claim, etcd.PutIfAbsent(self_key_, value, *lease));
    if (claim.created) {
      std::lock_guard lock(mu_);
      view_.generation = claim.revision;
      return Status::Ok();
    }
    Result<HostRecord> other = DecodeHostRecord(options_.host_name, claim.present.value);
    const bool ours_gone = other.ok() && other->boot_id == self_.boot_id && other->pid_ns == self_.pid_ns &&
                           (other->pid == self_.pid || ProcessGone(other->pid));
    if (!ours_gone) {
      (void)etcd.Revoke(*lease);
      *lease = 0;
      return Status(ErrorCode::kBusy,
                    other.ok() ? "host name '" + options_.host_name + "' is registered by pid " +
                                     std::to_string(other->pid) + " of boot " + other->boot_id +
                                     "; waiting for its lease to end"
                               : "host name '" + options_.host_name + "' holds a record that is not a broker's (" +
                                     other.status().message() + "); waiting for it to go");
    }
    MB_INFO("cluster_stale", "host=\"%s\" pid=%d note=\"the record of a broker of this host that is gone\"",
            LogText(options_.host_name).c_str(), other->pid);
    MB_RETURN_IF_ERROR(etcd.DeleteIfAt(self_key_, claim.present.mod_revision).status());
  }
  return Status(ErrorCode::kBusy, "host name '" + options_.host_name + "' keeps being taken");
}

void Cluster::RunRegistrar() {
  EtcdClient etcd(EtcdSettings());
  uint32_t backoff = kFirstBackoffMs;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    int64_t lease = 0;
    Status st = Register(etcd, &lease);
    lock.lock();
    if (!st.ok()) {
      Failed(st.code() == ErrorCode::kBusy ? ClusterState::kWaiting : ClusterState::kUnreachable, st, true);
      if (lease != 0) {
        lock.unlock();
        (void)etcd.Revoke(lease);
        lock.lock();
      }
      Pause(lock, backoff, true);
      backoff = std::min(backoff * 2, kMaxBackoffMs);
      continue;
    }
    backoff = kFirstBackoffMs;
    view_.state = ClusterState::kRegistered;
    view_.error.clear();
    view_.endpoint = etcd.endpoint();
    ++view_.registrations;
    MB_INFO("cluster_registered", "host=\"%s\" generation=%lld etcd=\"%s\"", LogText(options_.host_name).c_str(),
            static_cast<long long>(view_.generation), LogText(etcd.endpoint()).c_str());
    lock.unlock();
    KeepRegistered(etcd, lease);
    lock.lock();
  }
}

// Keeps the lease alive (three times a TTL) and the record current, until the
// broker stops or the registration is lost (the lease ended, the key went).
void Cluster::KeepRegistered(EtcdClient& etcd, int64_t lease) {
  using Clock = std::chrono::steady_clock;
  const uint32_t period_ms = std::max<uint32_t>(options_.ttl_s * 1000 / 3, 200);
  Clock::time_point alive = Clock::now();
  std::unique_lock lock(mu_);
  uint32_t wait_ms = period_ms;
  while (Pause(lock, wait_ms, true)) {
    wait_ms = period_ms;
    if (record_changed_) {
      record_changed_ = false;
      const std::string value = EncodeHostRecord(self_);
      const int64_t generation = view_.generation;
      lock.unlock();
      Result<bool> put = etcd.PutIfCreatedAt(self_key_, value, lease, generation);
      lock.lock();
      if (put.ok() && !*put) break;  // our key went (deleted by someone): register again
      if (!put.ok()) record_changed_ = true;  // once more with the next keep-alive
    }
    lock.unlock();
    Result<int64_t> ttl = etcd.KeepAlive(lease);
    lock.lock();
    if (ttl.ok() && *ttl == 0) {
      Failed(ClusterState::kConnecting, Status(ErrorCode::kNotFound, "etcd no longer has this broker's lease"), true);
      break;
    }
    if (!ttl.ok()) {
      Failed(ClusterState::kUnreachable, ttl.status(), true);
      // Past the TTL since the last keep-alive, etcd has let the lease go: start over.
      if (Clock::now() - alive > std::chrono::seconds(options_.ttl_s)) break;
      wait_ms = std::min<uint32_t>(500, period_ms);
      continue;
    }
    alive = Clock::now();
    if (view_.state != ClusterState::kRegistered) {
      MB_INFO("cluster_reachable", "etcd=\"%s\"", LogText(etcd.endpoint()).c_str());
      view_.state = ClusterState::kRegistered;
      view_.error.clear();
    }
    view_.endpoint = etcd.endpoint();
  }
  const bool stopping = stopping_;
  lock.unlock();
  if (stopping) {
    // Orderly stop: the records go now, not a TTL later.
    Status st = etcd.Revoke(lease);
    if (!st.ok()) MB_WARN("cluster_revoke", "error=\"%s\"", LogText(st.message()).c_str());
  } else {
    (void)etcd.Revoke(lease);
  }
}

void Cluster::HostGone(const std::string& name) {
  auto it = hosts_.find(name);
  if (it == hosts_.end()) return;
  if (name != options_.host_name)  // this host's names have their own events
    for (const HostName& n : it->second.record.names)
      name_events_.push_back({ipc::NameEventKind::kHostGone, name, n.name});
  hosts_.erase(it);
}

void Cluster::ApplyRecord(const std::string& key, const std::string& value, int64_t generation) {
  const std::string name = key.substr(prefix_.size());
  Result<HostRecord> r = DecodeHostRecord(name, value);
  if (!r.ok()) {
    ++view_.invalid_records;
    MB_WARN("cluster_record", "key=\"%s\" error=\"%s\"", LogText(key).c_str(), LogText(r.status().message()).c_str());
    HostGone(name);
    return;
  }
  // Another broker of that host: the old one's names went with it.
  if (auto it = hosts_.find(name); it != hosts_.end() && it->second.generation != generation) HostGone(name);
  ClusterHost& h = hosts_[name];
  if (name != options_.host_name) {
    const auto in = [](const std::vector<HostName>& names, const HostName& n, bool whole) {
      return std::any_of(names.begin(), names.end(), [&](const HostName& x) { return whole ? x == n : x.name == n.name; });
    };
    for (const HostName& n : r->names)
      if (!in(h.record.names, n, true)) name_events_.push_back({ipc::NameEventKind::kPublished, name, n.name});
    for (const HostName& n : h.record.names)
      if (!in(r->names, n, false)) name_events_.push_back({ipc::NameEventKind::kUnpublished, name, n.name});
  }
  h.record = std::move(*r);
  h.generation = generation;
}

void Cluster::RunWatcher() {
  EtcdClient etcd(EtcdSettings());
  uint32_t backoff = kFirstBackoffMs;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    Result<EtcdClient::Range> all = etcd.RangePrefix(prefix_);
    Status st = all.status();
    if (all.ok()) {
      {
        std::lock_guard hold(mu_);
        // Read whole again (after a start, or a stream that ended): what
        // changed meanwhile becomes events, as the stream's would have.
        std::set<std::string> listed;
        for (const EtcdKv& kv : all->kvs) {
          if (kv.key.size() <= prefix_.size() || kv.key.compare(0, prefix_.size(), prefix_) != 0) continue;
          ApplyRecord(kv.key, kv.value, kv.create_revision);
          listed.insert(kv.key.substr(prefix_.size()));
        }
        for (auto it = hosts_.begin(); it != hosts_.end();) {
          const std::string name = (it++)->first;
          if (listed.count(name) == 0) HostGone(name);
        }
        view_.watching = true;
      }
      uv_async_send(&changed_);
      backoff = kFirstBackoffMs;
      const auto on_line = [&](const EtcdAnswer& a) -> Status {
        if (a.error_code != 0) return Status(ErrorCode::kNotConnected, "the watch stream failed: " + a.error);
        if (a.canceled || a.compact_revision != 0)
          return Status(ErrorCode::kNotConnected, "etcd ended the watch: " + a.cancel_reason);
        std::lock_guard hold(mu_);
        for (const EtcdEvent& e : a.events) {
          if (e.kv.key.size() <= prefix_.size() || e.kv.key.compare(0, prefix_.size(), prefix_) != 0) continue;
          if (!e.deleted) {
            ApplyRecord(e.kv.key, e.kv.value, e.kv.create_revision);
            continue;
          }
          const std::string name = e.kv.key.substr(prefix_.size());
          const bool known = hosts_.count(name) != 0;
          HostGone(name);
          if (known && e.kv.key != self_key_) {
            ++view_.hosts_gone;
            MB_INFO("cluster_host_gone", "host=\"%s\"", LogText(name).c_str());
          }
          if (e.kv.key == self_key_ && view_.state == ClusterState::kRegistered) {
            record_changed_ = true;  // someone deleted our record: the registrar puts it back
            wake_.notify_all();
          }
        }
        if (!a.events.empty()) uv_async_send(&changed_);
        return Status::Ok();
      };
      st = etcd.Watch(prefix_, all->revision + 1, on_line, [this] {
        std::lock_guard hold(mu_);
        return !stopping_;
      });
    }
    lock.lock();
    view_.watching = false;
    if (stopping_) break;
    Failed(ClusterState::kUnreachable, st, false);
    Pause(lock, backoff, false);
    backoff = std::min(backoff * 2, kMaxBackoffMs);
  }
}

}  // namespace membroker::broker
