# Sourced by the other scripts: where the cached venv and build live (outside the clone, so
# repeated runs and CI stay fast), and the variables tch's build needs.
# Override the location with SHARDRUN_CACHE.

SHARDRUN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARDRUN_CACHE="${SHARDRUN_CACHE:-$HOME/.cache/shardrun}"
SHARDRUN_VENV="$SHARDRUN_CACHE/venv"
SHARDRUN_PYTHON="$SHARDRUN_VENV/bin/python"
SHARDRUN_TORCH_VERSION="2.11.0"
# One build folder per clone: cargo judges a workspace crate up to date by file times, so a
# folder shared by two clones would hand one clone the binaries built from the other's files.
_shardrun_clone="$(basename "$SHARDRUN_ROOT")-$(printf '%s' "$SHARDRUN_ROOT" | sha256sum | cut -c1-12)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SHARDRUN_CACHE/targets/$_shardrun_clone}"
unset _shardrun_clone
# libtorch is the venv's torch package. Its folder names the Python version of the venv:
# ask the venv's python when it exists, else the python3 that scripts/setup.sh will use.
_shardrun_py="$SHARDRUN_PYTHON"
[[ -x "$_shardrun_py" ]] || _shardrun_py=python3
SHARDRUN_SITE_PACKAGES="$SHARDRUN_VENV/lib/$("$_shardrun_py" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/site-packages"
unset _shardrun_py
export LIBTORCH="$SHARDRUN_SITE_PACKAGES/torch"
# The release binaries (tests, demo and benchmarks all use the release profile).
SHARDRUN_BIN="$CARGO_TARGET_DIR/release"
export PATH="$SHARDRUN_BIN:$PATH"
