#!/usr/bin/env bash
# All the checks: formatting, lints, docs, and every test (unit, property, and integration tests
# with real processes in real namespaces, which need root).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
echo "== cargo test"
DOCKNET_REQUIRE_ROOT_TESTS=1 cargo test --workspace --locked
