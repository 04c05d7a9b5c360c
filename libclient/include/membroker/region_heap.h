// Structured data inside a mapped allocation: a Boost.Interprocess managed heap
// (offset_ptr containers, named objects) that any process can open at any
// address, guarded by a robust mutex so a process that dies holding the lock
// does not wedge the others.
//
//   RegionHeap heap = *RegionHeap::Create(mapping.data(), mapping.size());
//   auto* table = heap.Construct<Table>("stats", heap.allocator<Row>());
//   ... another process, mapped elsewhere:
//   RegionHeap heap = *RegionHeap::Open(other.data(), other.size());
//   auto* table = heap.Find<Table>("stats");
//
// Every call that allocates or looks up takes the heap's lock. Code that grows
// a container in the heap (push_back allocates) holds heap.Lock() meanwhile.
// Header-only, so it needs Boost's headers (libboost-dev) where it is used.
#pragma once

#include <pthread.h>

#include <boost/interprocess/allocators/allocator.hpp>
#include <boost/interprocess/indexes/iset_index.hpp>
#include <boost/interprocess/managed_external_buffer.hpp>
#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>
#include <cerrno>
#include <cstdint>
#include <new>
#include <utility>

#include "membroker/status.h"

namespace membroker {

// A process-shared robust mutex that lives in shared memory.
class RobustMutex {
 public:
  void Init() {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&m_, &a);
    pthread_mutexattr_destroy(&a);
  }
  // True if the previous holder died holding it: the lock is taken and made
  // consistent again, but what it guarded may be half-updated.
  bool lock() {
    if (pthread_mutex_lock(&m_) == EOWNERDEAD) {
      pthread_mutex_consistent(&m_);
      return true;
    }
    return false;
  }
  void unlock() { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_;
};

class RegionHeap {
 public:
  // The heap's own lock is the robust mutex below, so Boost's is a no-op.
  using Manager = boost::interprocess::basic_managed_external_buffer<
      char, boost::interprocess::rbtree_best_fit<boost::interprocess::null_mutex_family>,
      boost::interprocess::iset_index>;
  template <class T>
  using Allocator = boost::interprocess::allocator<T, Manager::segment_manager>;

  class Guard {
   public:
    explicit Guard(RobustMutex& m) : m_(&m) { owner_died_ = m_->lock(); }
    ~Guard() { m_->unlock(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    bool previous_holder_died() const { return owner_died_; }

   private:
    RobustMutex* m_;
    bool owner_died_ = false;
  };

  // Formats [base, base+size) (at least 4 KiB) as an empty heap.
  static Result<RegionHeap> Create(void* base, size_t size) {
    if (base == nullptr || size < 4096) return Status(ErrorCode::kParamInvalid, "a heap needs at least 4 KiB");
    auto* h = new (base) Header();
    h->mutex.Init();
    try {
      RegionHeap heap(h, size);
      heap.manager_ = Manager(boost::interprocess::create_only, h + 1, size - sizeof(Header));
      h->magic = kMagic;  // last: Open refuses a half-made heap
      return heap;
    } catch (const std::exception& e) {
      return Status(ErrorCode::kResourceExhausted, std::string("heap creation failed: ") + e.what());
    }
  }
  // Opens a heap another process created, wherever this process mapped it.
  static Result<RegionHeap> Open(void* base, size_t size) {
    auto* h = static_cast<Header*>(base);
    if (base == nullptr || size < 4096 || h->magic != kMagic)
      return Status(ErrorCode::kParamInvalid, "no membroker heap at this address");
    try {
      RegionHeap heap(h, size);
      heap.manager_ = Manager(boost::interprocess::open_only, h + 1, size - sizeof(Header));
      return heap;
    } catch (const std::exception& e) {
      return Status(ErrorCode::kParamInvalid, std::string("heap open failed: ") + e.what());
    }
  }

  RegionHeap(RegionHeap&&) = default;
  RegionHeap& operator=(RegionHeap&&) = default;

  // Holds the heap's lock: grow containers that live in the heap under it.
  Guard Lock() { return Guard(header_->mutex); }

  // A named object (constructed once; nullptr if the name exists or memory runs out).
  template <class T, class... Args>
  T* Construct(const char* name, Args&&... args) {
    Guard g = Lock();
    try {
      return manager_.construct<T>(name, std::nothrow)(std::forward<Args>(args)...);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  template <class T>
  T* Find(const char* name) {
    Guard g = Lock();
    return manager_.find<T>(name).first;
  }
  template <class T>
  bool Destroy(const char* name) {
    Guard g = Lock();
    return manager_.destroy<T>(name);
  }
  template <class T>
  Allocator<T> allocator() { return Allocator<T>(manager_.get_segment_manager()); }
  size_t free_memory() {
    Guard g = Lock();
    return manager_.get_free_memory();
  }

 private:
  static constexpr uint64_t kMagic = 0x4d4248454150ull;  // "MBHEAP"
  struct alignas(64) Header {
    uint64_t magic = 0;
    RobustMutex mutex;
  };
  RegionHeap(Header* h, size_t) : header_(h) {}
  Header* header_ = nullptr;
  Manager manager_;
};

}  // namespace membroker
