#!/usr/bin/env bash
# The CPU a flow held at its rate limit costs, with the daemon at its defaults (the lab's
# `docknet bench rate` runs its daemon at `--idle block`): a daemon of its own, two pipes, an
# egress limit on the sender's, and dnperf streaming 16 KiB writes from a container on one pipe
# to a container on the other (`docknet run`, nothing pinned). Each thread's CPU is read from
# its `schedstat` over SECONDS in the middle of the flow.
#
#   ./scripts/paced-cpu.sh [--help]    RATES="1gbit 200mbit" SECONDS_MEASURED=8 DAEMON_IDLE=
#                                      (empty: the daemon's default policy)
#                                      DOCKNET_BIN=DIR: docknet and dnperf from DIR, no setup
#
# Prints one line per rate: the master's, the sender's and the receiver's share of a core, their
# sum, the goodput and the sum's CPU per KiB delivered. Runs as root; a normal user is re-run
# under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
docknet_bin
RATES=${RATES:-"1gbit 200mbit"}
SECS=${SECONDS_MEASURED:-8}
RUN=$(mktemp -d /dev/shm/docknet-paced-XXXXXX)
SOCK=$RUN/ctl.sock
cleanup() {
    end_descendants 2
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# per-thread CPU (ns) of the daemon's masters and of the two dnperf: "tid role ns" lines
sample() {
    local t p
    for t in /proc/"$1"/task/*; do
        echo "$(basename "$t") $(tr ' ' _ <"$t"/comm 2>/dev/null) $(cut -d' ' -f1 "$t"/schedstat 2>/dev/null)"
    done
    for p in $(pgrep -f "dnperf client .*10.66.0.2:7000"); do
        for t in /proc/"$p"/task/*; do echo "$(basename "$t") sender $(cut -d' ' -f1 "$t"/schedstat 2>/dev/null)"; done
    done
    for p in $(pgrep -f "dnperf server .*10.66.0.2:7000"); do
        for t in /proc/"$p"/task/*; do echo "$(basename "$t") receiver $(cut -d' ' -f1 "$t"/schedstat 2>/dev/null)"; done
    done
}

printf '%-10s %8s %8s %10s %8s %8s %12s\n' RATE MASTER SENDER RECEIVER TOTAL GBPS "NS/KIB"
for rate in $RATES; do
    dflags=()
    [ -n "${DAEMON_IDLE:-}" ] && dflags=(--idle "$DAEMON_IDLE")
    "$B/docknet" --log warn daemon "${dflags[@]}" --run-dir "$RUN" --socket "$SOCK" \
        --fast-channels manual >/dev/null 2>&1 &
    dpid=$!
    for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
    dn() { "$B/docknet" --socket "$SOCK" "$@" >/dev/null; }
    dn pipe create a --ip 10.66.0.1/24
    dn pipe create b --ip 10.66.0.2/24
    dn rate set a --egress "$rate"
    dn run --pipe b -- "$B/dnperf" server --stack docknet --idle block \
        --bind 10.66.0.2:7000 --conns 1 &
    sleep 0.5
    "$B/docknet" --socket "$SOCK" run --pipe a -- "$B/dnperf" client --stack docknet \
        --idle block --connect 10.66.0.2:7000 --workload stream --size 16384 \
        --duration $((SECS + 6)) --json >"$RUN/client.json" 2>/dev/null &
    cpid=$!
    sleep 4
    before=$(sample "$dpid")
    sleep "$SECS"
    after=$(sample "$dpid")
    wait "$cpid" || true
    python3 - "$rate" "$SECS" "$before" "$after" "$RUN/client.json" <<'PY'
import json, sys
rate, secs, a, b, report = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def parse(s):
    out = {}
    for line in s.strip().splitlines():
        p = line.split()
        if len(p) == 3:
            out[p[0]] = (p[1], int(p[2]))
    return out
a, b = parse(a), parse(b)
share = {"docknet-master": 0.0, "sender": 0.0, "receiver": 0.0}
for tid, (role, ns) in b.items():
    if tid in a and role in share:
        share[role] += (ns - a[tid][1]) / (secs * 1e9) * 100
gbps = json.loads(open(report).read().strip().splitlines()[-1])["result"]["gbps"]
total = sum(share.values())
kib_per_s = gbps * 1e9 / 8 / 1024
print("%-10s %7.1f%% %7.1f%% %9.1f%% %7.1f%% %8.3f %12.0f" % (
    rate, share["docknet-master"], share["sender"], share["receiver"], total, gbps,
    total / 100 * 1e9 / kib_per_s))
PY
    kill "$dpid" 2>/dev/null || true
    wait "$dpid" 2>/dev/null || true
    end_descendants 2
    rm -rf "${RUN:?}"/*
done
