#!/usr/bin/env bash
# The test suite: set up .venv, then run the default (non-slow) tests. Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -m slow` for the slow tier.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- -m "not slow"; fi
exec python -m pytest "$@"
