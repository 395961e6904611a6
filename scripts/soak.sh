#!/usr/bin/env bash
# The soak: 32 pipes (16 container pairs, 8 through the daemon and 8 over fast channels) move
# checked TCP streams (dnperf --workload check: every byte verified by the receiver) for
# MINUTES, while two hostile containers attack all the time (one scribbles over its whole
# region; the other truncates, grows and punches its region, floods broadcasts, storms its
# wake-up word and its socket). Halfway, the daemon is killed with SIGKILL and started again:
# it adopts every pipe from its fd holder, and the streams carry on. Every 10 s the daemon's
# RSS, open fds and regions are sampled.
#
# Passes (exit 0) when no checked byte was wrong or missing, every pair kept transferring after
# the restart, and the daemon's RSS, fds and regions did not grow between the first sample after
# the restart and the last one. Writes OUT/soak.json, OUT/samples.csv and OUT/pair-*.jsonl.
# Not part of CI (it takes MINUTES); its figures are in docs/benchmarks.md.
#
#   ./scripts/soak.sh [--minutes 10] [--out soak-results]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
MINUTES=10
OUT=soak-results
while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "soak: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
docknet_root --minutes "$MINUTES" --out "$OUT"
./scripts/setup.sh
D=$PWD/target/release
RD=/dev/shm/docknet-soak$$
S=$RD/ctl.sock
mkdir -p "$OUT"
rm -f "$OUT"/pair-*.jsonl "$OUT"/samples.csv "$OUT"/soak.json
PIDS=()
DPID=
cleanup() {
    trap - EXIT INT TERM
    # the containers first (each detaches its pipe), then the daemon and its fd holder; the
    # supervisors give up detaching within 10 s once the daemon is gone
    end_descendants 12 "$DPID"
    end_descendants 3
    if [ -f "$RD/holder.pid" ]; then kill -9 "$(cat "$RD/holder.pid")" 2>/dev/null || true; fi
    rm -rf "$RD"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_daemon() {
    "$D/docknet" --log warn --socket "$S" daemon --run-dir "$RD" --fast-channels manual >>"$OUT/daemon.log" 2>&1 &
    DPID=$!
    for _ in $(seq 200); do [ -S "$S" ] && "$D/docknet" --socket "$S" status >/dev/null 2>&1 && return; sleep 0.05; done
    echo "soak: the daemon did not start" >&2
    exit 1
}
dn() { "$D/docknet" --socket "$S" "$@"; }

start_daemon
for i in $(seq 0 15); do
    dn pipe create "p$((2 * i))" --ip "10.90.$i.1/24" >/dev/null
    dn pipe create "p$((2 * i + 1))" --ip "10.90.$i.2/24" >/dev/null
    if [ $((i % 2)) = 0 ]; then dn fc connect "p$((2 * i))" "p$((2 * i + 1))" >/dev/null; fi
done
dn pipe create evil1 --ip 10.91.0.1/24 >/dev/null
dn pipe create evil2 --ip 10.91.0.2/24 >/dev/null
START=$(date +%s)
END=$((START + MINUTES * 60))
HALF=$((START + MINUTES * 30))

# one pair: checked streams of 16 MiB, one after the other, until the end
pair() {
    local i=$1 port=7000 log=$OUT/pair-$1.jsonl
    while [ "$(date +%s)" -lt "$END" ]; do
        port=$((port + 1))
        # (not through `dn`: $! must be docknet's own pid, to end it below)
        "$D/docknet" --socket "$S" run --pipe "p$((2 * i + 1))" -- "$D/dnperf" server --stack docknet \
            --idle adaptive --bind "10.90.$i.2:$port" --conns 1 >/dev/null 2>&1 &
        local srv=$!
        sleep 0.3
        local line kind
        if line=$(dn run --pipe "p$((2 * i))" -- "$D/dnperf" client --stack docknet --idle adaptive \
            --connect "10.90.$i.2:$port" --workload check --bytes 16777216 --size 16384 --json 2>&1 | tail -1); then
            echo "{\"t\":$(date +%s),\"ok\":true,\"report\":$line}" >>"$log"
        else
            # a container that could not start, or a connection that could not be made, while the
            # daemon was down is not a transfer that failed: nothing was sent
            case "$line" in
            "docknet: error:"*) kind=start ;;
            *"error: connecting to"*) kind=connect ;;
            *) kind=transfer ;;
            esac
            echo "{\"t\":$(date +%s),\"ok\":false,\"kind\":\"$kind\",\"error\":$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" >>"$log"
            sleep 0.5
        fi
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    done
}
for i in $(seq 0 15); do pair "$i" & PIDS+=($!); done

# the hostile containers
dn run --pipe evil1 -- sh -c "while true; do $D/dnattack scribble --seconds 5; done" >/dev/null 2>&1 &
PIDS+=($!)
dn run --pipe evil2 -- sh -c "while true; do for a in truncate grow punch; do $D/dnattack \$a; done; \
    $D/dnattack wake-storm --seconds 3; $D/dnattack flood --seconds 3; $D/dnattack connect-storm --seconds 2; done" \
    >/dev/null 2>&1 &
PIDS+=($!)

# RssAnon is the daemon's own memory; its RSS also counts the pipes' shared pages it has
# touched, which grows until every ring slot has been used once
echo "t,phase,daemon_pid,rss_anon_kib,rss_shmem_kib,fds,memfds,holder_fds" >"$OUT/samples.csv"
sample() {
    local phase=$1 rss shm fds memfds hfds=0
    rss=$(sed -n 's/^RssAnon:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$DPID/status" 2>/dev/null || echo 0)
    shm=$(sed -n 's/^RssShmem:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$DPID/status" 2>/dev/null || echo 0)
    fds=$(ls "/proc/$DPID/fd" 2>/dev/null | wc -l)
    memfds=$(ls -l "/proc/$DPID/fd" 2>/dev/null | grep -c memfd || true)
    if [ -f "$RD/holder.pid" ]; then hfds=$(ls "/proc/$(cat "$RD/holder.pid")/fd" 2>/dev/null | wc -l); fi
    echo "$(($(date +%s) - START)),$phase,$DPID,$rss,$shm,$fds,$memfds,$hfds" >>"$OUT/samples.csv"
}
restarted=0
phase=before
echo "soak: $MINUTES min; 32 pipes, 2 hostile containers; daemon restart at $((MINUTES * 30)) s" >&2
while [ "$(date +%s)" -lt "$END" ]; do
    sample $phase
    if [ $restarted = 0 ] && [ "$(date +%s)" -ge "$HALF" ]; then
        echo "soak: kill -9 the daemon ($DPID) and start it again" >&2
        KILL_T=$(($(date +%s) - START))
        kill -9 "$DPID"
        wait "$DPID" 2>/dev/null || true
        sleep 1
        start_daemon
        restarted=1
        phase=after
        RESTART_T=$(($(date +%s) - START))
        sleep 10
        continue
    fi
    sleep 10
done
for i in $(seq 0 15); do wait "${PIDS[$i]}" 2>/dev/null || true; done
sample end
python3 - "$OUT" "${RESTART_T:-0}" "$MINUTES" "$START" "${KILL_T:-0}" <<'EOF'
import csv, glob, json, sys
out, restart, minutes, start, kill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ok = bad_bytes = failed = not_started = bytes_ok = 0
connect_down = connect_up = 0
after_restart = 0
per_pair = {}
for f in sorted(glob.glob(f"{out}/pair-*.jsonl")):
    n = f.split("-")[-1].split(".")[0]
    per_pair[n] = 0
    for line in open(f):
        r = json.loads(line)
        if r["ok"]:
            c = r["report"]["result"].get("corrupt_bytes", 0)
            bad_bytes += c
            ok += 1
            bytes_ok += r["report"]["result"].get("bytes") or 0
            if r["t"] > restart + 5:
                per_pair[n] += 1
        elif r.get("kind") == "start":
            not_started += 1
        elif r.get("kind") == "connect":
            # a connect gives up after 10 s: one that failed up to 15 s after the kill was
            # tried while the daemon was down
            if kill <= r["t"] - start <= restart + 15:
                connect_down += 1
            else:
                connect_up += 1
        else:
            failed += 1
rows = list(csv.DictReader(open(f"{out}/samples.csv")))
after = [r for r in rows if r["phase"] in ("after", "end")]
first, last = (after[0], after[-1]) if after else (rows[0], rows[-1])
grow = {k: int(last[k]) - int(first[k]) for k in ("rss_anon_kib", "fds", "memfds", "holder_fds")}
summary = {
    "minutes": minutes, "pipes": 32, "transfers_ok": ok, "transfers_failed": failed,
    "containers_not_started_while_the_daemon_was_down": not_started,
    "connections_not_made_while_the_daemon_was_down": connect_down,
    "connections_refused_otherwise": connect_up,
    "checked_bytes": bytes_ok, "corrupt_bytes": bad_bytes, "restart_at_s": restart,
    "pairs_transferring_after_restart": sum(1 for v in per_pair.values() if v > 0),
    "daemon_after_restart_first": first, "daemon_last": last, "growth": grow,
}
json.dump(summary, open(f"{out}/soak.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
passed = (bad_bytes == 0 and failed == 0 and connect_up == 0 and ok > 0
          and summary["pairs_transferring_after_restart"] == 16
          and grow["fds"] <= 0 and grow["memfds"] <= 0 and grow["rss_anon_kib"] <= 1024)
print("soak:", "PASSED" if passed else "FAILED")
sys.exit(0 if passed else 1)
EOF
