// PhysicalHandle, Reservation, Mapping (buffer protocol, __array_interface__, DLPack) and HostBuffer.
#include <dlpack/dlpack.h>

#include "py_objects.h"

namespace membroker::python {

void BindMemory(py::module_& mod) {
  py::class_<PyHandle, std::shared_ptr<PyHandle>>(mod, "PhysicalHandle")
      .def_property_readonly("id", [](PyHandle& h) { return h.handle.id(); })
      .def_property_readonly("size", [](PyHandle& h) { return h.handle.size(); })
      .def_property_readonly("page_size", [](PyHandle& h) { return h.handle.page_size(); })
      .def_property_readonly("read_only", [](PyHandle& h) { return h.handle.read_only(); })
      .def_property_readonly("pinned", [](PyHandle& h) { return h.handle.pinned(); })
      .def_property_readonly("device",
                             [](PyHandle& h) -> py::object {
                               if (h.handle.device() < 0) return py::none();
                               return py::int_(h.handle.device());
                             })
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
        return py::buffer_info(m.mapping.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {n}, {1}, m.read_only);
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
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version) {
            (void)stream;  // host memory: nothing to synchronise
            return DLPackCapsule(self, self.cast<PyMapping&>(), DLDevice{kDLCPU, 0}, max_version);
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none())
      .def("__dlpack_device__", [](PyMapping&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def("close", [](PyMapping& m) { m.closed = true; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyMapping& m, py::args) { m.closed = true; });

  py::class_<PyDeviceMapping, std::shared_ptr<PyDeviceMapping>>(mod, "DeviceMapping")
      .def_property_readonly("address", [](PyDeviceMapping& m) { return reinterpret_cast<uintptr_t>(m.mapping.data()); })
      .def_property_readonly("size", [](PyDeviceMapping& m) { return m.mapping.size(); })
      .def_property_readonly("read_only", [](PyDeviceMapping& m) { return m.read_only; })
      .def_property_readonly("closed", [](PyDeviceMapping& m) { return m.closed; })
      .def_property_readonly("device", [](PyDeviceMapping& m) { return m.device; })
      // Version 3 (numba's and CuPy's specification): "stream": None because
      // membroker enqueues no work on this memory, so there is nothing to wait for.
      .def_property_readonly("__cuda_array_interface__",
                             [](PyDeviceMapping& m) {
                               m.CheckOpen();
                               py::dict d;
                               d["shape"] = py::make_tuple(m.mapping.size());
                               d["typestr"] = "|u1";
                               d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(m.mapping.data()), m.read_only);
                               d["strides"] = py::none();
                               d["stream"] = py::none();
                               d["version"] = 3;
                               return d;
                             })
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version) {
            (void)stream;  // no work of membroker's is pending on this memory
            PyDeviceMapping& m = self.cast<PyDeviceMapping&>();
            return DLPackCapsule(self, m, DLDevice{kDLCUDA, m.device}, max_version);
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none())
      .def("__dlpack_device__",
           [](PyDeviceMapping& m) { return py::make_tuple(static_cast<int>(kDLCUDA), m.device); })
      .def("close", [](PyDeviceMapping& m) { m.closed = true; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyDeviceMapping& m, py::args) { m.closed = true; });

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
}

}  // namespace membroker::python
