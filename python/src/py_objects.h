// The Python objects of _membroker (python/src/): what each wraps and keeps
// alive, and the helpers every binding file uses.
//
// Lifetime: every Python object keeps what it depends on alive (a Mapping its
// Reservation, PhysicalHandle and Client), and memory stays mapped while any
// view of it exists: the buffer protocol's views, numpy arrays made from
// __array_interface__ and DLPack capsules all hold a reference to the
// Mapping, whose close() only refuses new views; the pages are unmapped when
// the last reference goes.
//
// GIL: every call that can block (a broker round trip, a wait) releases it.
#pragma once

#include <dlpack/dlpack.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "membroker/channel.h"
#include "membroker/client.h"
#include "membroker/ipc/page_policy.h"
#include "membroker/tensor_ring.h"
#include "membroker/transfer_engine.h"

namespace py = pybind11;

namespace membroker::python {

// The error a Status carries, raised as the Python class for its code
// (membroker.Error subclasses, registered by __init__.py).
struct BrokerError {
  ErrorCode code;
  std::string message;
};
// Runs fn (a call that may block on the broker) with the GIL released.
template <typename Fn>
auto Unlocked(Fn&& fn) {
  py::gil_scoped_release nogil;
  return fn();
}

[[noreturn]] inline void Raise(const Status& st) { throw BrokerError{st.code(), st.message()}; }
inline void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

inline PagePolicy PolicyFrom(const std::string& name) {
  if (auto p = ipc::PagePolicyFromName(name)) return static_cast<PagePolicy>(*p);  // the same values (client.cc)
  Raise(Status(ErrorCode::kParamInvalid, "unknown page policy '" + name + "' (" + ipc::PagePolicyNameList() + ")"));
}

struct PyClient {
  Client client;
};

struct PyHandle {
  std::shared_ptr<PyClient> owner;
  PhysicalHandle handle;
};

struct PyReservation {
  std::shared_ptr<PyClient> owner;
  Reservation reservation;
};

// A mapping and what it needs: Python references keep the reservation, the
// handle and the client alive for as long as the mapping (and its views) are.
struct PyMapping {
  py::object reservation;  // PyReservation
  py::object handle;       // PyHandle
  std::shared_ptr<PyClient> owner;
  Mapping mapping;
  bool read_only = false;
  bool closed = false;  // no new views; unmapped when the last reference goes

  void CheckOpen() const {
    if (closed) Raise(Status(ErrorCode::kNotMapped, "the mapping is closed (its existing views stay valid)"));
  }
  ~PyMapping() {
    py::gil_scoped_release nogil;  // an unmap and a one-way release: no Python needed
    mapping = Mapping();
  }
};

// A mapping of CUDA device memory: no buffer protocol (the CPU cannot touch
// it); __cuda_array_interface__ and DLPack (kDLCUDA) views instead.
struct PyDeviceMapping : PyMapping {
  int device = 0;
};

// A capsule over a mapping's bytes (dlpack.cc): DLPack 1.0's versioned one
// (with the read-only flag) when max_version asks for it, else the legacy one.
// `self` is the Python object of m, which the capsule keeps alive; device is
// {kDLCPU, 0} or {kDLCUDA, N}.
py::capsule DLPackCapsule(py::object self, PyMapping& m, DLDevice device, py::object max_version);

// Pinned host memory from MallocHost: freed (unmapped) when the last
// reference, views included, goes; close() only refuses new views.
struct PyHostBuffer {
  std::shared_ptr<PyClient> owner;
  void* data = nullptr;
  size_t size = 0;
  bool closed = false;
  ~PyHostBuffer() {
    if (data != nullptr) {
      py::gil_scoped_release nogil;
      (void)owner->client.FreeHost(data);
    }
  }
};

// A ring lives in a mapping, which it keeps alive.
struct PyRing {
  py::object mapping;  // PyMapping
  TensorRing ring;
  size_t OffsetOf(void* p) const {
    return static_cast<char*>(p) - static_cast<char*>(mapping.cast<PyMapping&>().mapping.data());
  }
};

inline py::dict SlotDict(const PyRing& r, const TensorRing::Slot& s) {
  py::dict d;
  d["sequence"] = s.sequence;
  d["offset"] = r.OffsetOf(s.data);  // into the ring's mapping
  d["capacity"] = s.capacity;
  d["frame_id"] = s.frame_id;
  d["bytes"] = s.bytes;
  return d;
}

inline TensorRing::Slot SlotFrom(const PyRing& r, py::dict d) {
  TensorRing::Slot s;
  s.sequence = d["sequence"].cast<uint64_t>();
  s.capacity = d["capacity"].cast<size_t>();
  s.data = static_cast<char*>(r.mapping.cast<PyMapping&>().mapping.data()) + d["offset"].cast<size_t>();
  return s;
}

// Channels: the native objects keep their client; a chunk keeps its channel
// (and so the mappings it points into) alive.
struct PyPublisher {
  std::shared_ptr<PyClient> owner;
  ChannelPublisher pub;
};
struct PySubscriber {
  std::shared_ptr<PyClient> owner;
  ChannelSubscriber sub;
};
struct PyChunk {
  py::object channel;  // PyPublisher or PySubscriber
  // Keeps the channel's memory mapped while this chunk (and so every view of
  // it: the buffer's exporter) lives, also past close() and leave().
  std::shared_ptr<const void> keep;
  Chunk chunk;
  bool writable = false;
  bool done = false;  // published, discarded or released: no more views
  ~PyChunk() {
    py::gil_scoped_release nogil;  // the last owner unmaps: no Python needed
    keep.reset();
  }
};

template <typename E>
E EnumFrom(const std::string& v, std::initializer_list<std::pair<const char*, E>> names, const char* what) {
  for (const auto& [n, e] : names)
    if (v == n) return e;
  Raise(Status(ErrorCode::kParamInvalid, std::string("unknown ") + what + " '" + v + "'"));
}
inline WakeMode WakeFrom(const std::string& v) {
  return EnumFrom<WakeMode>(v, {{"futex", WakeMode::kFutex}, {"poll", WakeMode::kPoll}}, "wake mode");
}

inline TransferOp OpFrom(const std::string& op) {
  if (op == "read") return READ;
  if (op == "write") return WRITE;
  Raise(Status(ErrorCode::kParamInvalid, "op is 'read' or 'write', not '" + op + "'"));
}

using PyDescs = std::vector<std::tuple<uintptr_t, uintptr_t, size_t>>;  // (local, remote, length)
inline std::vector<TransferOpDesc> DescsFrom(const PyDescs& descs) {
  std::vector<TransferOpDesc> d;
  d.reserve(descs.size());
  for (const auto& [local, remote, len] : descs) d.push_back({local, remote, len});
  return d;
}

// An engine keeps its client, and every mapping it registered, alive.
struct PyEngine {
  std::shared_ptr<PyClient> owner;
  std::unique_ptr<TransferEngine> engine;
  std::map<uint64_t, py::object> registered;  // handle -> PyMapping
};

// The classes, one file each group (the module itself: module.cc).
void BindClient(py::module_& mod);    // bind_client.cc
void BindMemory(py::module_& mod);    // bind_memory.cc: handles, reservations, mappings, host buffers
void BindPipeline(py::module_& mod);  // bind_pipeline.cc: tensor rings, channels, chunks
void BindEngine(py::module_& mod);    // bind_engine.cc
void BindKv(py::module_& mod);        // bind_kv.cc: KV-cache stores

}  // namespace membroker::python
