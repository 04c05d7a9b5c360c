// A handle mapped whole at the start of a range reserved for it: the
// reserve-then-map most tests do before they touch bytes. Tests of the VMM
// calls themselves (vmm_test.cc, memory_test.cc) spell the steps out.
#pragma once

#include "membroker/client.h"
#include "membroker/status.h"

namespace membroker::testing {

struct WholeMapping {
  Reservation range;  // declared first: destroyed after the mapping that lies in it
  Mapping map;

  void* data() const { return map.data(); }
  size_t size() const { return map.size(); }
  template <typename T>
  T* as() const { return map.as<T>(); }
};

inline Result<WholeMapping> MapWhole(Client& c, const PhysicalHandle& h, uint32_t flags = 0) {
  WholeMapping w;
  MB_ASSIGN_OR_RETURN(w.range, c.ReserveMemAddress(h.size()));
  MB_ASSIGN_OR_RETURN(w.map, c.MapMem(w.range.base(), h.size(), 0, h, flags));
  return w;
}

}  // namespace membroker::testing
