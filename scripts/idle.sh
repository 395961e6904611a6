#!/usr/bin/env bash
# An idle host: a daemon (--idle adaptive) and N containers, each running a DockLib server
# (dnperf server --stack docknet) waiting for a connection that never comes. After a settling
# pause, measures for SECONDS the CPU time of the daemon and of every process of the containers
# (exact, from each task's schedstat) and the engine threads' wake-ups, and prints them as JSON.
# Not part of CI; its figures are in docs/benchmarks.md.
#
#   ./scripts/idle.sh [--containers 32] [--seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
N=32
SECS=10
while [ $# -gt 0 ]; do
    case "$1" in
    --containers) N=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    *) echo "idle: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
docknet_root --containers "$N" --seconds "$SECS"
./scripts/setup.sh >/dev/null
D=$PWD/target/release
RD=/dev/shm/docknet-idle$$
S=$RD/ctl.sock
DPID=
cleanup() {
    trap - EXIT INT TERM
    end_descendants 12 "$DPID"
    end_descendants 3
    if [ -f "$RD/holder.pid" ]; then kill -9 "$(cat "$RD/holder.pid")" 2>/dev/null || true; fi
    rm -rf "$RD"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$D/docknet" --log warn --socket "$S" daemon --run-dir "$RD" --idle adaptive >/dev/null 2>&1 &
DPID=$!
for _ in $(seq 200); do [ -S "$S" ] && "$D/docknet" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
for i in $(seq 1 "$N"); do
    "$D/docknet" --socket "$S" pipe create "p$i" --ip "10.90.$((i / 250)).$((i % 250 + 1))/16" >/dev/null
    "$D/docknet" --socket "$S" run --pipe "p$i" -- "$D/dnperf" server --stack docknet \
        --idle adaptive --bind "10.90.$((i / 250)).$((i % 250 + 1)):7000" --conns 1 >/dev/null 2>&1 &
done
sleep 3
# nanoseconds on a CPU and voluntary switches of the engines, over every task below the script
sample() {
    local ns=0 wakes=0 p t v
    for p in $(descendants $$); do
        for t in /proc/"$p"/task/*; do
            v=$(cut -d' ' -f1 "$t/schedstat" 2>/dev/null) || continue
            ns=$((ns + ${v:-0}))
            if [ "$(cat "$t/comm" 2>/dev/null)" = docklib-engine ]; then
                v=$(awk '/^voluntary_ctxt_switches/{print $2}' "$t/status" 2>/dev/null)
                wakes=$((wakes + ${v:-0}))
            fi
        done
    done
    echo "$ns $wakes"
}
read -r ns0 w0 < <(sample)
t0=$(date +%s%N)
sleep "$SECS"
read -r ns1 w1 < <(sample)
t1=$(date +%s%N)
python3 - "$N" "$ns0" "$ns1" "$w0" "$w1" "$t0" "$t1" <<'EOF'
import json, sys
n, ns0, ns1, w0, w1, t0, t1 = map(int, sys.argv[1:])
secs = (t1 - t0) / 1e9
print(json.dumps({
    "containers": n,
    "seconds": round(secs, 2),
    "cpu_percent_of_a_core": round((ns1 - ns0) / 1e9 / secs * 100, 3),
    "per_container_percent": round((ns1 - ns0) / 1e9 / secs * 100 / n, 4),
    "engine_wakeups_per_second_per_container": round((w1 - w0) / secs / n, 1),
}))
EOF
