#!/usr/bin/env bash
# The workspace's `rust-version` is the true minimum Rust: every member inherits it, clippy's
# `incompatible_msrv` lint (run with -D warnings by scripts/test.sh) refuses standard-library
# APIs newer than it, and this script refuses dependencies that need a newer Rust than it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
version = lambda v: tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])
members = set(meta["workspace_members"])
declared = {p["rust_version"] for p in meta["packages"] if p["id"] in members}
if None in declared or len(declared) != 1:
    sys.exit(f"error: every workspace member must inherit rust-version from the workspace; found {sorted(map(str, declared))}")
msrv = declared.pop()
newer = sorted((p["name"], p["rust_version"]) for p in meta["packages"]
               if p["rust_version"] and version(p["rust_version"]) > version(msrv))
if newer:
    sys.exit(f"error: rust-version is {msrv} but these dependencies need more: {newer}; raise rust-version in Cargo.toml")
print(f"rust-version {msrv}: every member inherits it, no dependency needs more")
'
