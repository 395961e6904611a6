#!/usr/bin/env bash
# What observing DockNet costs its data path: raw-frame ping-pong (one-way p50/p99) and a
# raw-frame stream (Mpps) between two containers through the daemon, measured with nothing
# watching, with Prometheus scraping the daemon's metrics 10 times a second, and with a
# packet capture of the receiving pipe running (written to /dev/null), alternated in one run.
# The daemon's master runs on core 0, both containers on core 1 (the lab's docknet placement).
#
#   ./scripts/ops-bench.sh [--help]     REPEAT=5 SECONDS_PER_RUN=2 by default
#
# Prints a table and writes results/ops.json. Runs as root; a normal user is re-run under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
./scripts/setup.sh
D=$PWD/target/release/docknet
REPEAT=${REPEAT:-5}
SECS=${SECONDS_PER_RUN:-2}
OUT=${OUT:-results}
mkdir -p "$OUT"
RUN=$(mktemp -d /dev/shm/docknet-ops-XXXXXX)
SOCK=$RUN/ctl.sock
PORT=$(( 20000 + RANDOM % 20000 ))
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$RUN"
}
trap cleanup EXIT INT TERM
$D --log warn daemon --run-dir "$RUN" --socket "$SOCK" --master-core 0 --idle spin \
    --fast-channels manual --ephemeral --metrics "127.0.0.1:$PORT" >/dev/null &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
$D --socket "$SOCK" pipe create ops-a --ip 10.77.0.1/24 >/dev/null
$D --socket "$SOCK" pipe create ops-b --ip 10.77.0.2/24 >/dev/null

# one measurement: $1 = rr|stream, $2 = off|scrape|capture; prints the client's or sink's JSON
measure() {
    local role=$1 watch=$2 server=echo wpid= spid=
    [ "$role" = stream ] && server=sink
    $D --socket "$SOCK" run --pipe ops-b --cpu 1 -- \
        $D raw peer --role $server --idle block --quiet-exit 1 >"$RUN/server.json" &
    spid=$!
    sleep 0.3
    case $watch in
        scrape) (while :; do curl -s "127.0.0.1:$PORT/metrics" >/dev/null; sleep 0.1; done) &
                wpid=$! ;;
        capture) $D --socket "$SOCK" capture ops-b --snaplen 128 -w /dev/null 2>/dev/null &
                 wpid=$!; sleep 0.2 ;;
    esac
    $D --socket "$SOCK" run --pipe ops-a --cpu 1 -- \
        $D raw peer --role "$role" --dst 10.77.0.2 --size 64 --duration "$SECS" --warmup 0.3 \
        --idle block >"$RUN/client.json"
    wait "$spid" || true
    if [ -n "$wpid" ]; then kill "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true; fi
    if [ "$role" = rr ]; then cat "$RUN/client.json"; else cat "$RUN/server.json"; fi
}

echo '[' >"$OUT/ops.json"
first=1
for r in $(seq "$REPEAT"); do
    for role in rr stream; do
        for watch in off scrape capture; do
            j=$(measure $role $watch | tail -1)
            [ $first = 1 ] || echo ',' >>"$OUT/ops.json"
            first=0
            echo "{\"repeat\":$r,\"workload\":\"$role\",\"watch\":\"$watch\",\"result\":$j}" >>"$OUT/ops.json"
            printf '.' >&2
        done
    done
done
echo ']' >>"$OUT/ops.json"
echo >&2
jq -r '
  def med: sort | if length == 0 then null elif length % 2 == 1 then .[length/2|floor]
           else (.[length/2-1] + .[length/2]) / 2 end;
  "watching   rr one-way p50 (us)  rr p99 (us)  stream (Mpps)",
  (group_by(.watch) | map({w: .[0].watch,
     p50: (map(select(.workload=="rr") | .result.one_way_ns.p50 / 1000) | med),
     p99: (map(select(.workload=="rr") | .result.one_way_ns.p99 / 1000) | med),
     mpps: (map(select(.workload=="stream") | .result.mpps) | med)})
   | sort_by({off:0, scrape:1, capture:2}[.w]) | .[]
   | "\(.w | . + " " * (10 - length)) \(.p50 * 100 | round / 100)               \(.p99 * 100 | round / 100)         \(.mpps * 1000 | round / 1000)")
' "$OUT/ops.json"
echo "(medians of $REPEAT runs of ${SECS} s each; results in $OUT/ops.json)"
