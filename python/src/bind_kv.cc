// KV-cache stores (docs/KV.md) for Python: KvStore, KvLeases (blocks read
// under leases) and KvPut (blocks reserved for writing). Block views are
// numpy uint8 arrays over the memory itself, each holding a reference to its
// KvLeases or KvPut: the slab stays mapped while a view exists; after a
// release the view's bytes may belong to another key (docs/KV.md).
#include <pybind11/numpy.h>

#include "membroker/kv_store.h"
#include "py_objects.h"

namespace membroker::python {

namespace {

struct PyKvStore {
  std::shared_ptr<PyClient> owner;
  KvStore store;
};

struct PyKvLeases {
  std::shared_ptr<PyKvStore> store;
  KvLeases leases;
  bool released = false;
};

struct PyKvPut {
  std::shared_ptr<PyKvStore> store;
  KvPut put;
  bool done = false;  // sealed or aborted
};

KvEviction EvictionFrom(const std::string& name) {
  if (name == "s3fifo") return KvEviction::kS3Fifo;
  if (name == "lru") return KvEviction::kLru;
  Raise(Status(ErrorCode::kParamInvalid, "eviction is \"s3fifo\" or \"lru\", not \"" + name + "\""));
}

std::string CodeName(ErrorCode code) { return std::string(ErrorCodeName(code)); }

// A uint8 view of [p, p+n) whose base keeps `owner` (and so the mapping) alive.
template <typename Owner>
py::array View(const std::shared_ptr<Owner>& owner, const std::byte* p, size_t n, bool writable) {
  py::object base = py::cast(owner);
  py::array_t<uint8_t> a({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(1)},
                         reinterpret_cast<const uint8_t*>(p), base);
  if (!writable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

}  // namespace

void BindKv(py::module_& mod) {
  py::class_<PyKvStore, std::shared_ptr<PyKvStore>>(mod, "KvStore")
      .def_static(
          "create",
          [](std::shared_ptr<PyClient> c, const std::string& name, size_t block_size, size_t capacity,
             const std::string& page_policy, const std::string& eviction) {
            KvStoreOptions o{block_size, capacity, PolicyFrom(page_policy), EvictionFrom(eviction)};
            auto s = Take(Unlocked([&] { return KvStore::Create(c->client, name, o); }));
            return std::make_shared<PyKvStore>(PyKvStore{c, std::move(s)});
          },
          py::arg("client"), py::arg("name"), py::arg("block_size"), py::arg("capacity"),
          py::arg("page_policy") = "normal", py::arg("eviction") = "s3fifo")
      .def_static("open",
                  [](std::shared_ptr<PyClient> c, const std::string& name) {
                    auto s = Take(Unlocked([&] { return KvStore::Open(c->client, name); }));
                    return std::make_shared<PyKvStore>(PyKvStore{c, std::move(s)});
                  })
      .def_static("drop",
                  [](std::shared_ptr<PyClient> c, const std::string& name) {
                    Check(Unlocked([&] { return KvStore::Drop(c->client, name); }));
                  })
      .def_property_readonly("id", [](PyKvStore& s) { return s.store.id(); })
      .def_property_readonly("block_size", [](PyKvStore& s) { return s.store.block_size(); })
      .def_property_readonly("blocks", [](PyKvStore& s) { return s.store.blocks(); })
      .def("exists",
           [](PyKvStore& s, const std::vector<std::string>& keys) {
             return Take(Unlocked([&] { return s.store.Exists(keys); }));
           })
      .def("prefix_hits",
           [](PyKvStore& s, const std::vector<std::string>& keys) {
             return Take(Unlocked([&] { return s.store.PrefixHits(keys); }));
           })
      .def("get",
           [](std::shared_ptr<PyKvStore> s, const std::vector<std::string>& keys) {
             auto leases = Take(Unlocked([&] { return s->store.Get(keys); }));
             return std::make_shared<PyKvLeases>(PyKvLeases{s, std::move(leases)});
           })
      .def("reserve",
           [](std::shared_ptr<PyKvStore> s, const std::vector<std::string>& keys) {
             auto put = Take(Unlocked([&] { return s->store.Reserve(keys); }));
             return std::make_shared<PyKvPut>(PyKvPut{s, std::move(put)});
           })
      .def("put", [](PyKvStore& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values) {
        // The buffers are read with the GIL held (their owners cannot change them meanwhile).
        std::vector<py::buffer_info> infos;
        std::vector<std::span<const std::byte>> spans;
        for (const py::buffer& b : values) {
          infos.push_back(b.request());
          const py::buffer_info& i = infos.back();
          if (!PyBuffer_IsContiguous(i.view(), 'C'))
            Raise(Status(ErrorCode::kParamInvalid, "a value is not one contiguous buffer"));
          spans.emplace_back(static_cast<const std::byte*>(i.ptr), static_cast<size_t>(i.size * i.itemsize));
        }
        std::vector<std::string> out;
        for (ErrorCode code : Take(s.store.Put(keys, spans))) out.push_back(CodeName(code));
        return out;
      });

  py::class_<PyKvLeases, std::shared_ptr<PyKvLeases>>(mod, "KvLeases")
      .def("__len__", [](PyKvLeases& l) { return l.leases.size(); })
      .def_property_readonly("leading", [](PyKvLeases& l) { return l.leases.leading(); })
      .def_property_readonly("released", [](PyKvLeases& l) { return l.released; })
      .def("found", [](PyKvLeases& l, size_t i) { return !l.released && l.leases.found(i); })
      .def("block",
           [](std::shared_ptr<PyKvLeases> l, size_t i) -> py::object {
             if (l->released) Raise(Status(ErrorCode::kInvalidHandle, "the leases were released"));
             if (i >= l->leases.size()) throw py::index_error("block " + std::to_string(i));
             if (!l->leases.found(i)) return py::none();
             auto d = l->leases.data(i);
             return View(l, d.data(), d.size(), false);
           })
      .def("release", [](PyKvLeases& l) {
        l.released = true;
        l.leases.Release();
      });

  py::class_<PyKvPut, std::shared_ptr<PyKvPut>>(mod, "KvPut")
      .def("__len__", [](PyKvPut& p) { return p.put.size(); })
      .def("status",
           [](PyKvPut& p, size_t i) {
             if (i >= p.put.size()) throw py::index_error("block " + std::to_string(i));
             return CodeName(p.put.status(i));
           })
      .def("block",
           [](std::shared_ptr<PyKvPut> p, size_t i) -> py::object {
             if (i >= p->put.size()) throw py::index_error("block " + std::to_string(i));
             auto d = p->put.data(i);
             if (d.empty()) return py::none();
             return View(p, d.data(), d.size(), true);
           })
      .def("set_length",
           [](PyKvPut& p, size_t i, size_t n) {
             if (i >= p.put.size()) throw py::index_error("block " + std::to_string(i));
             p.put.set_length(i, n);
           })
      .def("seal",
           [](PyKvPut& p) {
             p.done = true;
             Check(Unlocked([&] { return p.store->store.Seal(p.put); }));
           })
      .def("abort", [](PyKvPut& p) {
        p.done = true;
        Check(p.store->store.Abort(p.put));
      });
}

}  // namespace membroker::python
