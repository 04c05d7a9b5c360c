// TensorRing, ChannelPublisher, ChannelSubscriber and their Chunks.
#include "py_objects.h"

namespace membroker::python {

void BindPipeline(py::module_& mod) {
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
      .def("publish", [](PyRing& r, py::dict slot, uint64_t frame_id,
                         size_t bytes) { Check(r.ring.Publish(SlotFrom(r, slot), frame_id, bytes)); })
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
      .def_property(
          "size", [](PyChunk& c) { return c.chunk.size; },
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
             o.mode = EnumFrom<ChannelMode>(
                 mode, {{"broadcast", ChannelMode::kBroadcast}, {"work_sharing", ChannelMode::kWorkSharing}},
                 "channel mode");
             o.when_full = EnumFrom<WhenFull>(
                 when_full, {{"wait", WhenFull::kWait}, {"drop_oldest", WhenFull::kDropOldest}}, "when_full policy");
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
      .def(
          "loan",
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
      .def(
          "publish",
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
      .def(
          "wait_for_subscribers",
          [](PyPublisher& p, uint32_t n, int timeout_ms) {
            Check(Unlocked([&] { return p.pub.WaitForSubscribers(n, timeout_ms); }));
          },
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
      .def(
          "receive",
          [](py::object self, int timeout_ms) {
            PySubscriber& s = self.cast<PySubscriber&>();
            auto c = std::make_shared<PyChunk>();
            c->channel = self;
            c->chunk = Take(Unlocked([&] { return s.sub.Receive(timeout_ms); }));
            c->keep = s.sub.KeepMapped();
            return c;
          },
          py::arg("timeout_ms") = 1000)
      .def("wake_fd", [](PySubscriber& s) { return Take(s.sub.WakeFd()); })
      .def("drain_wake_fd", [](PySubscriber& s) { s.sub.DrainWakeFd(); })
      .def("release",
           [](PySubscriber& s, PyChunk& c) {
             if (c.done || c.writable) Raise(Status(ErrorCode::kParamInvalid, "not a received chunk"));
             Check(s.sub.Release(c.chunk));
             c.done = true;
           })
      .def("leave", [](PySubscriber& s) { s.sub.Leave(); })
      .def_property_readonly("slot", [](PySubscriber& s) { return s.sub.slot(); });
}

}  // namespace membroker::python
