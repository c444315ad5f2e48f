#!/usr/bin/env bash
# Sets up everything shardrun needs on a fresh Debian 12 machine (idempotent, cached):
#   1. Debian packages: Slurm + munge (for the local test cluster), build tools;
#   2. a Python venv with torch==2.11.0 from PyPI (libtorch for tch, PyTorch for references);
#   3. a release build of `shardrun` and `shardrun-worker` (rpath to the venv's libtorch).
# Usage: scripts/setup.sh [--no-slurm]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

want_slurm=1
[[ "${1:-}" == "--no-slurm" ]] && want_slurm=0

step() { printf '\n==> %s\n' "$*"; }

# -- 1. Debian packages -------------------------------------------------------------------
packages=(build-essential pkg-config fonts-dejavu-core)
(( want_slurm )) && packages+=(slurm-wlm munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  step "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# -- 2. Python venv with torch ------------------------------------------------------------
stamp="$SHARDRUN_VENV/.shardrun-torch-$SHARDRUN_TORCH_VERSION"
if [[ ! -f "$stamp" ]]; then
  step "creating $SHARDRUN_VENV with torch==$SHARDRUN_TORCH_VERSION (about 5 GB, once)"
  mkdir -p "$SHARDRUN_CACHE"
  python3 -m venv "$SHARDRUN_VENV" || {
    echo "error: python3 -m venv failed: install Python 3 with venv (apt-get install python3-venv)" >&2
    exit 1
  }
  "$SHARDRUN_PYTHON" -m pip install -q --upgrade pip
  "$SHARDRUN_PYTHON" -m pip install -q "torch==$SHARDRUN_TORCH_VERSION"
  touch "$stamp"
fi
# The Python side of the cross-checks: transformers (reference Llama models, chat templates),
# tokenizers (reference token ids), safetensors and numpy. Pinned; the stamp names the list,
# so changing it installs again.
python_packages=(numpy==2.4.6 safetensors==0.8.0 transformers==5.23.0 tokenizers==0.23.3)
packages_stamp="$SHARDRUN_VENV/.shardrun-packages-$(printf '%s\n' "${python_packages[@]}" | sha256sum | cut -c1-12)"
if [[ ! -f "$packages_stamp" ]]; then
  step "installing ${python_packages[*]} into $SHARDRUN_VENV"
  "$SHARDRUN_PYTHON" -m pip install -q "${python_packages[@]}"
  rm -f "$SHARDRUN_VENV"/.shardrun-packages-*
  touch "$packages_stamp"
fi
# The venv may have been made just now: name its site-packages again.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# -- 3. Build ------------------------------------------------------------------------------
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found. Install Rust (https://rustup.rs) and run this again." >&2
  exit 1
fi
step "building shardrun and shardrun-worker (release; first build takes a few minutes)"
(cd "$SHARDRUN_ROOT" && cargo build --release --workspace --bins)
echo
echo "ready: $SHARDRUN_BIN/shardrun and $SHARDRUN_BIN/shardrun-worker"
