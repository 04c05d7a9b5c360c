#!/usr/bin/env bash
# Installs this build into a temp prefix, builds tests/consumer against it with
# find_package and with pkg-config, and runs both against a live broker.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
broker=
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig"
g++ "$src/main.cc" -o "$tmp/consumer_via_pkgconfig" $(pkg-config --cflags --libs membroker)
cc -std=c11 -Wall -Werror "$src/consumer.c" -o "$tmp/c_consumer" $(pkg-config --cflags --libs membroker-c)

mkfifo "$tmp/ready"
"$tmp/prefix/bin/membrokerd" --socket "$tmp/b.sock" --ready-fd 3 3>"$tmp/ready" &
broker=$!
read -r _ <"$tmp/ready"
lib=$(dirname "$(find "$tmp/prefix" -name 'libmembroker.so' | head -1)")
LD_LIBRARY_PATH="$lib" "$tmp/cmake-build/consumer_via_cmake" "$tmp/b.sock"
LD_LIBRARY_PATH="$lib" "$tmp/consumer_via_pkgconfig" "$tmp/b.sock"
LD_LIBRARY_PATH="$lib" "$tmp/c_consumer" "$tmp/b.sock"
# The installed Python package finds its library by itself (RPATH), from the prefix's dist-packages.
site=$(dirname "$(find "$tmp/prefix" -path '*dist-packages/membroker/__init__.py' | head -1)")
freed=6  # one allocation from each consumer, and the C consumer's channel's two (control block and chunks)
if [ -n "$site" ] && [ "$site" != . ]; then
  PYTHONPATH=$(dirname "$site") /usr/bin/python3 -c "import membroker, sys
c = membroker.connect(sys.argv[1], 'py-consumer'); t = c.new_tensor((4, 4), 'float32'); t.numpy()[:] = 1; c.ping()" "$tmp/b.sock"
  # The network module is installed beside the library, where it is loaded from.
  if [ -f "$lib/libmembroker-ucx.so" ]; then
    printf 'consumer-secret\n' >"$tmp/secret" && chmod 600 "$tmp/secret"
    PYTHONPATH=$(dirname "$site") /usr/bin/python3 -c "import membroker, sys
c = membroker.connect(sys.argv[1], 'py-net')
e = membroker.TransferEngine(c, 'py-net', {'listen_address': '127.0.0.1:0', 'secret_file': sys.argv[2]})
assert e.network_stats()['listen_address'].startswith('127.0.0.1:'), e.network_stats()
e.finalize()" "$tmp/b.sock" "$tmp/secret"
    freed=7  # and the engine's control block
  fi
fi
"$tmp/prefix/bin/membrokerctl" --admin-socket "$tmp/b.sock.admin" stats | grep -q "allocations_freed: $freed\$"
kill -TERM "$broker"
wait "$broker"
echo "installed package consumed via find_package and pkg-config, from C (a channel too), and from Python (the network module too where built)"
