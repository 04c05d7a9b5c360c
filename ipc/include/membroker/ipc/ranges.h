// Address ranges kept in a std::map keyed by start address, with a function
// that gives an entry's length: the overlap and containment checks that
// registrations, mappings and transfers all need.
#pragma once

#include <cstdint>
#include <iterator>

namespace membroker::ipc {

// Whether [start, start+size) overlaps any range in m.
template <class Map, class Length>
bool Overlaps(const Map& m, uint64_t start, uint64_t size, Length length) {
  auto next = m.lower_bound(start);
  if (next != m.end() && next->first < start + size) return true;
  return next != m.begin() && std::prev(next)->first + length(std::prev(next)->second) > start;
}

// The entry whose range holds all of [start, start+size), or m.end().
template <class Map, class Length>
auto Containing(Map& m, uint64_t start, uint64_t size, Length length) -> decltype(m.end()) {
  auto it = m.upper_bound(start);
  if (it == m.begin() || start + size < start) return m.end();
  --it;
  return it->first + length(it->second) >= start + size ? it : m.end();
}

}  // namespace membroker::ipc
