// _membroker: the C++ client library for Python (pybind11). The Pythonic
// layer - error classes, tensors, the test fixture - is membroker/__init__.py
// and friends; this file only wraps the C++ API.
//
// Lifetime: every Python object keeps what it depends on alive (a Mapping its
// Reservation, PhysicalHandle and Client), and memory stays mapped while any
// view of it exists: the buffer protocol's views, numpy arrays made from
// __array_interface__ and DLPack capsules all hold a reference to the
// Mapping, whose close() only refuses new views; the pages are unmapped when
// the last reference goes.
//
// GIL: every call that can block (a broker round trip, a wait) releases it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "membroker/client.h"
#include "membroker/channel.h"
#include "membroker/tensor_ring.h"
#include "membroker/transfer_engine.h"
#include "membroker/ipc/page_policy.h"

namespace py = pybind11;
using namespace membroker;

namespace {

// The error a Status carries, raised as the Python class for its code
// (membroker.Error subclasses, registered by __init__.py).
struct BrokerError {
  ErrorCode code;
  std::string message;
};
// code (int) -> class. A handle that is never released: the interpreter may
// already be gone when static destructors run.
py::handle g_error_classes;

// Runs fn (a call that may block on the broker) with the GIL released.
template <typename Fn>
auto Unlocked(Fn&& fn) {
  py::gil_scoped_release nogil;
  return fn();
}

[[noreturn]] void Raise(const Status& st) { throw BrokerError{st.code(), st.message()}; }
void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

PagePolicy PolicyFrom(const std::string& name) {
  if (auto p = ipc::PagePolicyFromName(name)) return static_cast<PagePolicy>(*p);  // the same values (client.cc)
  Raise(Status(ErrorCode::kParamInvalid,
               "unknown page policy '" + name + "' (" + ipc::PagePolicyNameList() + ")"));
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

// DLPack, legacy (DLManagedTensor, capsule "dltensor") and versioned
// (DLPack 1.0's DLManagedTensorVersioned, capsule "dltensor_versioned", which
// carries the read-only flag). The versioned struct is declared here from the
// DLPack 1.0 specification; Debian's libdlpack-dev 0.6 predates it.
struct DLPackVersion10 {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned10 {
  DLPackVersion10 version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned10* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1ull << 0;

// What a capsule owns: the shape, and a reference to the mapping object.
struct DLPackOwner {
  int64_t shape[1];
  PyObject* mapping;  // strong reference, dropped by the deleter
};

void ReleaseOwner(DLPackOwner* owner) {
  py::gil_scoped_acquire gil;  // consumers may call deleters without the GIL
  Py_XDECREF(owner->mapping);
  delete owner;
}

DLTensor MakeTensor(PyMapping& m, DLPackOwner* owner) {
  DLTensor t{};
  t.data = m.mapping.data();
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLUInt, 8, 1};
  owner->shape[0] = static_cast<int64_t>(m.mapping.size());
  t.shape = owner->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  return t;
}

py::capsule DLPackCapsule(py::object self, py::object max_version) {
  PyMapping& m = self.cast<PyMapping&>();
  m.CheckOpen();
  auto* owner = new DLPackOwner{{0}, self.ptr()};
  Py_INCREF(self.ptr());
  bool versioned = false;
  if (!max_version.is_none()) {
    auto v = max_version.cast<std::pair<int, int>>();
    versioned = v.first >= 1;
  }
  if (versioned) {
    auto* t = new DLManagedTensorVersioned10{};
    t->version = {1, 0};
    t->manager_ctx = owner;
    t->deleter = [](DLManagedTensorVersioned10* self) {
      ReleaseOwner(static_cast<DLPackOwner*>(self->manager_ctx));
      delete self;
    };
    t->flags = m.read_only ? kDLFlagReadOnly : 0;
    t->dl_tensor = MakeTensor(m, owner);
    return py::capsule(t, "dltensor_versioned", [](PyObject* cap) {
      // Not consumed (still named so): the producer frees it.
      if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        auto* t = static_cast<DLManagedTensorVersioned10*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
        t->deleter(t);
      }
    });
  }
  if (m.read_only)
    Raise(Status(ErrorCode::kPermissionDenied,
                 "this mapping is read-only, and the legacy DLPack capsule cannot say so: pass "
                 "max_version=(1, 0), or use memoryview / __array_interface__"));
  auto* t = new DLManagedTensor{};
  t->manager_ctx = owner;
  t->deleter = [](DLManagedTensor* self) {
    ReleaseOwner(static_cast<DLPackOwner*>(self->manager_ctx));
    delete self;
  };
  t->dl_tensor = MakeTensor(m, owner);
  return py::capsule(t, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      t->deleter(t);
    }
  });
}

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

py::dict SlotDict(const PyRing& r, const TensorRing::Slot& s) {
  py::dict d;
  d["sequence"] = s.sequence;
  d["offset"] = r.OffsetOf(s.data);  // into the ring's mapping
  d["capacity"] = s.capacity;
  d["frame_id"] = s.frame_id;
  d["bytes"] = s.bytes;
  return d;
}

TensorRing::Slot SlotFrom(const PyRing& r, py::dict d) {
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
WakeMode WakeFrom(const std::string& v) {
  return EnumFrom<WakeMode>(v, {{"futex", WakeMode::kFutex}, {"poll", WakeMode::kPoll}}, "wake mode");
}

TransferOp OpFrom(const std::string& op) {
  if (op == "read") return READ;
  if (op == "write") return WRITE;
  Raise(Status(ErrorCode::kParamInvalid, "op is 'read' or 'write', not '" + op + "'"));
}

using PyDescs = std::vector<std::tuple<uintptr_t, uintptr_t, size_t>>;  // (local, remote, length)
std::vector<TransferOpDesc> DescsFrom(const PyDescs& descs) {
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

}  // namespace

PYBIND11_MODULE(_membroker, mod) {
  mod.doc() = "membroker's C++ client library (use the membroker package, not this module)";

  mod.def("_set_error_classes", [](py::dict classes) {
    g_error_classes.dec_ref();
    g_error_classes = classes.inc_ref();
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BrokerError& e) {
      py::object cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
      const int code = static_cast<int>(e.code);
      if (g_error_classes) {
        py::dict classes = py::reinterpret_borrow<py::dict>(g_error_classes);
        if (classes.contains(py::int_(code))) cls = classes[py::int_(code)];
      }
      PyErr_SetObject(cls.ptr(), py::make_tuple(e.message, code).ptr());
    }
  });
  mod.def("error_code_name", [](int code) { return std::string(ErrorCodeName(static_cast<ErrorCode>(code))); });
  // The one list of error codes (status.h): (code, wire name, Python class name).
  mod.def("error_codes", [] {
    std::vector<std::tuple<int, std::string, std::string>> codes;
#define MEMBROKER_PY_ERROR(value, enumerator, wire, py) \
  if (value != 0) codes.emplace_back(value, #wire, #py);
    MEMBROKER_ERROR_CODES(MEMBROKER_PY_ERROR)
#undef MEMBROKER_PY_ERROR
    return codes;
  });

  py::class_<PyClient, std::shared_ptr<PyClient>>(mod, "Client")
      .def_static(
          "connect",
          [](const std::string& socket, const std::string& name, uint32_t call_timeout_ms, bool reattach) {
            ConnectOptions o{socket, name};
            o.call_timeout_ms = call_timeout_ms;
            o.reattach = reattach;
            Result<Client> c = Unlocked([&] { return Client::Connect(o); });
            auto pc = std::make_shared<PyClient>();
            pc->client = Take(std::move(c));
            return pc;
          },
          py::arg("socket"), py::arg("name") = "", py::arg("call_timeout_ms") = 30000, py::arg("reattach") = true)
      .def_property_readonly("client_id", [](PyClient& c) { return c.client.client_id(); })
      .def("ping",
           [](PyClient& c) {
             Check(Unlocked([&] { return c.client.Ping(); }));
           })
      .def(
          "granularity",
          [](PyClient& c, const std::string& policy, bool recommended) {
            AllocationProp p;
            p.page_policy = PolicyFrom(policy);
            return Take(c.client.GetAllocationGranularity(
                p, recommended ? GranularityOption::kRecommended : GranularityOption::kMinimum));
          },
          py::arg("page_policy") = "normal", py::arg("recommended") = false)
      .def(
          "malloc_physical",
          [](std::shared_ptr<PyClient> c, size_t size, const std::string& policy, bool pinned,
             bool same_address, bool exported, uint32_t export_flags) {
            AllocationProp p;
            p.page_policy = PolicyFrom(policy);
            p.pinned = pinned;
            p.same_address = same_address;
            p.exported = exported;
            p.export_flags = export_flags;
            Result<PhysicalHandle> h = Unlocked([&] { return c->client.MallocPhysical(size, p); });
            auto ph = std::make_shared<PyHandle>();
            ph->owner = c;
            ph->handle = Take(std::move(h));
            return ph;
          },
          py::arg("size"), py::arg("page_policy") = "normal", py::arg("pinned") = false,
          py::arg("same_address") = false, py::arg("exported") = false, py::arg("export_flags") = 0)
      .def(
          "reserve",
          [](std::shared_ptr<PyClient> c, size_t size, size_t alignment) {
            auto r = std::make_shared<PyReservation>();
            r->owner = c;
            r->reservation = Take(c->client.ReserveMemAddress(size, alignment));
            return r;
          },
          py::arg("size"), py::arg("alignment") = 0)
      .def(
          "map",
          [](std::shared_ptr<PyClient> c, py::object reservation, py::object handle, size_t offset_in_reservation,
             size_t size, size_t offset, bool populate) {
            PyReservation& r = reservation.cast<PyReservation&>();
            PyHandle& h = handle.cast<PyHandle&>();
            if (size == 0) size = h.handle.size() - std::min(offset, h.handle.size());
            auto m = std::make_shared<PyMapping>();
            m->reservation = reservation;
            m->handle = handle;
            m->owner = c;
            m->read_only = h.handle.read_only();
            m->mapping = Take(c->client.MapMem(r.reservation.at(offset_in_reservation), size, offset, h.handle,
                                               populate ? kMapPopulate : 0));
            return m;
          },
          py::arg("reservation"), py::arg("handle"), py::arg("at") = 0, py::arg("size") = 0,
          py::arg("offset") = 0, py::arg("populate") = false)
      .def(
          "set_access",
          [](PyClient& c, PyMapping& m, const std::string& access) {
            m.CheckOpen();
            Access a = access == "none" ? Access::kNone
                       : access == "read" ? Access::kRead
                       : access == "read-write"
                           ? Access::kReadWrite
                           : (Raise(Status(ErrorCode::kParamInvalid,
                                           "access is 'none', 'read' or 'read-write', not '" + access + "'")),
                              Access::kNone);
            Check(c.client.MemSetAccess(m.mapping.data(), m.mapping.size(), a));
          },
          py::arg("mapping"), py::arg("access"))
      .def(
          "export",
          [](PyClient& c, PyHandle& h, bool no_pid_check, bool read_only) {
            uint32_t flags = (no_pid_check ? kExportNoPidCheck : 0) | (read_only ? kExportReadOnly : 0);
            Result<std::string> t = Unlocked([&] { return c.client.ExportToShareableHandle(h.handle, flags); });
            return Take(std::move(t));
          },
          py::arg("handle"), py::arg("no_pid_check") = false, py::arg("read_only") = false)
      .def("set_pids",
           [](PyClient& c, const std::string& token, std::vector<pid_t> pids) {
             Check(Unlocked([&] { return c.client.SetPidToShareableHandle(token, pids); }));
           })
      .def("import_handle",
           [](std::shared_ptr<PyClient> c, const std::string& token) {
             Result<PhysicalHandle> h = Unlocked([&] { return c->client.ImportFromShareableHandle(token); });
             auto ph = std::make_shared<PyHandle>();
             ph->owner = c;
             ph->handle = Take(std::move(h));
             return ph;
           })
      .def(
          "publish",
          [](PyClient& c, PyHandle& h, const std::string& name, bool read_only, bool persist,
             py::bytes metadata, bool replace) {
            uint32_t flags = (read_only ? kPublishReadOnly : 0) | (persist ? kPublishPersist : 0) |
                             (replace ? kPublishReplace : 0);
            std::string meta = metadata;
            Check(Unlocked([&] { return c.client.Publish(name, h.handle, flags, meta); }));
          },
          py::arg("handle"), py::arg("name"), py::arg("read_only") = false, py::arg("persist") = false,
          py::arg("metadata") = py::bytes(), py::arg("replace") = false)
      .def(
          "lookup",
          [](std::shared_ptr<PyClient> c, const std::string& name, int timeout_ms) {
            Result<PhysicalHandle> h = Unlocked([&] { return c->client.Lookup(name, timeout_ms); });
            auto ph = std::make_shared<PyHandle>();
            ph->owner = c;
            ph->handle = Take(std::move(h));
            return ph;
          },
          py::arg("name"), py::arg("timeout_ms") = 0)
      .def("unpublish",
           [](PyClient& c, const std::string& name) {
             Check(Unlocked([&] { return c.client.Unpublish(name); }));
           })
      .def(
          "list_names",
          [](PyClient& c, const std::string& prefix) {
            Result<std::vector<NamedObjectInfo>> r = Unlocked([&] { return c.client.ListNames(prefix); });
            py::list out;
            for (const NamedObjectInfo& o : Take(std::move(r))) {
              py::dict d;
              d["name"] = o.name;
              d["allocation"] = o.allocation;
              d["size"] = o.size;
              d["read_only"] = o.read_only;
              d["persist"] = o.persist;
              d["publisher_pid"] = o.publisher_pid;
              out.append(d);
            }
            return out;
          },
          py::arg("prefix") = "")
      .def_property_readonly("async_errors", [](PyClient& c) { return c.client.async_errors(); })
      .def_property_readonly("reattaches", [](PyClient& c) { return c.client.reattaches(); })
      .def("wait_for_reattach",
           [](PyClient& c, uint64_t count, int timeout_ms) {
             Status st = Unlocked([&] { return c.client.WaitForReattach(count, timeout_ms); });
             Check(st);
           },
           py::arg("count"), py::arg("timeout_ms"))
      .def("malloc_host",
           [](std::shared_ptr<PyClient> c, size_t size) {
             auto b = std::make_shared<PyHostBuffer>();
             b->owner = c;
             b->data = Take(Unlocked([&] { return c->client.MallocHost(size); }));
             b->size = size;
             return b;
           })
      .def("host_register",
           [](PyClient& c, py::buffer obj) {
             py::buffer_info info = obj.request(/*writable=*/true);
             const size_t bytes = static_cast<size_t>(info.size * info.itemsize);
             Check(Unlocked([&] { return c.client.HostRegister(info.ptr, bytes); }));
             return reinterpret_cast<uintptr_t>(info.ptr);
           })
      .def("host_unregister",
           [](PyClient& c, uintptr_t address) {
             Check(Unlocked([&] { return c.client.HostUnregister(reinterpret_cast<void*>(address)); }));
           })
      .def("subscribe",
           [](PyClient& c, const std::string& prefix) { Check(Unlocked([&] { return c.client.Subscribe(prefix); })); })
      .def("wait_events",
           [](PyClient& c, int timeout_ms) {
             NameEvents ev = Take(Unlocked([&] { return c.client.WaitEvents(timeout_ms); }));
             static const char* kKinds[] = {"published", "unpublished", "holder_died"};
             py::list out;
             for (const NameEvent& e : ev.events) {
               py::dict d;
               d["kind"] = kKinds[static_cast<int>(e.kind) % 3];
               d["name"] = e.name;
               d["allocation"] = e.allocation;
               d["pid"] = e.pid;
               out.append(d);
             }
             return py::make_tuple(out, ev.dropped);
           },
           py::arg("timeout_ms") = 0)
      // For bench/python_handoff.py: n Pings looped in C++, the seconds they took.
      .def("ping_loop", [](PyClient& c, int n) {
        py::gil_scoped_release nogil;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) Check(c.client.Ping());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });

  py::class_<PyHandle, std::shared_ptr<PyHandle>>(mod, "PhysicalHandle")
      .def_property_readonly("id", [](PyHandle& h) { return h.handle.id(); })
      .def_property_readonly("size", [](PyHandle& h) { return h.handle.size(); })
      .def_property_readonly("page_size", [](PyHandle& h) { return h.handle.page_size(); })
      .def_property_readonly("read_only", [](PyHandle& h) { return h.handle.read_only(); })
      .def_property_readonly("pinned", [](PyHandle& h) { return h.handle.pinned(); })
      .def_property_readonly("from_pool", [](PyHandle& h) { return h.handle.from_pool(); })
      .def_property_readonly("export_token", [](PyHandle& h) { return h.handle.export_token(); })
      .def_property_readonly("metadata", [](PyHandle& h) { return py::bytes(h.handle.metadata()); })
      .def_property_readonly("valid", [](PyHandle& h) { return h.handle.valid(); })
      .def("free", [](PyHandle& h) { Check(h.owner->client.FreePhysical(h.handle)); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyHandle& h, py::args) {
        if (h.handle.valid()) (void)h.owner->client.FreePhysical(h.handle);
      });

  py::class_<PyReservation, std::shared_ptr<PyReservation>>(mod, "Reservation")
      .def_property_readonly("base", [](PyReservation& r) { return reinterpret_cast<uintptr_t>(r.reservation.base()); })
      .def_property_readonly("size", [](PyReservation& r) { return r.reservation.size(); });

  py::class_<PyMapping, std::shared_ptr<PyMapping>>(mod, "Mapping", py::buffer_protocol())
      // A buffer getter must not throw (pybind11 would abort): a closed
      // mapping offers an empty buffer instead of a new view.
      .def_buffer([](PyMapping& m) {
        const py::ssize_t n = m.closed ? 0 : static_cast<py::ssize_t>(m.mapping.size());
        return py::buffer_info(m.mapping.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {n}, {1},
                               m.read_only);
      })
      .def_property_readonly("address", [](PyMapping& m) { return reinterpret_cast<uintptr_t>(m.mapping.data()); })
      .def_property_readonly("size", [](PyMapping& m) { return m.mapping.size(); })
      .def_property_readonly("read_only", [](PyMapping& m) { return m.read_only; })
      .def_property_readonly("closed", [](PyMapping& m) { return m.closed; })
      .def_property_readonly("__array_interface__",
                             [](PyMapping& m) {
                               m.CheckOpen();
                               py::dict d;
                               d["shape"] = py::make_tuple(m.mapping.size());
                               d["typestr"] = "|u1";
                               d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(m.mapping.data()), m.read_only);
                               d["version"] = 3;
                               return d;
                             })
      .def("__dlpack__",
           [](py::object self, py::object stream, py::object max_version) {
             (void)stream;  // host memory: nothing to synchronise
             return DLPackCapsule(self, max_version);
           },
           py::arg("stream") = py::none(), py::arg("max_version") = py::none())
      .def("__dlpack_device__", [](PyMapping&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def("close", [](PyMapping& m) { m.closed = true; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyMapping& m, py::args) { m.closed = true; });

  py::class_<PyHostBuffer, std::shared_ptr<PyHostBuffer>>(mod, "HostBuffer", py::buffer_protocol())
      .def_buffer([](PyHostBuffer& b) {  // must not throw: closed offers an empty buffer
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.closed ? 0 : b.size)}, {1}, false);
      })
      .def_property_readonly("address", [](PyHostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data); })
      .def_property_readonly("size", [](PyHostBuffer& b) { return b.size; })
      .def("close", [](PyHostBuffer& b) { b.closed = true; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyHostBuffer& b, py::args) { b.closed = true; });

  py::class_<PyRing, std::shared_ptr<PyRing>>(mod, "TensorRing")
      .def_static("create",
                  [](py::object mapping, uint32_t slots, size_t slot_bytes) {
                    PyMapping& m = mapping.cast<PyMapping&>();
                    m.CheckOpen();
                    auto r = std::make_shared<PyRing>();
                    r->mapping = mapping;
                    r->ring = Take(TensorRing::Create(m.mapping.data(), m.mapping.size(), slots, slot_bytes));
                    return r;
                  })
      .def_static("attach",
                  [](py::object mapping) {
                    PyMapping& m = mapping.cast<PyMapping&>();
                    m.CheckOpen();
                    auto r = std::make_shared<PyRing>();
                    r->mapping = mapping;
                    r->ring = Take(TensorRing::Attach(m.mapping.data(), m.mapping.size()));
                    return r;
                  })
      .def_static("bytes_for", &TensorRing::BytesFor)
      .def_property_readonly("mapping", [](PyRing& r) { return r.mapping; })
      .def("acquire_for_write",
           [](PyRing& r, int timeout_ms) {
             Result<TensorRing::Slot> s = Unlocked([&] { return r.ring.AcquireForWrite(timeout_ms); });
             return SlotDict(r, Take(std::move(s)));
           })
      .def("publish",
           [](PyRing& r, py::dict slot, uint64_t frame_id, size_t bytes) {
             Check(r.ring.Publish(SlotFrom(r, slot), frame_id, bytes));
           })
      .def("acquire_for_read",
           [](PyRing& r, int timeout_ms) {
             Result<TensorRing::Slot> s = Unlocked([&] { return r.ring.AcquireForRead(timeout_ms); });
             return SlotDict(r, Take(std::move(s)));
           })
      .def("release", [](PyRing& r, py::dict slot) { Check(r.ring.Release(SlotFrom(r, slot))); })
      .def_property_readonly("last_published_frame", [](PyRing& r) { return r.ring.last_published_frame(); })
      .def_property_readonly("published", [](PyRing& r) { return r.ring.published(); })
      .def_property_readonly("released", [](PyRing& r) { return r.ring.released(); })
      .def_property_readonly("slots", [](PyRing& r) { return r.ring.slots(); })
      .def_property_readonly("slot_bytes", [](PyRing& r) { return r.ring.slot_bytes(); });

  py::class_<PyChunk, std::shared_ptr<PyChunk>>(mod, "Chunk", py::buffer_protocol())
      // Must not throw: a chunk that is done offers an empty buffer.
      .def_buffer([](PyChunk& c) {
        const py::ssize_t n = c.done ? 0 : static_cast<py::ssize_t>(c.writable ? c.chunk.capacity : c.chunk.size);
        return py::buffer_info(c.chunk.data, 1, py::format_descriptor<uint8_t>::format(), 1, {n}, {1}, !c.writable);
      })
      .def_property_readonly("index", [](PyChunk& c) { return c.chunk.index; })
      .def_property_readonly("capacity", [](PyChunk& c) { return c.chunk.capacity; })
      .def_property("size", [](PyChunk& c) { return c.chunk.size; },
                    [](PyChunk& c, size_t n) {
                      if (!c.writable) Raise(Status(ErrorCode::kParamInvalid, "a received chunk's size is the publisher's"));
                      c.chunk.size = n;
                    })
      .def_property_readonly("sequence", [](PyChunk& c) { return c.chunk.sequence; })
      .def_property_readonly("writable", [](PyChunk& c) { return c.writable; })
      .def_property_readonly("done", [](PyChunk& c) { return c.done; });

  py::class_<PyPublisher, std::shared_ptr<PyPublisher>>(mod, "ChannelPublisher")
      .def(py::init([](std::shared_ptr<PyClient> c, const std::string& name, uint32_t chunks, size_t chunk_bytes,
                       uint32_t queue_depth, const std::string& mode, const std::string& when_full,
                       const std::string& wake, bool read_only_chunks, const std::string& page_policy) {
             ChannelOptions o;
             o.chunks = chunks;
             o.chunk_bytes = chunk_bytes;
             o.queue_depth = queue_depth;
             o.mode = EnumFrom<ChannelMode>(mode, {{"broadcast", ChannelMode::kBroadcast},
                                                   {"work_sharing", ChannelMode::kWorkSharing}}, "channel mode");
             o.when_full = EnumFrom<WhenFull>(when_full, {{"wait", WhenFull::kWait}, {"drop_oldest", WhenFull::kDropOldest}},
                                              "when_full policy");
             o.wake = WakeFrom(wake);
             o.read_only_chunks = read_only_chunks;
             o.page_policy = PolicyFrom(page_policy);
             auto p = std::make_shared<PyPublisher>();
             p->owner = c;
             p->pub = Take(Unlocked([&] { return ChannelPublisher::Create(c->client, name, o); }));
             return p;
           }),
           py::arg("client"), py::arg("name"), py::arg("chunks") = 64, py::arg("chunk_bytes") = 1 << 20,
           py::arg("queue_depth") = 16, py::arg("mode") = "broadcast", py::arg("when_full") = "wait",
           py::arg("wake") = "futex", py::arg("read_only_chunks") = true, py::arg("page_policy") = "normal")
      .def("loan",
           [](py::object self, size_t nbytes, int timeout_ms) {
             PyPublisher& p = self.cast<PyPublisher&>();
             auto c = std::make_shared<PyChunk>();
             c->channel = self;
             c->writable = true;
             c->chunk = Take(Unlocked([&] { return p.pub.Loan(nbytes, timeout_ms); }));
             c->keep = p.pub.KeepMapped();
             return c;
           },
           py::arg("nbytes"), py::arg("timeout_ms") = 1000)
      .def("publish",
           [](PyPublisher& p, PyChunk& c, int timeout_ms) {
             if (c.done || !c.writable) Raise(Status(ErrorCode::kParamInvalid, "not a loaned chunk"));
             Check(Unlocked([&] { return p.pub.Publish(c.chunk, timeout_ms); }));
             c.done = true;
           },
           py::arg("chunk"), py::arg("timeout_ms") = 1000)
      .def("discard",
           [](PyPublisher& p, PyChunk& c) {
             if (c.done || !c.writable) Raise(Status(ErrorCode::kParamInvalid, "not a loaned chunk"));
             Check(p.pub.Discard(c.chunk));
             c.done = true;
           })
      .def("wait_for_subscribers",
           [](PyPublisher& p, uint32_t n, int timeout_ms) { Check(Unlocked([&] { return p.pub.WaitForSubscribers(n, timeout_ms); })); },
           py::arg("n"), py::arg("timeout_ms") = 1000)
      .def("reap", [](PyPublisher& p) { return p.pub.Reap(); })
      .def("close", [](PyPublisher& p) { p.pub = ChannelPublisher(); })
      .def_property_readonly("stats", [](PyPublisher& p) {
        const ChannelStats s = p.pub.stats();
        py::dict d;
        d["published"] = s.published;
        d["dropped"] = s.dropped;
        d["unreceived"] = s.unreceived;
        d["reaped"] = s.reaped;
        d["reclaimed"] = s.reclaimed;
        d["subscribers"] = s.subscribers;
        return d;
      });

  py::class_<PySubscriber, std::shared_ptr<PySubscriber>>(mod, "ChannelSubscriber")
      .def(py::init([](std::shared_ptr<PyClient> c, const std::string& name, const std::string& wake,
                       int lookup_timeout_ms) {
             SubscribeOptions o;
             o.wake = WakeFrom(wake);
             o.lookup_timeout_ms = lookup_timeout_ms;
             auto s = std::make_shared<PySubscriber>();
             s->owner = c;
             s->sub = Take(Unlocked([&] { return ChannelSubscriber::Join(c->client, name, o); }));
             return s;
           }),
           py::arg("client"), py::arg("name"), py::arg("wake") = "futex", py::arg("lookup_timeout_ms") = 1000)
      .def("receive",
           [](py::object self, int timeout_ms) {
             PySubscriber& s = self.cast<PySubscriber&>();
             auto c = std::make_shared<PyChunk>();
             c->channel = self;
             c->chunk = Take(Unlocked([&] { return s.sub.Receive(timeout_ms); }));
             c->keep = s.sub.KeepMapped();
             return c;
           },
           py::arg("timeout_ms") = 1000)
      .def("release",
           [](PySubscriber& s, PyChunk& c) {
             if (c.done || c.writable) Raise(Status(ErrorCode::kParamInvalid, "not a received chunk"));
             Check(s.sub.Release(c.chunk));
             c.done = true;
           })
      .def("leave", [](PySubscriber& s) { s.sub.Leave(); })
      .def_property_readonly("slot", [](PySubscriber& s) { return s.sub.slot(); });

  py::class_<PyEngine, std::shared_ptr<PyEngine>>(mod, "TransferEngine")
      .def(py::init([](std::shared_ptr<PyClient> c, const std::string& name,
                       std::map<std::string, std::string> options) {
             auto e = std::make_shared<PyEngine>();
             e->owner = c;
             e->engine = std::make_unique<TransferEngine>(c->client);
             Check(Unlocked([&] { return e->engine->Initialize(name, options); }));
             return e;
           }),
           py::arg("client"), py::arg("name"), py::arg("options") = std::map<std::string, std::string>{})
      .def("register_mem",
           [](PyEngine& e, py::object mapping) {
             PyMapping& m = mapping.cast<PyMapping&>();
             m.CheckOpen();
             MemHandle h = nullptr;
             Check(Unlocked([&] { return e.engine->RegisterMem({reinterpret_cast<uintptr_t>(m.mapping.data()), m.mapping.size()},
                                          MEM_HOST, h); }));
             const uint64_t id = reinterpret_cast<uintptr_t>(h);
             e.registered[id] = mapping;
             return id;
           })
      .def("deregister_mem",
           [](PyEngine& e, uint64_t id) {
             Check(Unlocked([&] { return e.engine->DeregisterMem(reinterpret_cast<MemHandle>(static_cast<uintptr_t>(id))); }));
             e.registered.erase(id);
           })
      .def("connect",
           [](PyEngine& e, const std::string& remote, int timeout_ms) {
             Check(Unlocked([&] { return e.engine->Connect(remote, timeout_ms); }));
           },
           py::arg("remote"), py::arg("timeout_ms") = 1000)
      .def("disconnect",
           [](PyEngine& e, const std::string& remote, int timeout_ms) {
             Check(Unlocked([&] { return e.engine->Disconnect(remote, timeout_ms); }));
           },
           py::arg("remote"), py::arg("timeout_ms") = 1000)
      .def("transfer_sync",
           [](PyEngine& e, const std::string& remote, const std::string& op,
              const PyDescs& descs, int timeout_ms) {
             std::vector<TransferOpDesc> d = DescsFrom(descs);
             Check(Unlocked([&] { return e.engine->TransferSync(remote, OpFrom(op), d, timeout_ms); }));
           },
           py::arg("remote"), py::arg("op"), py::arg("descs"), py::arg("timeout_ms") = 1000)
      .def("transfer_async",
           [](PyEngine& e, const std::string& remote, const std::string& op,
              const PyDescs& descs, int timeout_ms) {
             std::vector<TransferOpDesc> d = DescsFrom(descs);
             TransferReq req = 0;
             Check(Unlocked([&] { return e.engine->TransferAsync(remote, OpFrom(op), d, req, timeout_ms); }));
             return req;
           },
           py::arg("remote"), py::arg("op"), py::arg("descs"), py::arg("timeout_ms") = 1000)
      .def("transfer_status",
           [](PyEngine& e, TransferReq req) {
             TransferStatus st = TransferStatus::WAITING;
             Check(Unlocked([&] { return e.engine->GetTransferStatus(req, st); }));
             static const char* kNames[] = {"waiting", "completed", "timeout", "failed"};
             return std::string(kNames[static_cast<int>(st) % 4]);
           })
      .def("send_notify",
           [](PyEngine& e, const std::string& remote, const std::string& name, const std::string& message) {
             Check(Unlocked([&] { return e.engine->SendNotify(remote, NotifyDesc{name, message}); }));
           })
      .def("get_notifies",
           [](PyEngine& e) {
             std::vector<Notify> n;
             Check(Unlocked([&] { return e.engine->GetNotifies(n); }));
             py::list out;
             for (auto& x : n) out.append(py::make_tuple(x.remote_engine, x.name, x.notify_msg));
             return out;
           })
      .def("connection_info",
           [](PyEngine& e, const std::string& remote) {
             ConnectionInfo info;
             Check(e.engine->GetConnectionInfo(remote, info));
             py::dict d;
             d["engine"] = info.engine;
             d["path"] = info.path;
             d["transports"] = info.transports;
             d["address"] = info.address;
             return d;
           })
      .def("network_stats",
           [](PyEngine& e) {
             NetworkStats ns;
             Check(Unlocked([&] { return e.engine->GetNetworkStats(ns); }));
             py::dict d;
             d["listen_address"] = ns.listen_address;
             d["accepted"] = ns.accepted;
             d["refused"] = ns.refused;
             d["connections"] = ns.connections;
             d["last_refusal"] = ns.last_refusal;
             return d;
           })
      .def("finalize", [](PyEngine& e) {
        {
          py::gil_scoped_release nogil;
          e.engine->Finalize();
        }
        e.registered.clear();
      });
}
