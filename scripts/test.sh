#!/usr/bin/env bash
# All the checks: formatting, lints, docs, and every test (unit, property, and integration tests
# with real processes in real namespaces, which need root). Installs what is missing first.
# Runs as root; a normal user is re-run under sudo.
#
#   ./scripts/test.sh [--help]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"
# the report test loads index.html in headless Chromium
command -v chromium >/dev/null 2>&1 || export DOCKNET_EXTRA_PACKAGES=chromium
# each step's start, with the time since this script began (where a slow run spends it)
stage() { printf '== %s  [%dm%02ds]\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }
stage "setup: packages, the release build, the CNI plugins and Go programs"
./scripts/setup.sh
stage "cargo fmt --check"
cargo fmt --all --check
stage "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
stage "the vendored smoltcp: its own TCP socket and neighbour cache tests, with DockNet's patch and its tests"
CARGO_TARGET_DIR=target/smoltcp cargo test --manifest-path vendor/smoltcp/Cargo.toml --locked \
    --lib --features "std medium-ethernet proto-ipv4 proto-ipv6 socket-tcp socket-udp socket-icmp socket-tcp-cubic" \
    -- socket::tcp iface::neighbor iface::socket_set iface::interface::tests::ipv4::test_docknet
stage "cargo test"
# a hung test fails the run here, with the name libtest printed as running for over 60 s,
# instead of holding CI until its hard limit (the whole step takes about 8 minutes)
rc=0
DOCKNET_REQUIRE_ROOT_TESTS=1 timeout -k 30s "${DOCKNET_TEST_TIMEOUT:-30m}" \
    cargo test --workspace --locked || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "cargo test did not finish within ${DOCKNET_TEST_TIMEOUT:-30m}: a test hangs" \
        "(see 'has been running for over 60 seconds' above)" >&2
fi
[ "$rc" = 0 ] || exit "$rc"
stage "the CNI plugin and the node agent: gofmt, go vet, go test (unit tests; pods through containerd's CRI)"
GO=$(cat bin/.go)  # the toolchain setup.sh found or fetched
export PATH="$(dirname "$GO"):$PATH"
unformatted=$("$(dirname "$GO")"/gofmt -l cni)
[ -z "$unformatted" ] || { echo "gofmt: not formatted: $unformatted" >&2; exit 1; }
(cd cni && "$GO" vet ./... && "$GO" test -count=1 ./...)
./scripts/k8s-api.sh  # a real kube-apiserver and kine for the node agent's test (cached in bin/)
(cd cni/agent && "$GO" vet ./... && DOCKNET_REQUIRE_K8S_API=1 "$GO" test -count=1 ./...)
(cd cni/e2e && "$GO" vet ./... && DOCKNET_REQUIRE_CRI=1 "$GO" test -count=1 -v ./...)
stage "fuzz targets: format, lints, each target fuzzed for 5 s (AFL++), then the corpus replayed"
cargo fmt --manifest-path fuzz/Cargo.toml --check
(cd fuzz && cargo clippy --release --locked --bins --lib --tests -- -D warnings)
# fuzz.sh builds every target and the corpus's replayer in one build (AFL++'s instrumentation
# leaves a program that runs as any other outside afl-fuzz): the replay needs no build of its own
./scripts/fuzz.sh --seconds 5
fuzz/target/afl/release/replay
stage "all checks passed"
