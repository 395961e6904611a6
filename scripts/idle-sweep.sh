#!/usr/bin/env bash
# Which idle policy DockNet's programs wait with, measured where users run them: 64 B TCP
# ping-pong (dnperf) between two containers (`docknet run`), through the daemon and over a fast
# channel, for pairs of policies (the daemon's master, the peers'; `default` gives none), with
# nothing pinned and with both containers confined to core 1 (a pod with one CPU; the daemon
# stays free), beside the kernel bridge (dnperf on kernel sockets in two namespaces on a bridge
# in a third) placed the same way. Each line is its own daemon or bridge, one after another.
# Path `auto` is the daemon and the peers at their defaults, with the fast channel the daemon
# builds for pipes that talk (the `daemon` and `fc` lines turn that off).
#
#   ./scripts/idle-sweep.sh [--help]    SECONDS_PER_RUN=1.5 REPEAT=1; QUICK=1: four lines, 0.3 s
#                                       DOCKNET_BIN=DIR: docknet and dnperf from DIR, no setup
#
# Prints a table (one-way latency p50 / p99 in us) and writes results/idle-sweep.tsv. Runs as
# root; a normal user is re-run under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
docknet_bin
SECS=${SECONDS_PER_RUN:-1.5}
REPEAT=${REPEAT:-1}
OUT=${OUT:-results}
mkdir -p "$OUT"
TAG=dnsw$$
RUN=$(mktemp -d /dev/shm/docknet-sweep-XXXXXX)
cleanup() {
    end_descendants 2
    for n in h a b; do ip netns del "$TAG$n" 2>/dev/null || true; done
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# one-way p50 and p99 (us) and transactions from dnperf's JSON line on stdin
summary() {
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])["result"]
l = r["one_way_ns"]
print("%.2f\t%.2f\t%d" % (l["p50"] / 1000, l["p99"] / 1000, r["transactions"]))'
}

# bridge PLACE: dnperf over the kernel bridge
bridge() {
    local ts=() h=${TAG}h
    [ "$1" = one-core ] && ts=(taskset -c 1)
    ip netns add "$h"
    ip netns add "${TAG}a"
    ip netns add "${TAG}b"
    ip -n "$h" link add br0 type bridge
    ip -n "$h" link set br0 up
    for x in a b; do
        ip link add "$TAG$x"0 netns "$h" type veth peer name eth0 netns "$TAG$x"
        ip -n "$h" link set "$TAG$x"0 master br0 up
        ip -n "$TAG$x" link set eth0 up
        ip -n "$TAG$x" link set lo up
    done
    ip -n "${TAG}a" addr add 10.79.0.2/24 dev eth0
    ip -n "${TAG}b" addr add 10.79.0.3/24 dev eth0
    "${ts[@]}" ip netns exec "${TAG}a" "$B/dnperf" server --stack kernel \
        --bind 10.79.0.2:5000 --conns 1 >/dev/null &
    sleep 0.3
    "${ts[@]}" ip netns exec "${TAG}b" "$B/dnperf" client --stack kernel \
        --connect 10.79.0.2:5000 --workload rr --size 64 --duration "$SECS" --warmup 0.2 \
        --json | summary
    wait
    for n in a b h; do ip netns del "$TAG$n"; done
}

# docknet PLACE PATH DAEMON_IDLE PEER_IDLE: dnperf in two containers of a daemon of its own
docknet() {
    local place=$1 path=$2 didle=$3 pidle=$4 ts=() idle=() sock=$RUN/ctl.sock
    [ "$place" = one-core ] && ts=(taskset -c 1)
    [ "$pidle" = default ] || idle=(--idle "$pidle")
    local d=("$B/docknet" --socket "$sock")
    local dflags=()
    [ "$didle" = default ] || dflags=(--idle "$didle")
    # daemon and fc measure their own path; auto is the daemon at its defaults, which joins
    # the two pipes by a fast channel of its own once they talk
    [ "$path" = auto ] || dflags+=(--fast-channels manual)
    "${d[@]}" --log warn daemon "${dflags[@]}" --run-dir "$RUN/d" --ephemeral >/dev/null &
    local dpid=$!
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.02; done
    "${d[@]}" pipe create s --ip 10.78.0.2/24 >/dev/null
    "${d[@]}" pipe create c --ip 10.78.0.3/24 >/dev/null
    [ "$path" = fc ] && "${d[@]}" fc connect c s >/dev/null
    "${ts[@]}" "${d[@]}" run --pipe s -- "$B/dnperf" server --stack docknet \
        --bind 10.78.0.2:5000 --conns 1 "${idle[@]}" >/dev/null &
    local spid=$!
    sleep 0.3
    "${ts[@]}" "${d[@]}" run --pipe c -- "$B/dnperf" client --stack docknet \
        --connect 10.78.0.2:5000 --workload rr --size 64 --duration "$SECS" --warmup 0.2 \
        --json "${idle[@]}" | summary
    wait "$spid"
    kill "$dpid"
    wait "$dpid" || true
    rm -rf "$RUN/d" "$sock"
}

# PATH DAEMON PEERS, per placement
LINES=(
    "bridge - -"
    "daemon adaptive:50 spin"
    "daemon adaptive:50 adaptive:50"
    "daemon adaptive:50 block"
    "daemon adaptive:50 adaptive"
    "daemon adaptive adaptive"
    "daemon adaptive block"
    "daemon block adaptive"
    "daemon block block"
    "daemon default default"
    "fc - adaptive:50"
    "fc - block"
    "fc - adaptive"
    "fc - spin"
    "fc - default"
    "auto default default"
)
PLACES=(unpinned one-core)
if [ "${QUICK:-0}" = 1 ]; then
    LINES=("bridge - -" "daemon default default" "fc - default" "auto default default")
    PLACES=(unpinned)
    SECS=0.3
fi
TSV=$OUT/idle-sweep.tsv
printf 'placement\tpath\tdaemon\tpeers\trepeat\tp50_us\tp99_us\ttransactions\n' >"$TSV"
printf '%-9s %-7s %-11s %-11s %10s %10s %9s\n' PLACEMENT PATH DAEMON PEERS 'p50(us)' 'p99(us)' TX
for rep in $(seq "$REPEAT"); do
    for place in "${PLACES[@]}"; do
        for line in "${LINES[@]}"; do
            read -r path didle pidle <<<"$line"
            # spinning peers on one core only wait out scheduler slices: left out there
            if [ "$place" = one-core ] && [ "$pidle" = spin ]; then continue; fi
            if [ "$path" = bridge ]; then
                res=$(bridge "$place")
            else
                res=$(docknet "$place" "$path" "${didle/-/default}" "$pidle")
            fi
            IFS=$'\t' read -r p50 p99 tx <<<"$res"
            printf '%-9s %-7s %-11s %-11s %10s %10s %9s\n' "$place" "$path" "$didle" "$pidle" \
                "$p50" "$p99" "$tx"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$place" "$path" "$didle" "$pidle" "$rep" \
                "$p50" "$p99" "$tx" >>"$TSV"
        done
    done
done
echo "wrote $TSV"
