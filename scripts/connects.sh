#!/usr/bin/env bash
# Connection set-up, timed (scripts/connects/connects.c): a client connects, exchanges one
# 4-byte message and closes, K times, against a server that answers one connection at a time;
# over the kernel's bridge (two namespaces), and under the preload library through the daemon
# and over a fast channel. Prints, per path, the connect's and the exchange's p50 and mean in
# µs, REPEAT times, the paths interleaved. Nothing pinned. Needs gcc and root (after
# cargo build --release).
#
#   ./scripts/connects.sh [--count K] [--repeat N]     (defaults: 5000, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
count=5000 repeat=2
while [ $# -gt 0 ]; do
    case "$1" in
        --count) count=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "connects.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
docknet_root "$@"
BIN=${DOCKNET_BIN:-$PWD/target/release}
[ -f "$BIN/libdocknet_preload.so" ] && [ -x "$BIN/docknet" ] || { echo "connects.sh: build first: cargo build --release" >&2; exit 1; }
command -v gcc >/dev/null || { echo "connects.sh: gcc is missing (apt-get install gcc)" >&2; exit 1; }
TAG=dncn$$
WORK=$(mktemp -d /tmp/$TAG.XXXX)
chmod 755 "$WORK"
RUN=/dev/shm/$TAG
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    { for p in "${PIDS[@]}"; do wait "$p" || true; done; } 2>/dev/null
    [ -f "$RUN/holder.pid" ] && kill -9 "$(cat "$RUN/holder.pid")" 2>/dev/null || true
    for ns in h s c; do ip netns del $TAG$ns 2>/dev/null || true; done
    rm -rf "$WORK" "$RUN"
}
trap cleanup EXIT INT TERM
gcc -O2 -Wall -Werror -o "$WORK/connects" scripts/connects/connects.c
chmod 755 "$WORK/connects"

# the kernel's bridge: a bridge in a host namespace, a veth per side
ip netns add ${TAG}h; ip netns add ${TAG}s; ip netns add ${TAG}c
ip -n ${TAG}h link add br0 type bridge; ip -n ${TAG}h link set br0 up
for x in s c; do
    ip link add ${TAG}$x type veth peer name eth0 netns ${TAG}$x
    ip link set ${TAG}$x netns ${TAG}h
    ip -n ${TAG}h link set ${TAG}$x master br0 up
    ip -n ${TAG}$x link set lo up; ip -n ${TAG}$x link set eth0 up
done
ip -n ${TAG}s addr add 10.77.0.2/24 dev eth0
ip -n ${TAG}c addr add 10.77.0.3/24 dev eth0
ip netns exec ${TAG}s "$WORK/connects" server 7700 >/dev/null 2>&1 & PIDS+=($!)

# DockNet: a server pipe, a client pipe through the daemon and one over a fast channel
mkdir -p "$RUN"
"$BIN/docknet" --log warn daemon --run-dir "$RUN" --socket "$RUN/ctl.sock" --fast-channels manual >/dev/null 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$RUN/ctl.sock" ] && break; sleep 0.05; done
D=("$BIN/docknet" --socket "$RUN/ctl.sock")
"${D[@]}" pipe create ${TAG}s --ip 10.76.0.2/24 >/dev/null
"${D[@]}" pipe create ${TAG}d --ip 10.76.0.3/24 >/dev/null
"${D[@]}" pipe create ${TAG}f --ip 10.76.0.4/24 >/dev/null
"${D[@]}" fc connect ${TAG}s ${TAG}f >/dev/null
"${D[@]}" run --pipe ${TAG}s --preload --bind "$WORK" -- "$WORK/connects" server 7700 >/dev/null 2>&1 & PIDS+=($!)
sleep 1

echo "path: connect p50 and mean, exchange p50 and mean (us), $count connections"
for r in $(seq "$repeat"); do
    out=$(ip netns exec ${TAG}c "$WORK/connects" client 10.77.0.2 7700 "$count")
    echo "bridge: $(echo $out)"
    out=$("${D[@]}" run --pipe ${TAG}d --preload --bind "$WORK" -- "$WORK/connects" client 10.76.0.2 7700 "$count")
    echo "docknet-preload: $(echo $out)"
    out=$("${D[@]}" run --pipe ${TAG}f --preload --bind "$WORK" -- "$WORK/connects" client 10.76.0.2 7700 "$count")
    echo "docknet-fc-preload: $(echo $out)"
done
