#!/usr/bin/env bash
# The main job: sets up, then measures DockNet side by side with kernel TCP over a Linux bridge
# (both stacks measured by dnperf), and the raw DockPipe rings; prints the tables and writes
# results/tcp-rr.{md,json}, results/tcp-stream.{md,json} and results/raw-bench.{md,json}.
# About 5 minutes. Extra arguments go to both `docknet bench` runs (see `docknet bench rr --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
D=target/release/docknet
$D bench rr --repeat 2 --duration 1.5 --warmup 0.5 --report results "$@"
$D bench stream --repeat 2 --duration 1.5 --warmup 0.5 --report results "$@"
$D raw bench --repeat 1 --duration 1.5 --warmup 0.5 --report results
echo "reports: results/tcp-rr.md results/tcp-stream.md results/raw-bench.md"
