// KvKeys: the keys of one KV batch (a reserve or a get), their bytes in one
// buffer and where each ends. A key of a content hash (32 bytes) does not fit
// a std::string's own buffer, so a vector of strings costs a heap block per
// key, made and freed on both sides of every batch; this costs two.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace membroker::ipc {

class KvKeys {
 public:
  KvKeys() = default;
  KvKeys(std::initializer_list<std::string_view> keys) : KvKeys(keys.begin(), keys.end()) {}
  template <std::input_iterator It>
  KvKeys(It first, It last) {
    if constexpr (std::forward_iterator<It>) {
      size_t n = 0, bytes = 0;
      for (It it = first; it != last; ++it, ++n) bytes += std::string_view(*it).size();
      reserve(n, bytes);
    }
    for (; first != last; ++first) push_back(*first);
  }
  template <std::ranges::input_range R>
    requires std::convertible_to<std::ranges::range_reference_t<const R>, std::string_view>
  KvKeys(const R& keys) : KvKeys(std::ranges::begin(keys), std::ranges::end(keys)) {}  // NOLINT: a batch of keys

  void push_back(std::string_view key) {
    bytes_.append(key);
    ends_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
  // The keys whose bytes are `bytes` and which end at `ends` (ascending, the
  // last at bytes.size(): the caller has checked them).
  void Assign(std::string_view bytes, std::span<const uint32_t> ends) {
    bytes_.assign(bytes);
    ends_.assign(ends.begin(), ends.end());
  }
  void reserve(size_t keys, size_t bytes) {
    ends_.reserve(keys);
    bytes_.reserve(bytes);
  }
  size_t size() const { return ends_.size(); }
  std::string_view bytes() const { return bytes_; }    // every key's, one after another
  const std::vector<uint32_t>& ends() const { return ends_; }  // past each key's last byte
  bool empty() const { return ends_.empty(); }
  std::string_view operator[](size_t i) const {
    const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
    return std::string_view(bytes_).substr(begin, ends_[i] - begin);
  }

  class Iterator {
   public:
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Iterator(const KvKeys* keys, size_t i) : keys_(keys), i_(i) {}
    std::string_view operator*() const { return (*keys_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator was = *this;
      ++i_;
      return was;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    const KvKeys* keys_ = nullptr;
    size_t i_ = 0;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, ends_.size()}; }

  bool operator==(const KvKeys&) const = default;

 private:
  std::string bytes_;
  std::vector<uint32_t> ends_;  // past each key's last byte in bytes_
};

}  // namespace membroker::ipc
