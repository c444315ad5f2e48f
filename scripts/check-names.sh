#!/usr/bin/env bash
# One name per concept. Two public types of the same name in the workspace, or a library
# module of the orchestrator named like one of its subcommand modules, make a reader (and
# `use` lines) guess which one is meant. Names that are meant to repeat are listed below with
# the reason.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
status=0

# Names allowed more than once, and why.
allowed=(
    Args   # clap's arguments of each subcommand, always used as `commands::<name>::Args`
    Result # each library crate's `Result<T>` alias over its own error type
)

crates=(models protocol checkpoint data orchestrator/src worker/src tests/src)
duplicates=$(git grep --untracked -hoE '^\s*pub (struct|enum|type|trait) [A-Z][A-Za-z0-9_]*' -- "${crates[@]/%//*.rs}" \
    | awk '{print $3}' | sort | uniq -d)
for name in $duplicates; do
    if printf '%s\n' "${allowed[@]}" | grep -qx "$name"; then
        continue
    fi
    echo "error: the public type name \`$name\` is defined more than once:" >&2
    git grep --untracked -nE "^\s*pub (struct|enum|type|trait) $name\b" -- "${crates[@]/%//*.rs}" >&2
    status=1
done

# Subcommands live in orchestrator/src/commands/<subcommand>.rs; the library modules they
# call are named for what they handle, never like a subcommand.
for command in orchestrator/src/commands/*.rs; do
    name=$(basename "$command" .rs)
    [ "$name" = mod ] && continue
    for library in "orchestrator/src/$name.rs" "orchestrator/src/$name"; do
        if [ -e "$library" ]; then
            echo "error: $library has the name of the subcommand module $command" >&2
            status=1
        fi
    done
done

if [ "$status" = 0 ]; then
    echo "names: every public type and orchestrator module has one meaning"
fi
exit "$status"
