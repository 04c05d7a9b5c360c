// The double's entry points by the names cuGetProcAddress is asked for. Each
// file lists its own; driver.cc looks a name up in all of them.
#pragma once

#include <span>

namespace mbfake {

struct Entry {
  const char* name;
  void* fn;
};

std::span<const Entry> DriverEntries();  // driver.cc
std::span<const Entry> VmmEntries();     // vmm.cc
std::span<const Entry> CopyEntries();    // copies.cc
std::span<const Entry> LegacyEntries();  // legacy.cc

// A function of exactly the driver's type for `name` (decltype(&::cuX)), so a
// wrong signature does not compile.
#define MBFAKE_ENTRY(name, fn) \
  Entry { #name, reinterpret_cast < void*>(static_cast <decltype(&::name)>(fn)) }

}  // namespace mbfake
