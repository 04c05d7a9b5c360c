// membroker.Client: the VMM path, sharing, names, events, host memory.
#include "py_objects.h"

namespace membroker::python {

void BindClient(py::module_& mod) {
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
      .def_property_readonly("cluster_host", [](PyClient& c) { return c.client.cluster_host(); })
      .def("ping", [](PyClient& c) { Check(Unlocked([&] { return c.client.Ping(); })); })
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
          [](std::shared_ptr<PyClient> c, size_t size, const std::string& policy, bool pinned, bool same_address,
             bool exported, uint32_t export_flags, py::object device) {
            AllocationProp p;
            if (!device.is_none()) p.location = MemLocation{MemLocation::kDevice, device.cast<int>()};
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
          py::arg("same_address") = false, py::arg("exported") = false, py::arg("export_flags") = 0,
          py::arg("device") = py::none())
      .def(
          "reserve",
          [](std::shared_ptr<PyClient> c, size_t size, size_t alignment, bool device) {
            auto r = std::make_shared<PyReservation>();
            r->owner = c;
            r->reservation =
                Take(c->client.ReserveMemAddress(size, alignment, nullptr, device ? kReserveDevice : 0));
            return r;
          },
          py::arg("size"), py::arg("alignment") = 0, py::arg("device") = false)
      .def(
          "map",
          [](std::shared_ptr<PyClient> c, py::object reservation, py::object handle, size_t offset_in_reservation,
             size_t size, size_t offset, bool populate) {
            PyReservation& r = reservation.cast<PyReservation&>();
            PyHandle& h = handle.cast<PyHandle&>();
            if (size == 0) size = h.handle.size() - std::min(offset, h.handle.size());
            auto fill = [&](PyMapping& m) {
              m.reservation = reservation;
              m.handle = handle;
              m.owner = c;
              m.read_only = h.handle.read_only();
              m.mapping = Take(c->client.MapMem(r.reservation.at(offset_in_reservation), size, offset, h.handle,
                                                populate ? kMapPopulate : 0));
            };
            if (h.handle.device() >= 0) {
              auto m = std::make_shared<PyDeviceMapping>();
              m->device = h.handle.device();
              fill(*m);
              return py::cast(m);
            }
            auto m = std::make_shared<PyMapping>();
            fill(*m);
            return py::cast(m);
          },
          py::arg("reservation"), py::arg("handle"), py::arg("at") = 0, py::arg("size") = 0, py::arg("offset") = 0,
          py::arg("populate") = false)
      .def(
          "set_access",
          [](PyClient& c, py::object mapping, const std::string& access) {
            PyMapping& m = py::isinstance<PyDeviceMapping>(mapping)
                               ? static_cast<PyMapping&>(mapping.cast<PyDeviceMapping&>())
                               : mapping.cast<PyMapping&>();
            m.CheckOpen();
            Access a = access == "none"   ? Access::kNone
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
          [](PyClient& c, PyHandle& h, const std::string& name, bool read_only, bool persist, py::bytes metadata,
             bool replace, bool cluster) {
            uint32_t flags = (read_only ? kPublishReadOnly : 0) | (persist ? kPublishPersist : 0) |
                             (replace ? kPublishReplace : 0) | (cluster ? kPublishCluster : 0);
            std::string meta = metadata;
            Check(Unlocked([&] { return c.client.Publish(name, h.handle, flags, meta); }));
          },
          py::arg("handle"), py::arg("name"), py::arg("read_only") = false, py::arg("persist") = false,
          py::arg("metadata") = py::bytes(), py::arg("replace") = false, py::arg("cluster") = false)
      .def(
          "lookup_cluster",
          [](PyClient& c, const std::string& name, int timeout_ms) {
            Result<ClusterNameInfo> r = Unlocked([&] { return c.client.LookupCluster(name, timeout_ms); });
            ClusterNameInfo at = Take(std::move(r));
            py::dict d;
            d["host"] = at.host;
            d["generation"] = at.generation;
            d["size"] = at.size;
            d["read_only"] = at.read_only;
            d["metadata"] = py::bytes(at.metadata);
            d["allocation"] = at.allocation;
            return d;
          },
          py::arg("name"), py::arg("timeout_ms") = 0)
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
           [](PyClient& c, const std::string& name) { Check(Unlocked([&] { return c.client.Unpublish(name); })); })
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
      .def(
          "wait_for_reattach",
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
      .def(
          "subscribe",
          [](PyClient& c, const std::string& prefix, bool cluster) {
            Check(Unlocked([&] { return cluster ? c.client.SubscribeCluster(prefix) : c.client.Subscribe(prefix); }));
          },
          py::arg("prefix"), py::arg("cluster") = false)
      .def(
          "wait_events",
          [](PyClient& c, int timeout_ms) {
            NameEvents ev = Take(Unlocked([&] { return c.client.WaitEvents(timeout_ms); }));
            static const char* kKinds[] = {"published", "unpublished", "holder_died", "host_gone"};
            py::list out;
            for (const NameEvent& e : ev.events) {
              py::dict d;
              d["kind"] = kKinds[static_cast<int>(e.kind) % 4];
              d["name"] = e.name;
              d["allocation"] = e.allocation;
              d["pid"] = e.pid;
              d["host"] = e.host;
              out.append(d);
            }
            return py::make_tuple(out, ev.dropped);
          },
          py::arg("timeout_ms") = 0)
      .def("wake_fd", [](PyClient& c) { return Take(Unlocked([&] { return c.client.WakeFd(); })); })
      .def("drain_wake_fd", [](PyClient& c) { c.client.DrainWakeFd(); })
      // For bench/python_handoff.py: n Pings looped in C++, the seconds they took.
      .def("ping_loop", [](PyClient& c, int n) {
        py::gil_scoped_release nogil;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) Check(c.client.Ping());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
}

}  // namespace membroker::python
