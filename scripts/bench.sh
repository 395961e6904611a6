#!/usr/bin/env bash
# The main job: sets up, then measures DockNet (through the daemon and over a fast channel)
# side by side with the kernel's container networks (loopback, bridge, bridge + NAT port
# mapping, macvlan; ipvlan where the kernel has it), all measured by dnperf, plus the raw
# DockPipe rings; prints the tables and writes results/tcp-rr.{md,json},
# results/tcp-stream.{md,json} and results/raw-bench.{md,json}. About 5 minutes.
# Extra arguments go to both `docknet bench` runs (see `docknet bench rr --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
D=target/release/docknet
MODES=loopback,bridge,bridge-nat,macvlan,ipvlan,docknet,docknet-fc
$D bench rr --modes "$MODES" --repeat 2 --duration 1 --warmup 0.3 --report results "$@"
$D bench stream --modes "$MODES" --repeat 2 --duration 1 --warmup 0.3 --report results "$@"
$D raw bench --repeat 1 --duration 1 --warmup 0.3 --report results
echo "reports: results/tcp-rr.md results/tcp-stream.md results/raw-bench.md"
