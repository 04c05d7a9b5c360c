#!/usr/bin/env bash
# libmembroker.so exports its public API and nothing of its insides: no
# membroker::ipc, membroker::detail, membroker::wire or flatbuffers symbol, no
# TransferEngine::Impl. (Weak instantiations of std templates stay visible, as
# libstdc++ declares them.)   tests/exported_symbols.sh LIBRARY
set -euo pipefail
lib=$1
symbols=$(nm -D --defined-only "$lib" | c++filt)
count=$(grep -c . <<<"$symbols" || true)
# The symbol's own name, not its argument list (a public class's private
# member may take an internal type).
names=$(sed -E 's/^[0-9a-f]+ [A-Za-z] //; s/\(.*//' <<<"$symbols")
bad=$(grep -E '^(membroker::(ipc|detail|wire|broker)::|flatbuffers::)|TransferEngine::Impl' <<<"$names" || true)
public=$(grep -cE ' membroker::(Client|PhysicalHandle|Reservation|Mapping|TransferEngine|TensorRing|Status|ErrorCodeName)' <<<"$symbols" || true)
echo "$lib exports $count symbols, $public of the public API"
if [ -n "$bad" ]; then
  echo "internal symbols exported:"
  head -20 <<<"$bad"
  exit 1
fi
[ "$public" -gt 50 ] || { echo "the public API is missing from the exports"; exit 1; }
