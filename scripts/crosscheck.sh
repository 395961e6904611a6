#!/usr/bin/env bash
# Cross-checks dnperf --stack kernel against sockperf (ping-pong latency) and iperf3 (goodput)
# on one kernel mode: TCP over a Linux bridge between two namespaces this script creates (and
# removes on exit, also on error or Ctrl-C). Needs root, sockperf and iperf3 (installed if
# missing). Prints both tools' figures side by side and their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
for t in sockperf iperf3; do
    command -v "$t" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sockperf iperf3 >/dev/null; }
done
DNPERF=$PWD/target/release/dnperf
ID="dnxc$$"
H="${ID}h"; A="${ID}a"; B="${ID}b"
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    for ns in "$A" "$B" "$H"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
for ns in "$H" "$A" "$B"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
ip -n "$H" link add br0 type bridge; ip -n "$H" link set br0 up
ip -n "$H" link add va type veth peer name eth0 netns "$A"
ip -n "$H" link add vb type veth peer name eth0 netns "$B"
for p in va vb; do ip -n "$H" link set "$p" master br0 up; done
ip -n "$A" addr add 10.67.0.1/24 dev eth0; ip -n "$A" link set eth0 up
ip -n "$B" addr add 10.67.0.2/24 dev eth0; ip -n "$B" link set eth0 up
SRV=10.67.0.2
DUR=${DUR:-3}

bg() { "$@" >/dev/null 2>&1 & PIDS+=($!); sleep 0.5; }
stop_bg() { kill "${PIDS[-1]}" 2>/dev/null || true; wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; }

echo "placement  size   sockperf rtt/2 p50 (us)  dnperf rtt/2 p50 (us)  dnperf/sockperf"
for cores in "1 1" "0 1"; do
    set -- $cores
    bg ip netns exec "$B" taskset -c "$2" sockperf sr --tcp -i "$SRV" -p 11111
    sp=$(ip netns exec "$A" taskset -c "$1" sockperf pp --tcp -i "$SRV" -p 11111 -m 64 -t "$DUR" --full-rtt 2>/dev/null \
        | grep -E "percentile 50.000" | awk '{print $NF}')
    stop_bg
    bg ip netns exec "$B" "$DNPERF" server --stack kernel --bind "$SRV:11112" --conns 1 --cpu "$2"
    dn=$(ip netns exec "$A" "$DNPERF" client --stack kernel --connect "$SRV:11112" --workload rr --size 64 \
        --duration "$DUR" --warmup 0.5 --cpu "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["half_rtt_ns"]["p50"]/1000)')
    stop_bg
    # sockperf --full-rtt reports the round trip; halve it
    sp_half=$(python3 -c "print(float('$sp')/2)")
    printf "c%s s%s     64     %8.2f                 %8.2f               %.2f\n" "$1" "$2" "$sp_half" "$dn" "$(python3 -c "print($dn/$sp_half)")"
done

echo
echo "placement  size   iperf3 (Gbps)  dnperf (Gbps)  dnperf/iperf3"
for size in 65536 1024; do
    bg ip netns exec "$B" taskset -c 1 iperf3 -s -B "$SRV" -p 5201 -1
    ip3=$(ip netns exec "$A" taskset -c 0 iperf3 -c "$SRV" -p 5201 -t "$DUR" -O 1 -l "$size" -J \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)')
    stop_bg
    bg ip netns exec "$B" "$DNPERF" server --stack kernel --bind "$SRV:5202" --conns 1 --cpu 1
    dn=$(ip netns exec "$A" "$DNPERF" client --stack kernel --connect "$SRV:5202" --workload stream --size "$size" \
        --duration "$DUR" --warmup 1 --cpu 0 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["gbps"])')
    stop_bg
    printf "c0 s1  %6s   %8.2f       %8.2f       %.2f\n" "$size" "$ip3" "$dn" "$(python3 -c "print($dn/$ip3)")"
done
