// Little-endian fields for what engines send each other (engine_wire.h, and
// the handshake's frames, handshake.h). The reader trusts nothing: each read
// checks what is left and says false rather than read past the end.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace membroker::detail::wire {

class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  template <size_t N>
  void Fixed(const std::array<uint8_t, N>& a) {
    out_.append(reinterpret_cast<const char*>(a.data()), N);
  }
  // A 4-byte length, then the bytes.
  void Bytes(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> b) : b_(b) {}
  bool U8(uint8_t* v) {
    if (left() < 1) return false;
    *v = b_[pos_++];
    return true;
  }
  bool U32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(b_[pos_++]) << (8 * i);
    return true;
  }
  bool U64(uint64_t* v) {
    if (left() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(b_[pos_++]) << (8 * i);
    return true;
  }
  template <size_t N>
  bool Fixed(std::array<uint8_t, N>* a) {
    if (left() < N) return false;
    std::memcpy(a->data(), b_.data() + pos_, N);
    pos_ += N;
    return true;
  }
  // A 4-byte length of at most max, then as many bytes.
  bool Bytes(std::string* s, size_t max) {
    uint32_t n = 0;
    if (!U32(&n) || n > max || left() < n) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // One byte, 0 or 1.
  bool Flag(bool* v) {
    uint8_t b = 0;
    if (!U8(&b) || b > 1) return false;
    *v = b == 1;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace membroker::detail::wire
