# Sourced by setup.sh, bench.sh, test.sh and the measurement scripts.
#
# docknet_root "$@": carries on as root; a normal user is re-run under sudo (keeping PATH and the
# Rust toolchain's homes, so a rustup install in ~/.cargo still works), and what the run creates
# in the checkout (target/, results/) is handed back to that user at the end. Without sudo it
# says what to do and exits 1.
docknet_root() {
    if [ "$(id -u)" -eq 0 ]; then
        if [ -n "${DOCKNET_OWNER:-}" ]; then
            trap 'chown -R "$DOCKNET_OWNER" target "${OUT:-results}" 2>/dev/null || true' EXIT
        fi
        return 0
    fi
    local me v keep=()
    me=$(basename "$0")
    # the scripts' own settings (each script's --help says which it reads), kept where given
    for v in SECONDS_PER_RUN SECONDS_MEASURED REPEAT QUICK KEEP DOCKNET_BIN WIRE_RATE UNPINNED \
        SETTLE RESTART_T KILL_T RATES MODES DAEMON_IDLE BIN DOCKNET_TEST_TIMEOUT \
        DOCKNET_EXTRA_PACKAGES GOFLAGS; do
        if [ -n "${!v:-}" ]; then
            keep+=("$v=${!v}")
        fi
    done
    if command -v sudo >/dev/null 2>&1; then
        echo "$me: needs root (network namespaces, mounts, apt-get): re-running under sudo" >&2
        exec sudo env "PATH=$PATH" \
            "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" \
            "DOCKNET_OWNER=$(id -u):$(id -g)" "FULL=${FULL:-0}" "OUT=${OUT:-results}" \
            "${keep[@]}" "$0" "$@"
    fi
    echo "$me: needs root (network namespaces, mounts, apt-get): run it as root, or install sudo and run it again" >&2
    exit 1
}

# docknet_bin: sets B to where docknet and dnperf are: $DOCKNET_BIN as given, or else this
# checkout's release build, made (with what it needs installed) by setup.sh first.
docknet_bin() {
    if [ -n "${DOCKNET_BIN:-}" ]; then
        B=$DOCKNET_BIN
    else
        ./scripts/setup.sh >/dev/null
        B=$PWD/target/release
    fi
}

# docknet_usage "$@": prints the script's header comment and exits 0 when asked for --help.
docknet_usage() {
    case "${1:-}" in
    -h | --help)
        sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
        exit 0
        ;;
    esac
}

# The pids of every process below $1 (children first, then theirs), read from /proc: a script's
# background jobs are subshells whose own children outlive a kill of the subshell.
descendants() {
    local c
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}

# Ends every process this script started: SIGTERM to all of them, then SIGKILL to what is left
# after GRACE seconds (default 2). Only descendants of this shell, by pid; KEEP (a pid) and its
# own descendants are left alone.
end_descendants() {
    local pids p grace=${1:-2} keep=${2:-}
    pids=$(descendants $$)
    if [ -n "$keep" ]; then
        local skip
        skip=" $keep $(descendants "$keep" | tr '\n' ' ')"
        pids=$(for p in $pids; do case "$skip " in *" $p "*) ;; *) echo "$p" ;; esac; done)
    fi
    [ -n "$pids" ] || return 0
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq $((grace * 10))); do
        local alive=0
        for p in $pids; do [ -d /proc/"$p" ] && alive=1; done
        [ $alive = 1 ] || return 0
        sleep 0.1
    done
    for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
}
