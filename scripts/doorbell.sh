#!/usr/bin/env bash
# Wake-up primitives side by side (scripts/doorbell/doorbell.c): N pairs ping-pong through
# shared memory, nothing pinned, woken by a futex (DockLib's), by a pipe write (the kernel's
# sync wake-up hint), or by a futex after up to 20 yields. Each point runs REPEAT times,
# interleaved. Needs gcc.
#
#   ./scripts/doorbell.sh [--pairs 1,4,16] [--seconds 2] [--repeat 2]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=1,4,16 seconds=2 repeat=2
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "doorbell.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
gcc -O2 -Wall -Werror -o "$bin/doorbell" scripts/doorbell/doorbell.c
for n in ${pairs//,/ }; do
    for _ in $(seq "$repeat"); do
        for mode in futex pipe yield; do
            "$bin/doorbell" "$mode" "$n" "$seconds"
        done
    done
done
