#!/usr/bin/env bash
# Instructions per round trip of a TCP ping-pong over a fast channel (or through the daemon with
# `--path daemon`), counted by callgrind in the client (deterministic where timings on this VM
# are not: an A/B of a change to DockLib's hot path shows in this count even when its latency is
# lost in the noise).
#
#   scripts/instructions.sh [--size BYTES] [--seconds S] [--idle block|spin|adaptive]
#                           [--path fc|daemon] [--preload] [--json]
#
# A daemon in a run directory of its own, two pipes (joined by a fast channel), dnperf's server
# (native, core 1) and dnperf's client under `valgrind --tool=callgrind` (core 0). Prints the
# client's instructions per round trip: all of them inside the workload, and those in `write`,
# in `read` (with its wait) and per poll of the stack. `--idle block` (the default) makes a wait
# cost a futex sleep instead of polling rounds, so the count is the work per message (valgrind
# 3.19 does not know futex_waitv: DockLib then waits on one ring word at a time). Needs
# valgrind (`apt-get install valgrind`; scripts/setup.sh installs it) and root (containers).
# Builds nothing: run `cargo build --release -p docknet` first (or set DOCKNET_BIN).
# `--preload`: the client is dnperf on kernel sockets under the preload library (`docknet run
# --preload`; DOCKNET_IDLE carries `--idle`), and `write` and `read` are the library's `send`
# and `recv`.
set -euo pipefail

size=64 seconds=3 idle=block path=fc json=0 preload=0
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --json) json=1; shift ;;
    --preload) preload=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "instructions.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DOCKNET_BIN:-$root/target/release}  # where docknet and dnperf are (default: the release build)
exe=$bin/docknet
dnperf=$bin/dnperf
for t in valgrind callgrind_annotate; do
  command -v "$t" >/dev/null || { echo "instructions.sh: $t not found (apt-get install valgrind)" >&2; exit 1; }
done
[ -x "$exe" ] && [ -x "$dnperf" ] || { echo "instructions.sh: build first: cargo build --release -p docknet" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "instructions.sh: needs root (docknet run makes containers)" >&2; exit 1; }

tag=dnin$$
run=/dev/shm/docknet-$tag
out=$(mktemp -d)
sock=$run/ctl.sock
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$run"; [ -n "${KEEP:-}" ] || rm -rf "$out"; [ -z "${KEEP:-}" ] || echo "kept $out" >&2
}
trap cleanup EXIT INT TERM

# channels only by hand, so that `--path daemon` stays on the daemon's path
"$exe" --log warn daemon --run-dir "$run" --socket "$sock" --fast-channels manual >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "instructions.sh: the daemon did not start" >&2; exit 1; }
dn() { "$exe" --socket "$sock" "$@"; }
dn pipe create "${tag}s" --ip 10.97.0.2/24 >/dev/null
dn pipe create "${tag}c" --ip 10.97.0.3/24 >/dev/null
case "$path" in
  fc) dn fc connect "${tag}s" "${tag}c" >/dev/null ;;
  daemon) ;;
  *) echo "instructions.sh: --path is fc or daemon, not $path" >&2; exit 2 ;;
esac
"$exe" --socket "$sock" run --cpu 1 --pipe "${tag}s" -- "$dnperf" server --stack docknet \
  --idle "$idle" --bind 10.97.0.2:7000 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
# the container's /tmp is its own: the profile comes back on stderr, the report on stdout
if [ "$preload" = 1 ]; then
  # dnperf's kernel sockets under the library; its idle policy from the environment
  client_run=(run --preload) stack=kernel env="DOCKNET_IDLE=$idle"
else
  client_run=(run) stack="docknet --idle $idle" env=
fi
"$exe" --socket "$sock" "${client_run[@]}" --cpu 0 --pipe "${tag}c" -- sh -c "$env valgrind --tool=callgrind \
  --log-file=/dev/null --callgrind-out-file=/tmp/cg.out \
  --toggle-collect='docknet_perf::workload::client' \
  $dnperf client --stack $stack --connect 10.97.0.2:7000 --workload rr \
  --size $size --duration $seconds --warmup 0.5 --json > /tmp/report.json 2>/tmp/client.err && \
  cat /tmp/cg.out >&2 && cat /tmp/report.json" >"$out/report.json" 2>"$out/cg.out"

callgrind_annotate --inclusive=yes --tree=calling "$out/cg.out" >"$out/tree.txt" 2>/dev/null
# "*" lines carry a function's inclusive cost; "(Nx)" on a callee line its calls from a caller
cost() { awk -v f="$1" '/%\)  \*  / && index($0, f) { gsub(",", "", $1); if ($1 + 0 > m) m = $1 + 0 } END { print m + 0 }' "$out/tree.txt"; }
calls() { awk -v f="$1" '/%\)  >  / && index($0, f) { s = $0; sub(/.*\(/, "", s); sub(/x\).*/, "", s); gsub(",", "", s); n += s } END { print n + 0 }' "$out/tree.txt"; }
total=$(cost 'src/workload.rs:docknet_perf::workload::client')
writes=$(calls 'TcpStream as std::io::Write>::write')
write=$(cost ':<docknet_lib::tcp::TcpStream as std::io::Write>::write')
if [ "${writes:-0}" = 0 ]; then
  # the compiler inlined DockLib's `write` into `write_all` (dnperf's only caller): count that
  writes=$(calls 'std::io::Write::write_all')
  write=$(cost 'std::io::Write::write_all')
fi
read=$(cost ':<docknet_lib::tcp::TcpStream as std::io::Read>::read')
if [ "$preload" = 1 ]; then
  writes=$(calls 'docknet_preload::ops::send')
  write=$(cost ':docknet_preload::ops::send')
  read=$(cost ':docknet_preload::ops::recv')
fi
poll=$(cost ':docknet_lib::stack::Inner::poll')
polls=$(calls 'docknet_lib::stack::Inner::poll')
[ "${writes:-0}" -gt 0 ] || { echo "instructions.sh: no round trips counted" >&2; KEEP=1; exit 1; }
per() { echo $(( ${1:-0} / $2 )); }
if [ "$json" = 1 ]; then
  printf '{"size":%s,"idle":"%s","path":"%s","preload":%s,"round_trips":%s,"per_round_trip":{"all":%s,"write":%s,"read":%s},"polls_per_round_trip":%s,"per_poll":%s}\n' \
    "$size" "$idle" "$path" "$([ "$preload" = 1 ] && echo true || echo false)" "$writes" "$(per "$total" "$writes")" "$(per "$write" "$writes")" \
    "$(per "$read" "$writes")" "$(awk -v p="$polls" -v w="$writes" 'BEGIN{printf "%.2f", p/w}')" \
    "$(per "$poll" "${polls:-1}")"
else
  via=$([ "$path" = fc ] && echo "over a fast channel" || echo "through the daemon")
  [ "$preload" = 1 ] && via="$via, under the preload library"
  echo "client instructions per round trip, $size B $via, idle $idle ($writes round trips under callgrind):"
  echo "  all (inside the workload): $(per "$total" "$writes")"
  echo "  write:                     $(per "$write" "$writes")"
  echo "  read (with its wait):      $(per "$read" "$writes")"
  echo "  polls of the stack:        $(awk -v p="$polls" -v w="$writes" 'BEGIN{printf "%.2f", p/w}') per round trip, $(per "$poll" "${polls:-1}") instructions each"
fi
