// Structured data inside a mapped allocation: a Boost.Interprocess managed heap
// (offset_ptr containers, named objects) that any process can open at any
// address, guarded by a robust mutex so a process that dies holding the lock
// does not wedge the others.
//
//   RegionHeap heap = *RegionHeap::Create(mapping.data(), mapping.size());
//   Table* table = heap.Construct<Table>("stats", heap.allocator<Row>())->object;
//   ... another process, mapped elsewhere:
//   RegionHeap heap = *RegionHeap::Open(other.data(), other.size());
//   auto found = heap.Find<Table>("stats");   // NOT_FOUND, or the object and
//   if (found.ok() && found->previous_holder_died) { /* check the table */ }
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

// A process-shared robust mutex that lives in shared memory. Every pthread
// result is checked: a lock that cannot be initialised, or one that is no
// longer recoverable, is an error, never "locked".
class RobustMutex {
 public:
  Status Init() {
    pthread_mutexattr_t a;
    if (int rc = pthread_mutexattr_init(&a); rc != 0) return Failed("pthread_mutexattr_init", rc);
    int rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (rc == 0) rc = pthread_mutex_init(&m_, &a);
    pthread_mutexattr_destroy(&a);
    return rc == 0 ? Status::Ok() : Failed("pthread_mutex_init (robust, process-shared)", rc);
  }
  // Takes the lock. True if the previous holder died holding it: the lock is
  // taken and made consistent again, but what it guarded may be half-updated.
  // An error (and no lock) if the mutex is not recoverable or not a mutex.
  Result<bool> Lock() {
    int rc = pthread_mutex_lock(&m_);
    if (rc == 0) return false;
    if (rc == EOWNERDEAD) {
      if (int c = pthread_mutex_consistent(&m_); c != 0) {
        pthread_mutex_unlock(&m_);
        return Failed("pthread_mutex_consistent", c);
      }
      return true;
    }
    if (rc == ENOTRECOVERABLE)
      return Status(ErrorCode::kInternal,
                    "the region's lock is not recoverable: a holder died and the next one did not "
                    "make it consistent; recreate the region");
    return Failed("pthread_mutex_lock", rc);
  }
  void Unlock() { pthread_mutex_unlock(&m_); }

 private:
  static Status Failed(const char* call, int rc) {
    return Status(ErrorCode::kInternal, std::string(call) + " failed with error " + std::to_string(rc));
  }
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

  // Holds the heap's lock while it lives, if taking it succeeded (ok()).
  class Guard {
   public:
    explicit Guard(RobustMutex& m) : m_(&m) {
      Result<bool> r = m_->Lock();
      if (r.ok()) {
        owner_died_ = *r;
      } else {
        status_ = r.status();
        m_ = nullptr;
      }
    }
    ~Guard() {
      if (m_ != nullptr) m_->Unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    bool ok() const { return m_ != nullptr; }
    const Status& status() const { return status_; }
    // The lock's previous holder died holding it (its updates may be half done).
    bool previous_holder_died() const { return owner_died_; }

   private:
    RobustMutex* m_;
    Status status_;
    bool owner_died_ = false;
  };

  // Formats [base, base+size) (at least 4 KiB) as an empty heap.
  static Result<RegionHeap> Create(void* base, size_t size) {
    if (base == nullptr || size < 4096) return Status(ErrorCode::kParamInvalid, "a heap needs at least 4 KiB");
    auto* h = new (base) Header();
    MB_RETURN_IF_ERROR(h->mutex.Init());
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
  // Check guard.ok() (the lock may be unrecoverable) and
  // guard.previous_holder_died().
  Guard Lock() { return Guard(header_->mutex); }

  // What Construct and Find give: the object, and whether the heap lock's
  // previous holder died holding it (so what the heap holds, this object
  // included, may be half-updated: check it before trusting it).
  template <class T>
  struct Named {
    T* object = nullptr;
    bool previous_holder_died = false;
  };

  // A new named object: ALREADY_EXISTS if the name is taken,
  // RESOURCE_EXHAUSTED if the heap is full.
  template <class T, class... Args>
  Result<Named<T>> Construct(const char* name, Args&&... args) {
    Guard g = Lock();
    if (!g.ok()) return g.status();
    if (manager_.find<T>(name).first != nullptr)
      return Status(ErrorCode::kAlreadyExists, std::string("the heap already has \"") + name + "\"");
    T* made = nullptr;
    try {
      made = manager_.construct<T>(name, std::nothrow)(std::forward<Args>(args)...);
    } catch (const std::exception&) {
      made = nullptr;
    }
    if (made == nullptr)
      return Status(ErrorCode::kResourceExhausted, std::string("no room in the heap for \"") + name + "\"");
    return Named<T>{made, g.previous_holder_died()};
  }
  // NOT_FOUND if there is none.
  template <class T>
  Result<Named<T>> Find(const char* name) {
    Guard g = Lock();
    if (!g.ok()) return g.status();
    T* found = manager_.find<T>(name).first;
    if (found == nullptr) return Status(ErrorCode::kNotFound, std::string("no \"") + name + "\" in the heap");
    return Named<T>{found, g.previous_holder_died()};
  }
  // NOT_FOUND if there is none; true if the lock's previous holder had died.
  template <class T>
  Result<bool> Destroy(const char* name) {
    Guard g = Lock();
    if (!g.ok()) return g.status();
    if (!manager_.destroy<T>(name))
      return Status(ErrorCode::kNotFound, std::string("no \"") + name + "\" in the heap");
    return g.previous_holder_died();
  }
  template <class T>
  Allocator<T> allocator() { return Allocator<T>(manager_.get_segment_manager()); }
  Result<size_t> free_memory() {
    Guard g = Lock();
    if (!g.ok()) return g.status();
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
