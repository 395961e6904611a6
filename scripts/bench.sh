#!/usr/bin/env bash
# The main job: installs what is missing, builds, then measures DockNet (through the daemon and
# over a fast channel) side by side with the kernel's container networks, all measured by
# dnperf in one run: rr (latency) and stream (goodput) at 64 B, 1 KiB and 64 KiB over loopback,
# bridge, bridge-nat, macvlan, ovs (ipvlan where the kernel has it), docknet and docknet-fc, hand-
# placed on chosen cores, then rr on the bridge and DockNet as a user gets them (nothing pinned,
# every program at its defaults), plus a
# short pairs sweep (1, 4, 16 concurrent pairs); then two hosts joined by a wire: host, routed,
# nat, vxlan against DockNet's daemons on the wire (docknet: AF_XDP, docknet-packet: AF_PACKET);
# then rate limits (a TCP flow under stepped limits, and beside a UDP hog) on the bridge with the
# CNI bandwidth plugin against DockNet's limiter; then HTTP: docknet-httpd under docknet-load
# on the bridge, through the daemon and over a fast channel (pinned, and unpinned at every
# program's defaults), with wrk and nginx (a master and its workers) on the bridge and, unmodified
# under the preload library, over a fast channel,
# the latency the NAT load balancer adds, and a web cluster of one and two backends.
# Prints the tables and writes the report: results/index.html (figures and tables),
# results/report.md, results/tcp-*.{json,md}, results/rate.{json,md}. About 5 minutes once built.
#
#   FULL=1 ./scripts/bench.sh    the full lab (every mode, MTU 1500 and 9000, the size sweeps,
#                                1..128 pairs, the paper's Fig. 10 on one core, sockperf/iperf3
#                                cross-check; two hosts with the wire unshaped and shaped to
#                                10 Gbit/s; HTTP at 8, 64 and 256 connections, the NAT overhead,
#                                the web cluster with 1-4 backends; an idle host): about 45 minutes
#
# Extra arguments go to every `docknet bench` run (see `docknet bench rr --help`). Runs as
# root; a normal user is re-run under sudo.
#
#   ./scripts/bench.sh [--help] [DOCKNET BENCH OPTIONS...]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
./scripts/setup.sh
D=target/release/docknet
# runs one step of the job and says how long it took (the job's time is a budget: see README)
timed() {
    local what=$1 t0=$SECONDS
    shift
    "$@"
    echo "bench.sh: $what took $((SECONDS - t0)) s (the job so far: $((SECONDS - START)) s)" >&2
}
START=$SECONDS
OUT=${OUT:-results}
mkdir -p "$OUT"
rm -f "$OUT"/tcp-*.json "$OUT"/tcp-*.md "$OUT"/rate.json "$OUT"/rate.md "$OUT"/idle.json
if [ "${FULL:-0}" = 1 ]; then
    MODES=loopback,container,veth,bridge,bridge-nat,macvlan,ipvlan,ovs,sriov,docknet,docknet-fc
    COMMON=(--repeat 2 --duration 1 --warmup 0.3 --mtus 1500,9000 --report "$OUT")
    $D bench rr --modes "$MODES" --sizes 64,1024,16384,65536 --crosscheck --placement pinned,unpinned,one-core "${COMMON[@]}" "$@"
    $D bench stream --modes "$MODES" --sizes 64,1024,16384,65536,409600 --crosscheck --placement pinned,unpinned,one-core "${COMMON[@]}" "$@"
    $D bench pairs --modes bridge,macvlan,ovs,docknet,docknet-fc --pairs 1,2,4,8,16,32,64,128 \
        --sizes 1024 --repeat 1 --duration 1 --warmup 0.3 --report "$OUT" "$@"
    # pairs at MTU 9000 too, written beside the MTU 1500 run (the report reads every tcp-*.json)
    $D bench pairs --modes bridge,macvlan,ovs,docknet,docknet-fc --pairs 1,2,4,8,16,32,64,128 \
        --sizes 1024 --repeat 1 --duration 1 --warmup 0.3 --mtus 9000 --json "$OUT/tcp-pairs-mtu9000.json" "$@"
    TWO=host,routed,nat,macvlan,vxlan,docknet,docknet-packet
    TCOMMON=(--topology two-host --modes "$TWO" --repeat 2 --duration 1 --warmup 0.3)
    $D bench rr "${TCOMMON[@]}" --sizes 64,1024,16384,65536 --report "$OUT" "$@"
    $D bench stream "${TCOMMON[@]}" --sizes 64,1024,16384,65536 --report "$OUT" "$@"
    $D bench pairs --topology two-host --modes host,routed,docknet,docknet-packet --pairs 1,4,16,64 \
        --sizes 1024 --duration 1 --warmup 0.3 --report "$OUT" "$@"
    # the wire shaped to the paper's 10 GbE: a report of its own (its rows are not comparable
    # with the unshaped wire's)
    $D bench stream "${TCOMMON[@]}" --sizes 1024,65536 --wire-rate 10gbit \
        --report "$OUT/wire-10gbit" "$@"
    # the paper's Fig. 10: every container on core 1, the master alone on core 0, each idle policy
    $D bench pairs --modes bridge,docknet,docknet-fc --cores 1 --peer-idle spin,adaptive,block \
        --pairs 1,2,4,8,16 --sizes 1024 --duration 1 --warmup 0.3 --repeat 2 \
        --json "$OUT/tcp-pairs-one-core.json" "$@"
    # rate limits: the paper's Fig. 9 on the bridge (CNI bandwidth, TBF) and on DockNet
    $D bench rate --report "$OUT"
    # the paper's services (Fig. 11): HTTP, the NAT load balancer, the web cluster
    $D bench http --modes bridge,docknet,docknet-fc,docknet-fc-preload,docknet-preload \
        --connections 8,64,256 --placement pinned,unpinned --duration 5 --warmup 1 \
        --repeat 2 --report "$OUT"
    $D bench nat --rounds 5 --duration 2 --report "$OUT"
    $D bench http --backends 1,2,3,4 --work-us 10 --duration 4 --warmup 1 --repeat 2 --report "$OUT"
    $D bench idle --containers 32 --seconds 10 --report "$OUT"
    $D report "$OUT"/tcp-*.json "$OUT"/rate.json "$OUT"/idle.json --out "$OUT"
else
    MODES=loopback,bridge,bridge-nat,macvlan,ipvlan,ovs,docknet,docknet-fc
    COMMON=(--sizes 64,1024,65536 --repeat 1 --duration 0.6 --warmup 0.2 --report "$OUT")
    timed "rr, pinned" $D bench rr --modes "$MODES" "${COMMON[@]}" "$@"
    # what a user gets: nothing pinned, every program at its defaults (a file of its own beside
    # tcp-rr.json; the report reads both)
    timed "rr, unpinned" $D bench rr --modes bridge,docknet,docknet-fc,docknet-auto --placement unpinned --sizes 64,65536 \
        --repeat 2 --duration 0.8 --warmup 0.2 --json "$OUT/tcp-rr-unpinned.json" "$@"
    timed "stream" $D bench stream --modes "$MODES" "${COMMON[@]}" "$@"
    timed "pairs" $D bench pairs --modes bridge,docknet,docknet-auto --pairs 1,4,16 --sizes 1024 \
        --duration 0.5 --warmup 0.2 --report "$OUT" "$@"
    TCOMMON=(--topology two-host --modes host,routed,vxlan,docknet,docknet-packet --repeat 1
        --duration 0.5 --warmup 0.2 --report "$OUT")
    timed "two hosts, rr" $D bench rr "${TCOMMON[@]}" --sizes 64,1024 "$@"
    timed "two hosts, stream" $D bench stream "${TCOMMON[@]}" --sizes 1024,65536 "$@"
    timed "rate limits" $D bench rate --steps 50%,10mbit --step 1 --timeline 1,2.5,3.5 --report "$OUT"
    timed "http" $D bench http --modes bridge,docknet,docknet-fc,docknet-fc-preload --placement pinned,unpinned \
        --duration 0.8 --warmup 0.2 --report "$OUT"
    timed "nat" $D bench nat --rounds 1 --duration 1 --warmup 0.3 --report "$OUT"
    timed "web cluster" $D bench http --backends 1,2 --duration 1 --warmup 0.3 --report "$OUT"
fi
echo "report: $OUT/index.html (also $OUT/report.md; per workload $OUT/tcp-*.md)"
