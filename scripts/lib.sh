# Shared by scripts/demo and scripts/test: install what is missing, then build.
# shellcheck shell=bash

MB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MB_PACKAGES=(cmake ninja-build g++ pkg-config libuv1-dev libflatbuffers-dev flatbuffers-compiler
             libboost-dev libgtest-dev libgmock-dev libbenchmark-dev clang-14 libclang-rt-14-dev
             python3-dev pybind11-dev libdlpack-dev python3-numpy python3-pytest python3-torch
             libsystemd-dev systemd libucx-dev libsodium-dev ucx-utils iproute2 util-linux
             libmicrohttpd-dev prometheus tmux man-db libcurl4-openssl-dev nlohmann-json3-dev
             etcd-server etcd-client openssl)

mb_install_packages() {
  local missing=()
  for p in "${MB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "membroker needs these Debian packages; install them as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# mb_build DIR [cmake args...]
mb_build() {
  local dir=$1
  shift
  cmake -S "$MB_ROOT" -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}
