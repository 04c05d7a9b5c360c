// _membroker: the C++ client library for Python (pybind11). The Pythonic
// layer - error classes, tensors, state dicts, the test fixture - is
// membroker/__init__.py and friends; these files only wrap the C++ API:
// py_objects.h (the objects and what they keep alive), bind_*.cc (the
// classes), dlpack.cc. This one: the module, and errors as Python classes.
#include "py_objects.h"

using namespace membroker::python;
using membroker::ErrorCode;

namespace {
// code (int) -> class. A handle that is never released: the interpreter may
// already be gone when static destructors run.
py::handle g_error_classes;
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

  BindClient(mod);
  BindMemory(mod);
  BindPipeline(mod);
  BindEngine(mod);
  BindKv(mod);
}
