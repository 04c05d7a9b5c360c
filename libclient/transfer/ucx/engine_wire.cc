#include "transfer/ucx/engine_wire.h"

#include <cstring>
#include <type_traits>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"
#include "transfer/ucx/byte_codec.h"

namespace membroker::detail::wire {

namespace {

using Writer = ByteWriter;
using Reader = ByteReader;

void Put(Writer& w, const Region& r) {
  w.U64(r.handle);
  w.U64(r.address);
  w.U64(r.length);
  w.U8(r.read_only ? 1 : 0);
  w.Bytes(r.name);
}

bool Get(Reader& in, Region* r) {
  if (!in.U64(&r->handle) || !in.U64(&r->address) || !in.U64(&r->length) || !in.Flag(&r->read_only) ||
      !in.Bytes(&r->name, ipc::kMaxRegionNameBytes) || (!r->name.empty() && !ipc::CheckName(r->name, ipc::kMaxRegionNameBytes, "").ok()))
    return false;
  // A range that wraps, or is empty, names no memory.
  return r->length != 0 && r->address + r->length > r->address;
}

constexpr size_t kMinRegionBytes = 8 * 3 + 1 + 4;  // (the name's length, for an empty name)

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
          for (const Region& r : v.regions) Put(w, r);
        } else if constexpr (std::is_same_v<T, RegionAdded>) {
          Put(w, v.region);
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
        ok = Get(r, &reg);
        w.regions.push_back(std::move(reg));
      }
      out = std::move(w);
      break;
    }
    case 2: {
      RegionAdded a;
      ok = Get(r, &a.region);
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
