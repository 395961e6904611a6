#!/usr/bin/env bash
# What an epoll_wait costs as its set grows: an unmodified C server (scripts/epoll-idlers/
# idlers.c) watches its listener and every connection with epoll and echoes; its client holds
# N idle connections and ping-pongs 64 B on one more. Over DockNet with the preload library
# (a fast channel between the two containers, nothing pinned, every program at its defaults),
# and on the kernel's bridge beside it. Builds everything under a name unique to this run and
# removes it on exit.
#
#   ./scripts/epoll-idlers.sh [SECONDS] [N...]     (root; after cargo build --release)
#   DOCKNET_BIN=DIR ./scripts/epoll-idlers.sh ...   the docknet binaries and library of DIR
#   MODES="docknet" ./scripts/epoll-idlers.sh ...   only DockNet (default: "bridge docknet")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"

SECS=${1:-3}
shift || true
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(0 100 1000)
BIN=${DOCKNET_BIN:-${BIN:-$PWD/target/release}}
MODES=${MODES:-bridge docknet}
[ -f "$BIN/libdocknet_preload.so" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v cc >/dev/null || { echo "cc is missing (./scripts/setup.sh installs it)" >&2; exit 1; }
TAG=dnepi$$
WORK=$(mktemp -d /tmp/$TAG.XXXX)
chmod 755 "$WORK"
RUN=/dev/shm/$TAG
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    [ -f "$RUN/holder.pid" ] && kill -9 "$(cat "$RUN/holder.pid")" 2>/dev/null || true
    for ns in h s c; do ip netns del $TAG$ns 2>/dev/null || true; done
    rm -rf "$WORK" "$RUN"
}
trap cleanup EXIT INT TERM
mkdir -p "$RUN"
cc -O2 -o "$WORK/idlers" scripts/epoll-idlers/idlers.c
chmod 755 "$WORK/idlers"
# each client opens N+1 connections
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

run_mode() { # MODE: one server, then one client per N
    local mode=$1 ip srv cli
    if [ "$mode" = bridge ]; then
        # the kernel's bridge (Docker's default network): a bridge in a namespace of its own
        ip netns add ${TAG}h; ip netns add ${TAG}s; ip netns add ${TAG}c
        ip -n ${TAG}h link add br0 type bridge; ip -n ${TAG}h link set br0 up
        for x in s c; do
            ip link add ${TAG}$x type veth peer name eth0 netns ${TAG}$x
            ip link set ${TAG}$x netns ${TAG}h
            ip -n ${TAG}h link set ${TAG}$x master br0 up
            ip -n ${TAG}$x link set lo up; ip -n ${TAG}$x link set eth0 up
        done
        ip -n ${TAG}s addr add 10.79.0.2/24 dev eth0
        ip -n ${TAG}c addr add 10.79.0.3/24 dev eth0
        ip=10.79.0.2
        srv=(ip netns exec ${TAG}s) cli=(ip netns exec ${TAG}c)
    else
        "$BIN/docknet" --log warn daemon --run-dir "$RUN" --socket "$RUN/ctl.sock" >/dev/null 2>&1 & PIDS+=($!)
        for _ in $(seq 50); do [ -S "$RUN/ctl.sock" ] && break; sleep 0.1; done
        local D=("$BIN/docknet" --socket "$RUN/ctl.sock")
        "${D[@]}" pipe create ${TAG}s --ip 10.79.1.2/24 >/dev/null
        "${D[@]}" pipe create ${TAG}c --ip 10.79.1.3/24 >/dev/null
        "${D[@]}" fc connect ${TAG}s ${TAG}c >/dev/null
        ip=10.79.1.2
        srv=("${D[@]}" run --pipe ${TAG}s --preload --bind "$WORK" --)
        cli=("${D[@]}" run --pipe ${TAG}c --preload --bind "$WORK" --)
    fi
    "${srv[@]}" "$WORK/idlers" server 7500 & PIDS+=($!)
    sleep 1
    for n in "${COUNTS[@]}"; do
        printf '%-8s ' "$mode"
        "${cli[@]}" "$WORK/idlers" client $ip 7500 "$n" "$SECS"
    done
}

echo "epoll server with N idle connections, 64 B ping-pong on one more, ${SECS} s each (nothing pinned)"
for m in $MODES; do run_mode "$m"; done
