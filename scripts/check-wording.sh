#!/usr/bin/env bash
# Code and docs name things by what they are. They must not point at material outside this
# repository (planning documents, a tracker's item numbers, notes kept elsewhere), which a
# reader of the repository cannot follow.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pattern='[Ss]eed[ -]?0[0-9][0-9]|\b[Ii]ssue [0-9]+\b|PLATFORM\.md|\.\./shared/|issues stops'
if git grep --untracked -nE "$pattern" -- ':!scripts/check-wording.sh'; then
    echo "error: the lines above refer to material outside the repository; say what the thing is instead" >&2
    exit 1
fi
echo "wording: no references to material outside the repository"
