// KV-cache stores in the C API (membroker/membroker.h) over membroker/kv_store.h.
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "membroker/kv_store.h"
#include "membroker/membroker.h"

using namespace membroker;
using membroker::c_api::Done;
using membroker::c_api::Fail;
using membroker::c_api::Guard;

struct mb_kv_store {
  KvStore store;
};
struct mb_kv_leases {
  KvLeases leases;
};
struct mb_kv_put {
  KvStore store;  // Seal goes through it (the same store's state)
  KvPut put;
};

static_assert(MB_KV_LRU == static_cast<int>(KvEviction::kLru));

namespace {

// The keys as the C++ API takes them (their bytes are checked there).
Result<std::vector<std::string>> KeysOf(const mb_kv_key* keys, size_t n) {
  if (n != 0 && keys == nullptr) return Status(ErrorCode::kParamInvalid, "keys must not be NULL");
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (keys[i].data == nullptr && keys[i].size != 0)
      return Status(ErrorCode::kParamInvalid, "key " + std::to_string(i) + " has no data");
    out.emplace_back(static_cast<const char*>(keys[i].data), keys[i].size);
  }
  return out;
}

int Opened(Result<KvStore> r, mb_kv_store** out) {
  if (!r.ok()) return Fail(r.status());
  *out = new mb_kv_store{std::move(*r)};
  return MB_OK;
}

}  // namespace

extern "C" {

void mb_kv_store_options_init(mb_kv_store_options* options) {
  if (options == nullptr) return;
  const KvStoreOptions d;
  *options = {d.block_size, d.capacity, static_cast<int>(d.page_policy), static_cast<int>(d.eviction)};
}

int mb_kv_store_create(mb_client* client, const char* name, const mb_kv_store_options* options, mb_kv_store** out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && options && out, "client, name, options and out must not be NULL");
    *out = nullptr;
    MB_NEED(options->page_policy >= MB_NORMAL_ONLY && options->page_policy <= MB_HUGE1G_ONLY,
            "page_policy is one of enum mb_page_policy");
    MB_NEED(options->eviction == MB_KV_S3FIFO || options->eviction == MB_KV_LRU,
            "eviction is MB_KV_S3FIFO or MB_KV_LRU");
    KvStoreOptions o;
    o.block_size = options->block_size;
    o.capacity = options->capacity;
    o.page_policy = static_cast<PagePolicy>(options->page_policy);
    o.eviction = static_cast<KvEviction>(options->eviction);
    return Opened(KvStore::Create(client->client, name, o), out);
  });
}

int mb_kv_store_open(mb_client* client, const char* name, mb_kv_store** out) {
  return Guard([&]() -> int {
    MB_NEED(client && name && out, "client, name and out must not be NULL");
    *out = nullptr;
    return Opened(KvStore::Open(client->client, name), out);
  });
}

void mb_kv_store_close(mb_kv_store* store) { delete store; }

int mb_kv_store_drop(mb_client* client, const char* name) {
  return Guard([&]() -> int {
    MB_NEED(client && name, "client and name must not be NULL");
    return Done(KvStore::Drop(client->client, name));
  });
}

size_t mb_kv_store_block_size(const mb_kv_store* store) { return store ? store->store.block_size() : 0; }
size_t mb_kv_store_blocks(const mb_kv_store* store) { return store ? store->store.blocks() : 0; }

int mb_kv_exists(mb_kv_store* store, const mb_kv_key* keys, size_t n, uint8_t* found) {
  return Guard([&]() -> int {
    MB_NEED(store && (found || n == 0), "store and found must not be NULL");
    auto k = KeysOf(keys, n);
    if (!k.ok()) return Fail(k.status());
    auto r = store->store.Exists(*k);
    if (!r.ok()) return Fail(r.status());
    for (size_t i = 0; i < n; ++i) found[i] = (*r)[i] ? 1 : 0;
    return MB_OK;
  });
}

int mb_kv_prefix_hits(mb_kv_store* store, const mb_kv_key* keys, size_t n, size_t* hits) {
  return Guard([&]() -> int {
    MB_NEED(store && hits, "store and hits must not be NULL");
    auto k = KeysOf(keys, n);
    if (!k.ok()) return Fail(k.status());
    auto r = store->store.PrefixHits(*k);
    if (!r.ok()) return Fail(r.status());
    *hits = *r;
    return MB_OK;
  });
}

int mb_kv_get(mb_kv_store* store, const mb_kv_key* keys, size_t n, mb_kv_leases** out) {
  return Guard([&]() -> int {
    MB_NEED(store && out, "store and out must not be NULL");
    *out = nullptr;
    auto k = KeysOf(keys, n);
    if (!k.ok()) return Fail(k.status());
    auto r = store->store.Get(*k);
    if (!r.ok()) return Fail(r.status());
    *out = new mb_kv_leases{std::move(*r)};
    return MB_OK;
  });
}

size_t mb_kv_leases_count(const mb_kv_leases* leases) { return leases ? leases->leases.size() : 0; }
size_t mb_kv_leases_leading(const mb_kv_leases* leases) { return leases ? leases->leases.leading() : 0; }

const void* mb_kv_leases_block(const mb_kv_leases* leases, size_t i, size_t* length) {
  if (length != nullptr) *length = 0;
  if (leases == nullptr || i >= leases->leases.size() || !leases->leases.found(i)) return nullptr;
  const auto block = leases->leases.data(i);
  if (length != nullptr) *length = block.size();
  return block.data();
}

void mb_kv_leases_release(mb_kv_leases* leases) { delete leases; }  // ~KvLeases releases them

int mb_kv_reserve(mb_kv_store* store, const mb_kv_key* keys, size_t n, mb_kv_put** out) {
  return Guard([&]() -> int {
    MB_NEED(store && out, "store and out must not be NULL");
    *out = nullptr;
    auto k = KeysOf(keys, n);
    if (!k.ok()) return Fail(k.status());
    auto r = store->store.Reserve(*k);
    if (!r.ok()) return Fail(r.status());
    *out = new mb_kv_put{store->store, std::move(*r)};
    return MB_OK;
  });
}

size_t mb_kv_put_count(const mb_kv_put* put) { return put ? put->put.size() : 0; }

int mb_kv_put_status(const mb_kv_put* put, size_t i) {
  if (put == nullptr || i >= put->put.size()) return Fail(MB_PARAM_INVALID, "no such block in the put");
  return static_cast<int>(put->put.status(i));
}

void* mb_kv_put_block(const mb_kv_put* put, size_t i) {
  if (put == nullptr || i >= put->put.size()) return nullptr;
  const auto block = put->put.data(i);
  return block.empty() ? nullptr : block.data();
}

int mb_kv_put_set_length(mb_kv_put* put, size_t i, size_t length) {
  MB_NEED(put && i < put->put.size(), "no such block in the put");
  MB_NEED(length >= 1 && length <= put->store.block_size(), "a block's length is 1 to block_size bytes");
  put->put.set_length(i, length);
  return MB_OK;
}

int mb_kv_seal(mb_kv_put* put) {
  return Guard([&]() -> int {
    MB_NEED(put, "put must not be NULL");
    return Done(put->store.Seal(put->put));
  });
}

void mb_kv_put_free(mb_kv_put* put) { delete put; }  // ~KvPut aborts what is open

int mb_kv_put_batch(mb_kv_store* store, const mb_kv_key* keys, const void* const* values, const size_t* lengths,
                    size_t n, int* statuses) {
  return Guard([&]() -> int {
    MB_NEED(store && ((values && lengths && statuses) || n == 0),
            "store, values, lengths and statuses must not be NULL");
    auto k = KeysOf(keys, n);
    if (!k.ok()) return Fail(k.status());
    std::vector<std::span<const std::byte>> v;
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      MB_NEED(values[i] != nullptr, "a value is NULL");
      v.emplace_back(static_cast<const std::byte*>(values[i]), lengths[i]);
    }
    auto r = store->store.Put(*k, v);
    if (!r.ok()) return Fail(r.status());
    for (size_t i = 0; i < n; ++i) statuses[i] = static_cast<int>((*r)[i]);
    return MB_OK;
  });
}

}  // extern "C"
