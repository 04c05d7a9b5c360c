#include "transfer/ucx/engine_wire.h"

#include <cstring>
#include <type_traits>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"

namespace membroker::detail::wire {

namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Bytes(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void Put(const Region& r) {
    U64(r.handle);
    U64(r.address);
    U64(r.length);
    U8(r.read_only ? 1 : 0);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool U8(uint8_t* v) {
    if (b_.size() - pos_ < 1) return false;
    *v = b_[pos_++];
    return true;
  }
  bool U32(uint32_t* v) {
    if (b_.size() - pos_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(b_[pos_++]) << (8 * i);
    return true;
  }
  bool U64(uint64_t* v) {
    if (b_.size() - pos_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(b_[pos_++]) << (8 * i);
    return true;
  }
  bool Bytes(std::string* s, size_t max) {
    uint32_t n = 0;
    if (!U32(&n) || n > max || b_.size() - pos_ < n) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Get(Region* r) {
    uint8_t ro = 0;
    if (!U64(&r->handle) || !U64(&r->address) || !U64(&r->length) || !U8(&ro) || ro > 1) return false;
    r->read_only = ro == 1;
    // A range that wraps, or is empty, names no memory.
    return r->length != 0 && r->address + r->length > r->address;
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

constexpr size_t kMinRegionBytes = 8 * 3 + 1;

bool ValidName(const std::string& s, size_t max) {
  return !s.empty() && s.size() <= max && ipc::IsValidUtf8(s);
}

}  // namespace

std::string Encode(const Message& m) {
  Writer w;
  w.U8(static_cast<uint8_t>(m.index() + 1));
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Welcome>) {
          w.Bytes(v.engine);
          for (uint8_t b : v.identity) w.U8(b);
          w.U32(static_cast<uint32_t>(v.regions.size()));
          for (const Region& r : v.regions) w.Put(r);
        } else if constexpr (std::is_same_v<T, RegionAdded>) {
          w.Put(v.region);
        } else if constexpr (std::is_same_v<T, RegionGone> || std::is_same_v<T, RegionGoneAck> ||
                             std::is_same_v<T, RegionAddedAck>) {
          w.U64(v.handle);
        } else if constexpr (std::is_same_v<T, Notify>) {
          w.U64(v.seq);
          w.Bytes(v.name);
          w.Bytes(v.message);
        } else if constexpr (std::is_same_v<T, NotifyAck>) {
          w.U64(v.seq);
          w.U32(static_cast<uint32_t>(v.code));
          w.Bytes(v.message);
        } else if constexpr (std::is_same_v<T, Goodbye>) {
          w.Bytes(v.reason);
        }
      },
      m);
  return w.take();
}

Result<Message> Decode(std::span<const uint8_t> bytes) {
  const Status bad(ErrorCode::kProtocolError, "a malformed message from the remote engine");
  if (bytes.size() > kMaxMessageBytes) return bad;
  Reader r(bytes);
  uint8_t kind = 0;
  if (!r.U8(&kind)) return bad;
  Message out;
  bool ok = false;
  switch (kind) {
    case 1: {
      Welcome w;
      uint32_t n = 0;
      ok = r.Bytes(&w.engine, ipc::kMaxEngineNameBytes) && ValidName(w.engine, ipc::kMaxEngineNameBytes);
      for (size_t i = 0; ok && i < w.identity.size(); ++i) ok = r.U8(&w.identity[i]);
      ok = ok && r.U32(&n) && n <= r.left() / kMinRegionBytes;
      for (uint32_t i = 0; ok && i < n; ++i) {
        Region reg;
        ok = r.Get(&reg);
        w.regions.push_back(std::move(reg));
      }
      out = std::move(w);
      break;
    }
    case 2: {
      RegionAdded a;
      ok = r.Get(&a.region);
      out = std::move(a);
      break;
    }
    case 3: {
      RegionGone g;
      ok = r.U64(&g.handle);
      out = g;
      break;
    }
    case 4: {
      RegionGoneAck g;
      ok = r.U64(&g.handle);
      out = g;
      break;
    }
    case 5: {
      Notify n;
      ok = r.U64(&n.seq) && r.Bytes(&n.name, ipc::kMaxNotifyNameBytes) &&
           r.Bytes(&n.message, ipc::kMaxNotifyMessageBytes) && ipc::IsValidUtf8(n.name);
      out = std::move(n);
      break;
    }
    case 6: {
      NotifyAck a;
      uint32_t code = 0;
      ok = r.U64(&a.seq) && r.U32(&code) && r.Bytes(&a.message, kMaxReasonBytes);
      a.code = static_cast<int32_t>(code);
      out = std::move(a);
      break;
    }
    case 7: {
      RegionAddedAck a;
      ok = r.U64(&a.handle);
      out = a;
      break;
    }
    case 8: {
      Goodbye g;
      ok = r.Bytes(&g.reason, kMaxReasonBytes);
      out = std::move(g);
      break;
    }
    default:
      return Status(ErrorCode::kProtocolError, "an unknown message kind " + std::to_string(kind) +
                                                   " from the remote engine");
  }
  if (!ok || !r.done()) return bad;
  return out;
}

EncodedDataHeader EncodeData(const DataHeader& h) {
  Writer w;
  w.U8(static_cast<uint8_t>(h.kind));
  w.U32(static_cast<uint32_t>(h.code));
  w.U64(h.tag);
  w.U64(h.address);
  w.U64(h.length);
  const std::string bytes = w.take();
  EncodedDataHeader out{};
  std::memcpy(out.data(), bytes.data(), out.size());
  return out;
}

RoutedDataHeader EncodeRouted(const std::array<uint8_t, kTokenBytes>& token, const DataHeader& h) {
  RoutedDataHeader out{};
  std::memcpy(out.data(), token.data(), kTokenBytes);
  const EncodedDataHeader data = EncodeData(h);
  std::memcpy(out.data() + kTokenBytes, data.data(), data.size());
  return out;
}

Result<DataHeader> DecodeData(std::span<const uint8_t> bytes) {
  const Status bad(ErrorCode::kProtocolError, "a malformed data message from the remote engine");
  if (bytes.size() != kDataHeaderBytes) return bad;
  Reader r(bytes);
  DataHeader h;
  uint8_t kind = 0;
  uint32_t code = 0;
  if (!r.U8(&kind) || !r.U32(&code) || !r.U64(&h.tag) || !r.U64(&h.address) || !r.U64(&h.length)) return bad;
  if (kind < static_cast<uint8_t>(DataKind::kWrite) || kind > static_cast<uint8_t>(DataKind::kReadV)) return bad;
  h.kind = static_cast<DataKind>(kind);
  h.code = static_cast<int32_t>(code);
  if (h.length > kMaxMessageBytes) return bad;
  const bool batch = h.kind == DataKind::kWriteV || h.kind == DataKind::kReadV;
  if (batch ? h.address == 0 || h.address > kMaxSegments : h.address + h.length < h.address) return bad;
  return h;
}

std::string EncodeSegments(const std::vector<Segment>& segments) {
  Writer w;
  for (const Segment& s : segments) {
    w.U64(s.address);
    w.U64(s.length);
  }
  return w.take();
}

Result<std::vector<Segment>> DecodeSegments(std::span<const uint8_t> bytes, size_t count, uint64_t total) {
  const Status bad(ErrorCode::kProtocolError, "a malformed batch from the remote engine");
  if (count == 0 || count > kMaxSegments || bytes.size() < count * kSegmentBytes) return bad;
  Reader r(bytes.first(count * kSegmentBytes));
  std::vector<Segment> out(count);
  uint64_t sum = 0;
  for (Segment& s : out) {
    if (!r.U64(&s.address) || !r.U64(&s.length) || s.length == 0 || s.length > kMaxMessageBytes ||
        s.address + s.length < s.address)
      return bad;
    sum += s.length;  // at most 256 * 4 MiB: no overflow
  }
  if (sum != total) return bad;
  return out;
}

}  // namespace membroker::detail::wire
