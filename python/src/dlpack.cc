// DLPack for Mappings (py_objects.h).
#include <dlpack/dlpack.h>

#include "py_objects.h"

namespace membroker::python {

namespace {

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

DLTensor MakeTensor(PyMapping& m, DLDevice device, DLPackOwner* owner) {
  DLTensor t{};
  t.data = m.mapping.data();
  t.device = device;
  t.ndim = 1;
  t.dtype = {kDLUInt, 8, 1};
  owner->shape[0] = static_cast<int64_t>(m.mapping.size());
  t.shape = owner->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  return t;
}

}  // namespace

py::capsule DLPackCapsule(py::object self, PyMapping& m, DLDevice device, py::object max_version) {
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
    t->dl_tensor = MakeTensor(m, device, owner);
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
  t->dl_tensor = MakeTensor(m, device, owner);
  return py::capsule(t, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      t->deleter(t);
    }
  });
}

}  // namespace membroker::python
