#!/usr/bin/env bash
# check_prefix.sh PREFIX: what a user gets from membroker installed under
# PREFIX, used the way a user's project uses it: this folder's project built
# with find_package and with pkg-config, a C program, the Python package
# (and its network module where built), all against PREFIX's own membrokerd,
# and membrokerctl reading what they did. Called by run.sh (a cmake --install
# prefix) and by tests/package/install_into_fresh_root.sh (/usr, from the .deb).
set -euo pipefail
prefix=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
broker=
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$tmp"' EXIT

cmake -S "$src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig"
g++ "$src/main.cc" -o "$tmp/consumer_via_pkgconfig" $(pkg-config --cflags --libs membroker)
cc -std=c11 -Wall -Werror "$src/consumer.c" -o "$tmp/c_consumer" $(pkg-config --cflags --libs membroker-c)

mkfifo "$tmp/ready"
"$prefix/bin/membrokerd" --socket "$tmp/b.sock" --ready-fd 3 3>"$tmp/ready" &
broker=$!
read -r _ <"$tmp/ready"
lib=$(dirname "$(find "$prefix/lib" -maxdepth 2 -name 'libmembroker.so' | head -1)")
LD_LIBRARY_PATH="$lib" "$tmp/cmake-build/consumer_via_cmake" "$tmp/b.sock"
LD_LIBRARY_PATH="$lib" "$tmp/consumer_via_pkgconfig" "$tmp/b.sock"
LD_LIBRARY_PATH="$lib" "$tmp/c_consumer" "$tmp/b.sock"
# The installed Python package finds its library by itself (RPATH under a
# prefix, the loader's own path under /usr), from the prefix's dist-packages.
site=$(find "$prefix/lib" -maxdepth 4 -path '*dist-packages/membroker/__init__.py' | head -1)
freed=6  # one allocation from each consumer, and the C consumer's channel's two (control block and chunks)
if [ -n "$site" ]; then
  export PYTHONPATH
  PYTHONPATH=$(dirname "$(dirname "$site")")
  /usr/bin/python3 -c "import membroker, sys
assert membroker.__file__.startswith(sys.argv[2]), (membroker.__file__, 'not from', sys.argv[2])
c = membroker.connect(sys.argv[1], 'py-consumer'); t = c.new_tensor((4, 4), 'float32'); t.numpy()[:] = 1; c.ping()" \
    "$tmp/b.sock" "$PYTHONPATH"
  # The network module is installed in membroker/ beside the library, where it is loaded from.
  if [ -f "$lib/membroker/libmembroker-ucx.so" ]; then
    printf 'consumer-secret\n' >"$tmp/secret" && chmod 600 "$tmp/secret"
    /usr/bin/python3 -c "import membroker, sys
c = membroker.connect(sys.argv[1], 'py-net')
e = membroker.TransferEngine(c, 'py-net', {'listen_address': '127.0.0.1:0', 'secret_file': sys.argv[2]})
assert e.network_stats()['listen_address'].startswith('127.0.0.1:'), e.network_stats()
e.finalize()" "$tmp/b.sock" "$tmp/secret"
    freed=7  # and the engine's control block
  fi
fi
"$prefix/bin/membrokerctl" --socket "$tmp/b.sock" stats | grep -q "allocations_freed: $freed\$"
kill -TERM "$broker"
wait "$broker"
broker=
echo "$prefix: consumed via find_package and pkg-config, from C (a channel too), and from Python (the network module too where built)"
