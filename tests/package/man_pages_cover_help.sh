#!/usr/bin/env bash
# man_pages_cover_help.sh MEMBROKERD MEMBROKERCTL MAN_DIR: every option membrokerd --help
# prints and every command membrokerctl help lists is in its man page, and
# both pages render without a groff warning. Fails naming what is missing.
set -euo pipefail
membrokerd=$1 membrokerctl=$2 man=$3
missing=()
flags=$("$membrokerd" --help 2>&1 | grep -oE '^  --[a-z-]+' | sed 's/^ *//')
commands=$("$membrokerctl" help 2>&1 | sed -n '/^commands/,$p' | grep -oE '^  [a-z]+( [a-z]+)?' | sed 's/^ *//')
# Read from the programs, not assumed: a help text that changed shape fails here.
[ "$(wc -l <<<"$flags")" -ge 20 ] && [ "$(wc -l <<<"$commands")" -ge 10 ] ||
  { echo "could not read the options and commands from the programs' help" >&2; exit 1; }
plain() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$1"; }  # roff source as text: \- is -, no font changes

daemon_page=$(plain "$man/membrokerd.8")
while read -r flag; do
  grep -qF -- "$flag" <<<"$daemon_page" || missing+=("membrokerd.8: $flag")
done <<<"$flags"

ctl_page=$(plain "$man/membrokerctl.1")
while read -r command; do
  grep -qF -- "$command" <<<"$ctl_page" || missing+=("membrokerctl.1: $command")
done <<<"$commands"
for flag in --admin-socket --socket --json --timeout-ms --interval-ms --once; do
  grep -qF -- "$flag" <<<"$ctl_page" || missing+=("membrokerctl.1: $flag")
done

share_page=$(plain "$man/membroker-share.1")
for flag in --socket --listen --secret-file --allow-from; do
  grep -qF -- "$flag" <<<"$share_page" || missing+=("membroker-share.1: $flag")
done
for page in "$man/membrokerd.8" "$man/membrokerctl.1" "$man/membroker-share.1"; do
  out=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  [ -z "$out" ] || missing+=("$page renders with warnings: $out")
done
if [ ${#missing[@]} -gt 0 ]; then
  printf '%s\n' "${missing[@]}" >&2
  exit 1
fi
echo "the man pages cover every option and command the programs' help lists"
