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

# The tests start the project's Slurm clusters themselves (idempotent); stop them at the end
# so no daemon outlives the run: the default one and the two-node one (tests/src/lib.rs; its
# namespaces, veth pair and /etc/hosts lines go with it).
trap '"$SHARDRUN_ROOT/slurm/stop.sh" >/dev/null 2>&1 || true
      SHARDRUN_SLURM_DIR=/tmp/shardrun-slurm-2n SHARDRUN_SLURM_PORT=6850 \
          "$SHARDRUN_ROOT/slurm/stop.sh" >/dev/null 2>&1 || true' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "code and docs speak of the product (scripts/check-wording.sh)"
"$SHARDRUN_ROOT/scripts/check-wording.sh"

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
