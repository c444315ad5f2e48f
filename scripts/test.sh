#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every check and test: formatting, clippy
# with warnings as errors, unit tests, multi-process training tests, end-to-end tests
# against the project's own single-node Slurm (slurm/start.sh), Python cross-checks.
# Usage: scripts/test.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$SHARDRUN_ROOT"

"$SHARDRUN_ROOT/scripts/setup.sh"

step() { printf '\n==> %s\n' "$*"; }

# The tests start the project's Slurm clusters themselves (idempotent; the list is
# slurm/test-clusters.txt, read by tests/src/lib.rs too). However this script ends (success,
# failure, Ctrl-C), every one of them is stopped, and the run fails if any of their daemons
# is still alive afterwards.
stop_test_clusters() {
    local status=$?
    trap - EXIT
    step "stopping the test clusters"
    "$SHARDRUN_ROOT/slurm/test-clusters.sh" stop || true
    if ! "$SHARDRUN_ROOT/slurm/test-clusters.sh" check; then
        echo "scripts/test.sh: test clusters left daemons running (see above)" >&2
        [ "$status" != 0 ] || status=1
    fi
    exit "$status"
}
trap stop_test_clusters EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "cargo fmt --check"
cargo fmt --all -- --check

step "code and docs speak of the product (scripts/check-wording.sh)"
"$SHARDRUN_ROOT/scripts/check-wording.sh"

step "one name per concept (scripts/check-names.sh)"
"$SHARDRUN_ROOT/scripts/check-names.sh"

step "minimum Rust version (rust-version in Cargo.toml)"
"$SHARDRUN_ROOT/scripts/check-msrv.sh"

step "cargo clippy -D warnings (incompatible_msrv included)"
cargo clippy --release --workspace --all-targets -- -D warnings

step "cargo test (release)"
# The end-to-end tests drive the release binaries next to the test executables; build them
# first. Python cross-checks inside the tests use the venv's interpreter.
export SHARDRUN_PYTHON
cargo build --release --workspace --bins
cargo test --release --workspace -- --test-threads="${SHARDRUN_TEST_THREADS:-2}"
