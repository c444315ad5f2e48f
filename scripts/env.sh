# Sourced by the other scripts: where the cached venv and build live (outside the clone, so
# repeated runs and CI stay fast), and the variables tch's build needs.
# Override the location with SHARDRUN_CACHE.

SHARDRUN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARDRUN_CACHE="${SHARDRUN_CACHE:-$HOME/.cache/shardrun}"
SHARDRUN_VENV="$SHARDRUN_CACHE/venv"
SHARDRUN_PYTHON="$SHARDRUN_VENV/bin/python"
SHARDRUN_TORCH_VERSION="2.11.0"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SHARDRUN_CACHE/target}"
# libtorch is the venv's torch package (whatever python3 minor version made the venv).
SHARDRUN_SITE_PACKAGES="$(echo "$SHARDRUN_VENV"/lib/python3*/site-packages)"
export LIBTORCH="$SHARDRUN_SITE_PACKAGES/torch"
# The release binaries (tests, demo and benchmarks all use the release profile).
SHARDRUN_BIN="$CARGO_TARGET_DIR/release"
export PATH="$SHARDRUN_BIN:$PATH"
