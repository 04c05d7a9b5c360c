// The handshake's frames (libclient/transfer/ucx/handshake.h): every frame
// round-trips, every truncation and every out-of-bounds length is refused,
// and a MAC binds every field it covers.
#include <gtest/gtest.h>

#include "transfer/ucx/handshake.h"

namespace membroker::detail::handshake {
namespace {

Result<Frame> DecodeWhole(const std::string& bytes) {
  FrameReader r;
  r.Append(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto wanted = r.Wanted();
  if (!wanted.ok()) return wanted.status();
  if (*wanted != 0) return Status(ErrorCode::kProtocolError, "short");
  return Decode(r.body());
}

Proof AProof() {
  Proof p;
  p.nonce = Random<32>();
  p.token = Random<16>();
  p.engine = "prefill";
  p.worker_address = std::string(300, '\x07');
  p.has_secret = true;
  return p;
}

TEST(Handshake, EveryFrameRoundTripsAndEveryTruncationIsRefused) {
  Accept a;
  a.token = Random<16>();
  a.engine = "decode";
  a.worker_address = "w";
  a.mac = Random<32>();
  const std::vector<Frame> all = {Challenge{kVersion, Random<32>()}, AProof(), a, Refuse{4, "no"}};
  for (const Frame& f : all) {
    const std::string bytes = Encode(f);
    auto back = DecodeWhole(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->index(), f.index());
    EXPECT_EQ(Encode(*back), bytes);
    for (size_t n = kLengthBytes + 1; n < bytes.size(); ++n) {
      std::string cut = bytes.substr(0, n);
      const uint32_t body = static_cast<uint32_t>(n - kLengthBytes);
      for (int i = 0; i < 4; ++i) cut[i] = static_cast<char>(body >> (8 * i));  // a prefix that agrees
      EXPECT_FALSE(DecodeWhole(cut).ok()) << "frame " << f.index() << " cut at " << n;
    }
  }
}

TEST(Handshake, RefusesLengthsAndFieldsNoEngineSends) {
  const uint8_t zero[4] = {0, 0, 0, 0}, huge[4] = {0xff, 0xff, 0xff, 0xff};
  EXPECT_EQ(FrameLength(std::span<const uint8_t, 4>(zero)).status().code(), ErrorCode::kProtocolError);
  EXPECT_EQ(FrameLength(std::span<const uint8_t, 4>(huge)).status().code(), ErrorCode::kProtocolError);
  Proof p = AProof();
  p.engine = "";
  EXPECT_FALSE(DecodeWhole(Encode(p)).ok());  // no name
  p = AProof();
  p.worker_address = "";
  EXPECT_FALSE(DecodeWhole(Encode(p)).ok());  // nowhere to answer
  std::string flag = Encode(AProof());
  flag[flag.size() - 33] = 2;  // has_secret is 0 or 1
  EXPECT_FALSE(DecodeWhole(flag).ok());
  EXPECT_FALSE(DecodeWhole(Encode(Refuse{1, "x"}) + "y").ok());  // trailing bytes (the prefix disagrees)
}

TEST(Handshake, AMacAnswersOneChallengeAndBindsEveryField) {
  const Nonce challenge = Random<32>();
  Proof p = AProof();
  const Mac mac = ConnectorMac("s3cret", challenge, p);
  EXPECT_TRUE(SameMac(mac, ConnectorMac("s3cret", challenge, p)));
  EXPECT_FALSE(SameMac(mac, ConnectorMac("s3cret", Random<32>(), p)));  // replayed to another challenge
  EXPECT_FALSE(SameMac(mac, ConnectorMac("s3cres", challenge, p)));
  for (int field = 0; field < 4; ++field) {
    Proof q = p;
    if (field == 0) q.nonce[0] ^= 1;
    if (field == 1) q.token[15] ^= 1;
    if (field == 2) q.engine = "prefilm";
    if (field == 3) q.worker_address.back() ^= 1;
    EXPECT_FALSE(SameMac(mac, ConnectorMac("s3cret", challenge, q))) << "field " << field;
  }
  Accept a;
  a.token = Random<16>();
  a.engine = "decode";
  a.worker_address = "w";
  const Mac lm = ListenerMac("s3cret", p.nonce, challenge, p.token, a);
  EXPECT_FALSE(SameMac(lm, mac));  // the two directions never share a MAC
  Accept b = a;
  b.by_address = true;
  EXPECT_FALSE(SameMac(lm, ListenerMac("s3cret", p.nonce, challenge, p.token, b)));
  Token other = p.token;
  other[0] ^= 1;
  EXPECT_FALSE(SameMac(lm, ListenerMac("s3cret", p.nonce, challenge, other, a)));
}

}  // namespace
}  // namespace membroker::detail::handshake
