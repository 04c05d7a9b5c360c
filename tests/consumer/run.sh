#!/usr/bin/env bash
# Installs this build into a temp prefix (cmake --install) and checks it as a
# user's project would (check_prefix.sh).
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
"$(dirname "$0")/check_prefix.sh" "$tmp/prefix"
