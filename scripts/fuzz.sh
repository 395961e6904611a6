#!/usr/bin/env bash
# Fuzzes DockNet's defences with AFL++ (cargo-afl, stable toolchain): every target of fuzz/
# (or the ones named) for SECONDS each, starting from the committed corpus in fuzz/corpus.
# Prints each target's executions and findings; exits 1 if any target crashed or hung, with
# the inputs in fuzz/out/TARGET/default/{crashes,hangs}. Installs cargo-afl if missing.
#
#   ./scripts/fuzz.sh [--seconds N] [--execs N] [TARGET...]
#   ./scripts/fuzz.sh --seconds 600             the longer campaign (docs/fuzzing.md)
#
# Targets: header ring switch master control channel delivery wire segment dns (see fuzz/src/lib.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
SECONDS_EACH=10
EXECS=""
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --execs) EXECS=$2; shift 2 ;;
    *) TARGETS+=("$1"); shift ;;
    esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(header ring switch master control channel delivery wire segment dns)
if ! command -v cargo-afl >/dev/null 2>&1; then
    echo "fuzz: installing cargo-afl (builds AFL++ with the C compiler)" >&2
    cargo install cargo-afl --version 0.18.2 --locked
fi
cargo afl config --build >/dev/null 2>&1 || true
cd fuzz
export CARGO_TARGET_DIR=target/afl
cargo afl build --release --features afl --bins --locked
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1
failed=0
printf '%-10s %12s %10s %8s %6s %6s\n' TARGET EXECS EXECS/S PATHS CRASH HANG
for t in "${TARGETS[@]}"; do
    out=out/$t
    rm -rf "$out"
    mkdir -p out
    limit=(-V "$SECONDS_EACH")
    [ -z "$EXECS" ] || limit+=(-E "$EXECS")
    cargo afl fuzz -i "corpus/$t" -o "$out" "${limit[@]}" -c - "target/afl/release/fuzz_$t" \
        >"out-$t.log" 2>&1 || true
    stats=$out/default/fuzzer_stats
    if [ ! -f "$stats" ]; then
        echo "fuzz: $t did not start; see fuzz/out-$t.log" >&2
        failed=1
        continue
    fi
    get() { sed -n "s/^$1 *: *//p" "$stats"; }
    printf '%-10s %12s %10s %8s %6s %6s\n' "$t" "$(get execs_done)" "$(get execs_per_sec)" \
        "$(get corpus_count)" "$(get saved_crashes)" "$(get saved_hangs)"
    if [ "$(get saved_crashes)" != 0 ] || [ "$(get saved_hangs)" != 0 ]; then
        failed=1
    fi
    rm -f "out-$t.log"
done
exit $failed
