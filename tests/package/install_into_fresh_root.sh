#!/usr/bin/env bash
# install_into_fresh_root.sh DEB: installs the Debian package with dpkg into
# a fresh root (its own dpkg database, a copy of this machine's, so Depends are
# checked against what is really installed), then, in a mount namespace where
# that root's /usr lies over this machine's (and /usr/local is hidden), runs
# what a user would: the man pages, the units through systemd-analyze, and
# tests/consumer/check_prefix.sh against /usr: the package's own membrokerd,
# membrokerctl, headers, CMake and pkg-config files, library, network module
# and Python package. Then removes and purges it and checks nothing is left.
# As root (dpkg --root, mount namespaces).
set -euo pipefail
deb=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "install_into_fresh_root.sh: needs root (dpkg --root, unshare -m)" >&2; exit 1; }
root=$(mktemp -d /tmp/membroker-root.XXXXXX)
etc=$(mktemp -d /tmp/membroker-etc.XXXXXX)  # the postinst's writes to /etc, inside the namespace
trap 'rm -rf "$root" "$etc"' EXIT

mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
cp -a /var/lib/dpkg/status /var/lib/dpkg/info "$root/var/lib/dpkg/"
touch "$root/var/lib/dpkg/available"
# Maintainer scripts run from this machine's /bin/sh with DPKG_ROOT set
# (the fresh root has no shell); ours leave systemd alone there. Triggers
# (ldconfig, man-db) are recorded, not run: their programs would write to this
# machine's /etc and /var; the loader finds /usr/lib/x86_64-linux-gnu without
# its cache. --path-include: every file, also where this machine's dpkg
# excludes man pages and docs (slim container images do).
dpkg_root() { dpkg --root="$root" --force-script-chrootless --no-triggers --path-include='*' --log=/dev/null "$@"; }
dpkg_root -i "$deb"
dpkg_root -s membroker | grep -q '^Status: install ok installed$'
echo "installed into $root: $(dpkg_root -L membroker | grep -c .) paths"

# Inside: the package's files at their real paths, over this machine's /usr.
unshare -m --propagation private bash -euo pipefail -c '
  root=$1 here=$2 etc=$3
  mount -t overlay membroker-usr -o "lowerdir=$root/usr:/usr" /usr
  mount -t tmpfs membroker-no-local /usr/local
  # The postinst as a real install runs it (no DPKG_ROOT), writing to a copy
  # of /etc and talking to no systemd of this machine.
  mkdir "$etc/upper" "$etc/work"
  mount -t overlay membroker-etc -o "lowerdir=/etc,upperdir=$etc/upper,workdir=$etc/work" /etc
  if [ -d /run/systemd ]; then mount -t tmpfs membroker-no-systemd /run/systemd; fi
  sh "$root/var/lib/dpkg/info/membroker.postinst" configure
  getent group membroker >/dev/null
  sh "$root/var/lib/dpkg/info/membroker.postinst" configure  # again: an upgrade keeps the group
  # The units admission: a member of membroker (nobody, given the group) is
  # served; nobody without it is refused.
  tmp=$(mktemp -d) && chmod 755 "$tmp"
  mkfifo "$tmp/ready"
  membrokerd --socket "$tmp/b.sock" --socket-group membroker --allow-gid membroker --ready-fd 3 3>"$tmp/ready" 2>"$tmp/log" &
  broker=$!
  read -r _ <"$tmp/ready"
  client="import membroker, sys; c = membroker.connect(sys.argv[1], \"member\"); t = c.new_tensor((4,), \"float32\"); c.ping()"
  setpriv --reuid=nobody --regid=nogroup --groups=membroker /usr/bin/python3 -c "$client" "$tmp/b.sock"
  if setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 -c "$client" "$tmp/b.sock" 2>/dev/null; then
    echo "a process outside the group membroker was served" >&2; exit 1
  fi
  kill -TERM "$broker" && wait "$broker"
  rm -rf "$tmp"
  echo "postinst made the group membroker; its members are served, others refused"
  [ "$(command -v membrokerd)" = /usr/bin/membrokerd ]
  for page in /usr/share/man/man8/membrokerd.8.gz /usr/share/man/man1/membrokerctl.1.gz \
      /usr/share/man/man1/membroker-share.1.gz; do
    out=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
    [ -z "$out" ] || { echo "$page: $out" >&2; exit 1; }
  done
  MANPATH=/usr/share/man man -w membrokerd membrokerctl membroker-share >/dev/null
  membroker-share --help | grep -- --listen >/dev/null
  systemd-analyze verify --man=no /usr/lib/systemd/system/membrokerd.socket /usr/lib/systemd/system/membrokerd.service
  membrokerd --help | grep -- --supervise >/dev/null  # not -q: an early exit would SIGPIPE the writer (pipefail)
  "$here/../consumer/check_prefix.sh" /usr
' bash "$root" "$here" "$etc"

dpkg_root --purge membroker
left=$(find "$root" -path "$root/var" -prune -o ! -type d -print)
[ -z "$left" ] || { echo "left behind after purge:" >&2; echo "$left" >&2; exit 1; }
echo "installed into a fresh root, used from /usr by C, C++, Python and membrokerctl, purged without a trace"
