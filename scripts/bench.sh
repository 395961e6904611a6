#!/usr/bin/env bash
# The main job: sets up, then measures DockNet (fast channel and through the daemon) side by side
# with kernel TCP over a Linux bridge, prints the table and writes results/raw-bench.{md,json}.
# Extra arguments go to `docknet raw bench` (see `docknet raw bench --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec target/release/docknet raw bench --repeat 3 --duration 2 --warmup 0.5 --report results "$@"
