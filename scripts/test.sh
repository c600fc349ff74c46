#!/usr/bin/env bash
# The test suite: set up .venv, then run the default run: the unit, engine and system tiers
# (pytest.ini), slow tests left out, with the 25 slowest tests listed at the end. Extra arguments
# go to pytest: `bash scripts/test.sh -m unit` runs one tier (likewise engine, system; slow tests
# stay out unless the -m expression names slow), `bash scripts/test.sh -m slow` the slow tests,
# `bash scripts/test.sh tests/test_beam.py` one file.
# Test files run in parallel, one pytest-xdist worker per core up to 4 (MTAD_TEST_WORKERS sets
# the number; 0 runs everything in this process). A file's tests stay on one worker, in order,
# so a module's shared engines and servers are built once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
args=() marks=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    -m) marks="$2"; shift 2 ;;
    -m*) marks="${1#-m}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$marks" ]; then marks="not slow"
elif [[ "$marks" != *slow* ]]; then marks="($marks) and not slow"; fi
workers="${MTAD_TEST_WORKERS:-$(nproc)}"
[ "$workers" -gt 4 ] && workers=4
exec python -m pytest -n "$workers" --dist loadfile -m "$marks" --durations=25 "${args[@]}"
