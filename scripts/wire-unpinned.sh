#!/usr/bin/env bash
# Two hosts as users run them: dnperf between host A and host B over a veth wire with nothing
# pinned and every program at its defaults. Paths: `kernel` (dnperf on kernel sockets at the
# hosts' own addresses, no daemon on the wire: the kernel's best case, no pod network),
# `xdp` and `auto` (a DockNet daemon on each host driving its end with `--nic-mode xdp`, or
# the default `auto`, which takes AF_PACKET with segment offload on a veth; dnperf in a
# container of each, `docknet run` without `--cpu`), and `host` (a daemon on each host with
# `--host-link`: the pods' only network is DockNet, and the hosts' kernels route between the
# two pod networks, as nodes of a cluster do), and `vxlan` (the daemons at the default link
# mode, each host's pod network routed through a VXLAN tunnel to the other host's address,
# `docknet route add --vxlan`, as `docknet-agent --vxlan` routes nodes that share no link).
# Workloads: 64 B and 64 KiB ping-pong,
# 64 KiB stream. The paths take turns within each repetition, each on a wire of its own.
# (The lab's two-host topology places its processes by hand; this is the unpinned case.)
#
#   ./scripts/wire-unpinned.sh [--help]    SECONDS_PER_RUN=2 REPEAT=3; QUICK=1: one short
#                                          64 B line per path; DOCKNET_BIN=DIR: docknet and
#                                          dnperf from DIR, no setup; WIRE_RATE=10gbit: the
#                                          wire shaped to that rate (tc's syntax);
#                                          WIRE_MTU=9000: a jumbo wire (and pipes of its MTU);
#                                          PATHS_ONLY="kernel xdp": only these paths
#
# WIRE_RATE shapes each host's end of the wire with TBF (burst 256 kB, latency 2 ms, as the
# lab's --wire-rate), a 10 Gbit/s link between two machines. The `xdp` path is left out then:
# AF_XDP's transmit hands frames to the driver past the queueing discipline, so a shaper on
# the host's end would not see them (the lab shapes its switch's ports instead).
#
# Prints a table and writes results/wire-unpinned.tsv (rep, path, workload, size, p50 us,
# p99 us, Gbps; results/wire-unpinned-RATE.tsv with WIRE_RATE). Runs as root; a normal user is
# re-run under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
docknet_bin
SECS=${SECONDS_PER_RUN:-2}
MTU=${WIRE_MTU:-1500}
REPEAT=${REPEAT:-3}
LOADS=("rr 64" "stream 65536" "rr 65536")
if [ "${QUICK:-0}" = 1 ]; then
    SECS=0.3
    REPEAT=1
    LOADS=("rr 64")
fi
OUT=${OUT:-results}
mkdir -p "$OUT"
TAG=dnwu$$
RUN=$(mktemp -d /dev/shm/docknet-wire-XXXXXX)
cleanup() {
    end_descendants 2
    for n in a b; do ip netns del "$TAG$n" 2>/dev/null || true; done
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# p50 and p99 (us) and Gbps from dnperf's JSON line on stdin ("-" where not measured)
summary() {
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])["result"]
l = r.get("one_way_ns") or {}
f = lambda v, s: "%.2f" % (v / s) if v else "-"
print("\t".join([f(l.get("p50"), 1000), f(l.get("p99"), 1000), f(r.get("gbps"), 1)]))'
}

wire_up() {
    ip netns add "${TAG}a"
    ip netns add "${TAG}b"
    ip link add eth0 netns "${TAG}a" mtu "$MTU" type veth peer name eth0 netns "${TAG}b" mtu "$MTU"
    ip -n "${TAG}a" addr add 192.168.79.1/24 dev eth0
    ip -n "${TAG}b" addr add 192.168.79.2/24 dev eth0
    for x in a b; do
        ip -n "$TAG$x" link set eth0 up
        ip -n "$TAG$x" link set lo up
        if [ -n "${WIRE_RATE:-}" ]; then
            ip netns exec "$TAG$x" tc qdisc add dev eth0 root tbf rate "$WIRE_RATE" \
                burst 256kb latency 2ms
        fi
    done
}

wire_down() {
    for x in a b; do ip netns del "$TAG$x"; done
}

# kernel WORKLOAD SIZE
kernel() {
    ip netns exec "${TAG}b" "$B/dnperf" server --stack kernel --bind 192.168.79.2:5000 \
        --conns 1 >/dev/null &
    sleep 0.3
    ip netns exec "${TAG}a" "$B/dnperf" client --stack kernel --connect 192.168.79.2:5000 \
        --workload "$1" --size "$2" --duration "$SECS" --warmup 0.2 --json | summary
    wait
}

# daemons MODE: a daemon on each host driving its end in MODE (`host`: a link to its host's
# kernel instead, which routes), a pipe on each
daemons() {
    local link=(--nic eth0 --nic-mode "$1") prefix=16
    if [ "$1" = host ]; then
        link=(--host-link)
        prefix=24
    fi
    if [ "$1" = vxlan ]; then
        link=(--nic eth0)
    fi
    for x in a b; do
        mkdir -p "$RUN/$x"
        ip netns exec "$TAG$x" "$B/docknet" --socket "$RUN/$x/ctl.sock" daemon --ephemeral \
            --run-dir "$RUN/$x/run" "${link[@]}" >"$RUN/$x/log" 2>&1 &
        echo $! >"$RUN/$x/pid"
    done
    for x in a b; do
        for _ in $(seq 100); do [ -S "$RUN/$x/ctl.sock" ] && break; sleep 0.05; done
    done
    if [ "$1" = host ]; then
        for x in a b; do ip netns exec "$TAG$x" sysctl -qw net.ipv4.ip_forward=1; done
        ip -n "${TAG}a" route add 10.79.2.0/24 via 192.168.79.2
        ip -n "${TAG}b" route add 10.79.1.0/24 via 192.168.79.1
    fi
    "$B/docknet" --socket "$RUN/a/ctl.sock" pipe create c0 --ip "10.79.1.1/$prefix" \
        --mtu "$MTU" >/dev/null
    "$B/docknet" --socket "$RUN/b/ctl.sock" pipe create s0 --ip "10.79.2.1/$prefix" \
        --mtu "$MTU" >/dev/null
    if [ "$1" = vxlan ]; then
        "$B/docknet" --socket "$RUN/a/ctl.sock" route add 10.79.2.0/24 --via 192.168.79.2 \
            --vxlan 1 >/dev/null
        "$B/docknet" --socket "$RUN/b/ctl.sock" route add 10.79.1.0/24 --via 192.168.79.1 \
            --vxlan 1 >/dev/null
    fi
}

daemons_down() {
    for x in a b; do
        kill "$(cat "$RUN/$x/pid")" 2>/dev/null || true
        wait "$(cat "$RUN/$x/pid")" 2>/dev/null || true
        rm -rf "${RUN:?}/$x"
    done
}

# docknet WORKLOAD SIZE: dnperf in a container on each host, at its defaults
docknet() {
    "$B/docknet" --socket "$RUN/b/ctl.sock" run --pipe s0 -- "$B/dnperf" server \
        --stack docknet --bind 10.79.2.1:5000 --conns 1 >/dev/null &
    sleep 0.5
    "$B/docknet" --socket "$RUN/a/ctl.sock" run --pipe c0 -- "$B/dnperf" client \
        --stack docknet --connect 10.79.2.1:5000 --workload "$1" --size "$2" \
        --duration "$SECS" --warmup 0.2 --json | summary
    wait
}

TSV=$OUT/wire-unpinned.tsv
PATHS=(kernel xdp auto host vxlan)
if [ -n "${WIRE_RATE:-}" ]; then
    TSV=$OUT/wire-unpinned-$WIRE_RATE.tsv
    PATHS=(kernel auto host vxlan)
    echo "wire shaped to $WIRE_RATE each way; the xdp path is left out (its frames pass the shaper by)" >&2
fi
if [ "$MTU" != 1500 ]; then
    TSV=${TSV%.tsv}-mtu$MTU.tsv
fi
if [ -n "${PATHS_ONLY:-}" ]; then
    read -r -a PATHS <<<"$PATHS_ONLY"
fi
printf 'rep\tpath\tworkload\tsize\tp50_us\tp99_us\tgbps\n' >"$TSV"
for rep in $(seq "$REPEAT"); do
    for path in "${PATHS[@]}"; do
        wire_up
        [ "$path" = kernel ] || daemons "$path"
        for load in "${LOADS[@]}"; do
            read -r w s <<<"$load"
            if [ "$path" = kernel ]; then r=$(kernel "$w" "$s"); else r=$(docknet "$w" "$s"); fi
            printf '%s\t%s\t%s\t%s\t%s\n' "$rep" "$path" "$w" "$s" "$r" | tee -a "$TSV"
        done
        if [ "$path" = vxlan ]; then
            # the tunnel carried it (not the flat subnet the pipes' prefix also covers)
            sent=$("$B/docknet" --socket "$RUN/a/ctl.sock" status --json |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["nic"]["counters"]["vxlan_sent"])')
            [ "$sent" -gt 0 ] || { echo "wire-unpinned.sh: nothing went through the VXLAN tunnel" >&2; exit 1; }
        fi
        [ "$path" = kernel ] || daemons_down
        wire_down
    done
done
echo "wrote $TSV"
