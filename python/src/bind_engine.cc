// TransferEngine.
#include "membroker/name_share.h"
#include "py_objects.h"

namespace membroker::python {
namespace {

py::list NotifyList(const std::vector<Notify>& notifies) {
  py::list out;
  for (const auto& n : notifies) out.append(py::make_tuple(n.remote_engine, n.name, n.notify_msg));
  return out;
}

}  // namespace

void BindEngine(py::module_& mod) {
  py::class_<PyEngine, std::shared_ptr<PyEngine>>(mod, "TransferEngine")
      .def(py::init(
               [](std::shared_ptr<PyClient> c, const std::string& name, std::map<std::string, std::string> options) {
                 auto e = std::make_shared<PyEngine>();
                 e->owner = c;
                 e->engine = std::make_unique<TransferEngine>(c->client);
                 Check(Unlocked([&] { return e->engine->Initialize(name, options); }));
                 return e;
               }),
           py::arg("client"), py::arg("name"), py::arg("options") = std::map<std::string, std::string>{})
      .def(
          "register_mem",
          [](PyEngine& e, py::object mapping, const std::string& name) {
            const bool device = py::isinstance<PyDeviceMapping>(mapping);  // MEM_DEVICE
            PyMapping& m =
                device ? static_cast<PyMapping&>(mapping.cast<PyDeviceMapping&>()) : mapping.cast<PyMapping&>();
            m.CheckOpen();
            MemHandle h = nullptr;
            Check(Unlocked([&] {
              return e.engine->RegisterMem({reinterpret_cast<uintptr_t>(m.mapping.data()), m.mapping.size()},
                                           device ? MEM_DEVICE : MEM_HOST, h, name);
            }));
            const uint64_t id = reinterpret_cast<uintptr_t>(h);
            e.registered[id] = mapping;
            return id;
          },
          py::arg("mapping"), py::arg("name") = "")
      .def(
          "remote_regions",
          [](PyEngine& e, const std::string& remote, int timeout_ms) {
            std::vector<RegionInfo> regions;
            Check(Unlocked([&] { return e.engine->GetRemoteRegions(remote, regions, timeout_ms); }));
            py::list out;
            for (const auto& r : regions) {
              py::dict d;
              d["name"] = r.name;
              d["address"] = r.address;
              d["length"] = r.length;
              d["read_only"] = r.read_only;
              out.append(d);
            }
            return out;
          },
          py::arg("remote"), py::arg("timeout_ms") = 1000)
      .def(
          "fetch_named",
          [](PyEngine& e, const std::string& name, int timeout_ms) {
            Result<FetchedObject> r =
                Unlocked([&] { return FetchNamed(e.owner->client, *e.engine, name, timeout_ms); });
            FetchedObject f = Take(std::move(r));
            auto h = std::make_shared<PyHandle>();
            h->owner = e.owner;
            h->handle = std::move(f.handle);
            py::dict d;
            d["handle"] = h;
            d["host"] = f.host;
            d["generation"] = f.generation;
            d["size"] = f.size;
            d["metadata"] = py::bytes(f.metadata);
            d["copied"] = f.copied;
            return d;
          },
          py::arg("name"), py::arg("timeout_ms") = 0)
      .def("deregister_mem",
           [](PyEngine& e, uint64_t id) {
             Check(Unlocked(
                 [&] { return e.engine->DeregisterMem(reinterpret_cast<MemHandle>(static_cast<uintptr_t>(id))); }));
             e.registered.erase(id);
           })
      .def(
          "connect",
          [](PyEngine& e, const std::string& remote, int timeout_ms) {
            Check(Unlocked([&] { return e.engine->Connect(remote, timeout_ms); }));
          },
          py::arg("remote"), py::arg("timeout_ms") = 1000)
      .def(
          "disconnect",
          [](PyEngine& e, const std::string& remote, int timeout_ms) {
            Check(Unlocked([&] { return e.engine->Disconnect(remote, timeout_ms); }));
          },
          py::arg("remote"), py::arg("timeout_ms") = 1000)
      .def(
          "transfer_sync",
          [](PyEngine& e, const std::string& remote, const std::string& op, const PyDescs& descs, int timeout_ms) {
            std::vector<TransferOpDesc> d = DescsFrom(descs);
            Check(Unlocked([&] { return e.engine->TransferSync(remote, OpFrom(op), d, timeout_ms); }));
          },
          py::arg("remote"), py::arg("op"), py::arg("descs"), py::arg("timeout_ms") = 1000)
      .def(
          "transfer_async",
          [](PyEngine& e, const std::string& remote, const std::string& op, const PyDescs& descs, int timeout_ms) {
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
             return NotifyList(n);
           })
      .def(
          "wait_notifies",
          [](PyEngine& e, int timeout_ms) {
            std::vector<Notify> n;
            Check(Unlocked([&] { return e.engine->WaitNotifies(n, timeout_ms); }));
            return NotifyList(n);
          },
          py::arg("timeout_ms") = 1000)
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

}  // namespace membroker::python
