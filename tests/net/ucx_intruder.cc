// A hostile peer of a listening transfer engine, for tests/net/two_hosts.py:
// it passes (or fails) our handshake, then speaks UCX directly, not through
// our engine, and tries to reach memory the engine did not register for it.
// One line per attempt on stdout:
//
//   ucx_intruder ADDRESS SECRET_FILE|- TARGET LENGTH
//
//   handshake: admitted|refused|failed       our handshake (with the secret, if given);
//                                            refused or failed ends the run: without it
//                                            there is no UCX address to speak to
//   put: completed|no completion             UCX's own RMA put of LENGTH bytes of 0xee at
//                                            TARGET, flushed
//   forged write: code N|no answer           a data message writing at TARGET, marked
//                                            with a token the engine never handed out
//   write: code N                            a data message writing at TARGET
//   read: code N, M bytes                    a data message reading at TARGET
//
//   ucx_intruder ADDRESS SECRET_FILE TARGET LENGTH batch=VALID
//
//   handshake: admitted|...
//   batch: code N                            one batched write (kWriteV) of LENGTH
//                                            bytes at VALID (registered) and at TARGET
//
//   ucx_intruder ADDRESS SECRET_FILE TARGET LENGTH COUNT
//
//   handshake: admitted|...
//   flood: K of COUNT answered, then cut off|still served
//                                            COUNT reads of LENGTH at TARGET asked
//                                            at once, the answers left unread for
//                                            a second, then read for 10 s at most;
//                                            then one more read of 1 byte
//
// The test then checks TARGET's bytes on the listener, and that it still
// serves its own connectors. Every wait is bounded (1 s per attempt, 5 s for
// the connection). Exit 0 when every line was printed.
#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "transfer/net_address.h"
#include "transfer/ucx/dial.h"
#include "transfer/ucx/engine_wire.h"

using namespace membroker::detail;
using Clock = std::chrono::steady_clock;

namespace {

using wire::kAmId;
using wire::kDataAmId;

ucp_worker_h worker = nullptr;
std::vector<wire::Message> messages;
std::optional<wire::DataHeader> data_answer;
size_t data_answer_bytes = 0;
size_t answers = 0;
bool closed = false;

ucs_status_t OnAm(void*, const void*, size_t, void* data, size_t length, const ucp_am_recv_param_t* param) {
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
  auto m = wire::Decode({static_cast<const uint8_t*>(data), length});
  if (m.ok()) messages.push_back(std::move(*m));
  return UCS_OK;
}

ucs_status_t OnData(void*, const void* header, size_t header_length, void*, size_t length,
                    const ucp_am_recv_param_t*) {
  if (header_length < wire::kTokenBytes) return UCS_OK;
  auto h = wire::DecodeData({static_cast<const uint8_t*>(header) + wire::kTokenBytes, header_length - wire::kTokenBytes});
  if (h.ok()) data_answer = *h, data_answer_bytes = length, ++answers;
  return UCS_OK;
}

// Progresses until done() or the deadline; true when done.
template <typename F>
bool ProgressUntil(F done, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    ucp_worker_progress(worker);
  }
  return true;
}

// A request UCX may still own: waits for it (bounded); true when it completed.
bool Wait(ucs_status_ptr_t r, std::chrono::milliseconds within) {
  if (r == nullptr) return true;
  if (UCS_PTR_IS_ERR(r)) return false;
  const bool done = ProgressUntil([&] { return ucp_request_check_status(r) != UCS_INPROGRESS; }, within);
  const bool ok = done && ucp_request_check_status(r) == UCS_OK;
  if (done) ucp_request_free(r);  // one still running is left to UCX: the process exits soon
  return ok;
}

ucs_status_ptr_t SendAm(ucp_ep_h ep, unsigned id, const void* header, size_t header_length, const void* data,
                        size_t length) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  return ucp_am_send_nbx(ep, id, header, header_length, data, length, &p);
}

// UCX's own put, with an rkey of this process's making: over TCP, UCX emulates
// it with an active message that writes wherever it says.
const char* RawPut(ucp_context_h context, ucp_ep_h ep, uint64_t target, std::vector<char>& bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = bytes.data();
  mp.length = bytes.size();
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(context, &mp, &memh) != UCS_OK) return "cannot map";
  void* packed = nullptr;
  size_t packed_size = 0;
  ucp_rkey_h rkey = nullptr;
  const char* out = "cannot make an rkey";
  if (ucp_rkey_pack(context, memh, &packed, &packed_size) == UCS_OK) {
    if (ucp_ep_rkey_unpack(ep, packed, &rkey) == UCS_OK) {
      ucp_request_param_t p{};
      Wait(ucp_put_nbx(ep, bytes.data(), bytes.size(), target, rkey, &p), std::chrono::milliseconds(1000));
      out = Wait(ucp_ep_flush_nbx(ep, &p), std::chrono::milliseconds(1000)) ? "completed" : "no completion";
      ucp_rkey_destroy(rkey);
    }
    ucp_rkey_buffer_release(packed);
  }
  (void)ucp_mem_unmap(context, memh);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: ucx_intruder ADDRESS SECRET_FILE|- TARGET LENGTH [COUNT]\n");
    return 2;
  }
  auto addr = ParseHostPort(argv[1]);
  if (!addr.ok()) {
    std::fprintf(stderr, "ucx_intruder: %s\n", addr.status().ToString().c_str());
    return 2;
  }
  std::string secret;
  if (std::string(argv[2]) != "-") {
    std::ifstream f(argv[2]);
    std::getline(f, secret);
  }
  const uint64_t target = std::strtoull(argv[3], nullptr, 0);
  const size_t length = std::strtoull(argv[4], nullptr, 0);
  std::vector<char> bytes(length, static_cast<char>(0xee));

  // The engine's segment sizes (libclient/transfer/ucx/ucx_transport.cc): UCX's TCP
  // transport needs the peer's segments to fit its own receive segments.
  ::setenv("UCX_TCP_TX_SEG_SIZE", "128k", 0);
  ::setenv("UCX_TCP_RX_SEG_SIZE", "512k", 0);
  ucp_config_t* config = nullptr;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK || ucp_init(&params, config, &context) != UCS_OK) return 1;
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return 1;
  for (auto [id, cb] : {std::pair{kAmId, &OnAm}, std::pair{kDataAmId, &OnData}}) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB;
    am.id = id;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = cb;
    if (ucp_worker_set_am_recv_handler(worker, &am) != UCS_OK) return 1;
  }
  ucp_address_t* own = nullptr;
  size_t own_length = 0;
  if (ucp_worker_get_address(worker, &own, &own_length) != UCS_OK) return 1;
  DialRequest request{secret, "intruder", std::string(reinterpret_cast<const char*>(own), own_length),
                      handshake::Random<16>()};
  ucp_worker_release_address(worker, own);
  auto dialed = Dial(*addr, argv[1], Clock::now() + std::chrono::seconds(5), request);
  const bool refused = !dialed.ok() && dialed.status().code() == membroker::ErrorCode::kPermissionDenied;
  std::printf("handshake: %s\n", dialed.ok() ? "admitted" : refused ? "refused" : "failed");
  std::fflush(stdout);
  if (!dialed.ok()) {
    std::fprintf(stderr, "ucx_intruder: %s\n", dialed.status().ToString().c_str());
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return 0;
  }
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) { closed = true; };  // expected, when cut off
  ep_params.address = reinterpret_cast<const ucp_address_t*>(dialed->worker_address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) return 1;
  // The engine's Welcome, over UCX: the connection is up.
  ProgressUntil([] { return !messages.empty(); }, std::chrono::milliseconds(5000));
  const auto& token = dialed->token;

  const std::string mode = argc == 6 ? argv[5] : "";
  const bool batch = mode.rfind("batch=", 0) == 0;
  const uint64_t valid = batch ? std::strtoull(mode.c_str() + 6, nullptr, 0) : 0;
  const size_t flood = argc == 6 && !batch ? std::strtoull(argv[5], nullptr, 0) : 0;
  if (batch) {
    static std::string message;  // the table, then both segments' bytes: alive while UCX sends it
    message = wire::EncodeSegments({{valid, length}, {target, length}}) + std::string(2 * length, '\xee');
    static wire::RoutedDataHeader h;
    h = wire::EncodeRouted(token, {wire::DataKind::kWriteV, 0, 9, 2, 2 * length});
    data_answer.reset();
    Wait(SendAm(ep, kDataAmId, h.data(), h.size(), message.data(), message.size()), std::chrono::milliseconds(1000));
    if (ProgressUntil([] { return data_answer.has_value(); }, std::chrono::milliseconds(1000)))
      std::printf("batch: code %d\n", data_answer->code);
    else
      std::printf("batch: no answer\n");
  } else if (flood != 0) {
    // Asked without progressing: what the engine answers piles up at its end.
    // UCX reads a queued message's header when it sends it: each stays alive.
    std::vector<wire::RoutedDataHeader> headers(flood);
    std::vector<ucs_status_ptr_t> sent;
    for (size_t i = 0; i < flood; ++i) {
      headers[i] = wire::EncodeRouted(token, {wire::DataKind::kReadRequest, 0, i + 100, target, length});
      sent.push_back(SendAm(ep, kDataAmId, headers[i].data(), headers[i].size(), nullptr, 0));
    }
    ::sleep(1);
    ProgressUntil([&] { return closed || answers >= flood; }, std::chrono::milliseconds(10000));
    for (ucs_status_ptr_t r : sent)
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // UCX releases it when it completes
    // Cut off: the engine forgot the connection, so even a request it would
    // serve goes unanswered (its endpoint to us is closed; ours to it may not
    // hear of that before UCX's keepalive).
    static wire::RoutedDataHeader probe;
    probe = wire::EncodeRouted(token, {wire::DataKind::kReadRequest, 0, 99999, target, 1});
    data_answer.reset();
    const size_t before = answers;
    Wait(SendAm(ep, kDataAmId, probe.data(), probe.size(), nullptr, 0), std::chrono::milliseconds(1000));
    const bool served = ProgressUntil([&] { return answers > before; }, std::chrono::milliseconds(1000));
    std::printf("flood: %zu of %zu answered, then %s\n", before, flood, served ? "still served" : "cut off");
  } else {
    std::printf("put: %s\n", RawPut(context, ep, target, bytes));
  }
  std::fflush(stdout);

  static wire::RoutedDataHeader headers[3];  // alive while UCX may still send them
  handshake::Token forged = handshake::Random<16>();
  const struct {
    const char* name;
    wire::DataKind kind;
    const handshake::Token& token;
  } attempts[] = {{"forged write", wire::DataKind::kWrite, forged},
                  {"write", wire::DataKind::kWrite, token},
                  {"read", wire::DataKind::kReadRequest, token}};
  for (size_t i = 0; i < 3 && flood == 0 && !batch; ++i) {
    const bool write = attempts[i].kind == wire::DataKind::kWrite;
    headers[i] = wire::EncodeRouted(attempts[i].token, {attempts[i].kind, 0, 7, target, length});
    data_answer.reset();
    Wait(SendAm(ep, kDataAmId, headers[i].data(), headers[i].size(), write ? bytes.data() : nullptr,
                write ? length : 0),
         std::chrono::milliseconds(1000));
    const bool got = ProgressUntil([] { return data_answer.has_value(); }, std::chrono::milliseconds(1000));
    if (!got)
      std::printf("%s: no answer\n", attempts[i].name);
    else if (write)
      std::printf("%s: code %d\n", attempts[i].name, data_answer->code);
    else
      std::printf("%s: code %d, %zu bytes\n", attempts[i].name, data_answer->code, data_answer_bytes);
    std::fflush(stdout);
  }
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  Wait(ucp_ep_close_nbx(ep, &close), std::chrono::milliseconds(1000));
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return 0;
}
